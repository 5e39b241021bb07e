"""`replayproxy replay` settings: the options dataclass the CLI, the config file and the sweep fill in."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from replayproxy.config import check_finite
from replayproxy.errors import BadOption
from replayproxy.replay import replies, schedule, turns
from replayproxy.replay.connection import Target
from replayproxy.replay.progress import MODES, ProgressMode

PrepareMode = Literal["stream", "upfront"]
PREPARE_MODES: tuple[PrepareMode, ...] = get_args(PrepareMode)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """`replayproxy replay` settings ([replay] in the config file, REPLAYPROXY_REPLAY_* variables)."""

    target: str = ""
    output: str = ""
    traces: tuple[str, ...] = ()
    speed: float = 1.0
    request_rate: float = 0.0  # req/s on average: sets the speed from the replayed window; 0 off
    max_concurrency: int = 0  # 0: open loop, no cap
    flavor: str = "auto"
    model: str = ""
    model_map: dict[str, str] = field(default_factory=dict)
    limit: int | None = None
    start_offset: float = 0.0  # seconds into the trace
    duration: float | None = None  # seconds of trace to replay
    seed: int = 0
    timeout: float = 600.0  # per request, seconds
    label: str = ""
    quiet: bool = False  # no progress display at all (as progress = "none")
    progress: ProgressMode = "auto"  # auto | tty (live panel) | log (a line every 10 s) | none
    workers: int = 1
    shard: str = ""  # "i/N": only requests with index % N == i
    start_at: str = ""  # UTC ISO time or unix seconds: a start shared by several replayers
    reset_prefix_cache: bool = True
    calibrate: bool = True
    tokenizer: str = ""  # local tokenizer.json (or its directory) for exact prompts; "" = the engine's
    chat_template: str = ""  # Jinja chat template file for the local tokenizer ("" = its own)
    allow_approximate: bool = False  # go on with calibrated prompts when exact ones cannot be built
    include_failed: bool = False  # replay requests that failed when recorded (left out by default)
    max_error_rate: float = 0.5  # above this share of failed requests the run exits 1
    api_key: str = ""  # sent as a bearer token; never recorded
    pool_size: int = 0  # connections opened before the run; 0: the trace's peak concurrency
    scrape_metrics: str = ""  # Prometheus URL polled during the run ("/metrics": the target's); "" off
    scrape_interval: float = 0.25  # seconds
    gpu_sampler: str = ""  # command whose CSV lines are stored with their arrival times
    warmup: str = ""  # "N" requests or "Ss" seconds of the trace sent first, not measured
    repeat: int = 1  # measured runs, each after the flavor's cache reset
    engine_args: str = ""  # how the engine was started, as the user tells it (the contract)
    note: str = ""  # free text kept with the run
    sessions: turns.SessionsOption = (
        "auto"  # turns.MODES: closed loop within sessions, open loop, or closed if multi-turn
    )
    sample_sessions: float | None = None  # keep this fraction of whole sessions (seeded)
    replies: replies.ReplyMode = (
        "live"  # replies.MODES: a later turn carries the candidate's reply, or the planned one
    )
    prepare: PrepareMode = (
        "stream"  # stream: bodies prepared ahead of the clock in a window; upfront: all first
    )
    prepare_window: float = 20.0  # seconds of schedule whose bodies are held ready ahead of the clock
    prepare_memory: int = 512  # MiB the ready bodies may take (per sender process)
    via_proxy: str = (
        ""  # directory: send through a proxy started in front of the target, its trace of each run there
    )

    def __post_init__(self) -> None:
        check_finite(self)
        if self.speed <= 0:
            raise BadOption(f"speed must be > 0, got {self.speed}")
        if self.request_rate < 0:
            raise BadOption(f"request rate must be > 0, got {self.request_rate}")
        if not 0 <= self.max_error_rate <= 1:
            raise BadOption(f"max error rate must be between 0 and 1, got {self.max_error_rate}")
        if self.workers < 1 or self.max_concurrency < 0 or self.timeout <= 0:
            raise BadOption("workers must be >= 1, max_concurrency >= 0 and timeout > 0")
        if self.limit is not None and self.limit < 0:
            raise BadOption(f"limit must be >= 0, got {self.limit}")
        if self.shard:
            schedule.parse_shard(self.shard)
        if self.progress not in MODES:
            raise BadOption(f"progress must be one of {', '.join(MODES)}, got {self.progress!r}")
        if self.scrape_interval <= 0:
            raise BadOption(f"scrape interval must be > 0, got {self.scrape_interval}")
        if self.repeat < 1:
            raise BadOption(f"repeat must be >= 1, got {self.repeat}")
        if self.sessions not in turns.MODES:
            raise BadOption(f"sessions must be one of {', '.join(turns.MODES)}, got {self.sessions!r}")
        if self.replies not in replies.MODES:
            raise BadOption(f"replies must be one of {', '.join(replies.MODES)}, got {self.replies!r}")
        if self.sample_sessions is not None and not 0 < self.sample_sessions <= 1:
            raise BadOption(f"sample-sessions must be in (0, 1], got {self.sample_sessions}")
        if self.prepare not in PREPARE_MODES:
            raise BadOption(f"prepare must be one of {', '.join(PREPARE_MODES)}, got {self.prepare!r}")
        if self.prepare_window <= 0 or self.prepare_memory < 1:
            raise BadOption("prepare window must be > 0 seconds and prepare memory >= 1 MiB")

    def recorded(self) -> dict[str, Any]:
        """The options as stored in the result header: everything but secrets."""
        values = asdict(self)
        values.pop("api_key")
        values["traces"] = list(self.traces)
        return values

    @property
    def metrics_url(self) -> str:
        if self.scrape_metrics.startswith("/"):
            return Target.parse(self.target).url + self.scrape_metrics
        return self.scrape_metrics

    @property
    def cache_metrics_url(self) -> str:
        """Where the engine's prefix-cache counters are read before and after the run."""
        return self.metrics_url or Target.parse(self.target).url + "/metrics"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def parse_start_at(text: str) -> int:
    """`--start-at` as UTC nanoseconds: unix seconds, or an ISO time (naive means UTC)."""
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise BadOption(f"--start-at must be unix seconds or an ISO 8601 time, got {text!r}") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)
