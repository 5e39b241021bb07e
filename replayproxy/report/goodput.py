"""SLO specs and goodput: requests/s that meet every per-request SLO, and run-level percentile SLOs.

Spec syntax: comma-separated clauses `METRIC<=LIMIT UNIT` (per request) or `METRIC:pNN<=LIMIT UNIT`
(on the run's distribution), e.g. `ttft<=500ms,tpot<=50ms,e2e<=20s,ttft:p95<=800ms`.
Metrics: ttft, tpot, itl, e2e; units: us, ms, s. Per request, `itl` is the request's worst gap.
`makespan` is a per-session metric (an agent's time to finish its task: first request's send to
last request's end): with a `makespan<=60s` clause, goodput counts sessions, and a session is good
when its makespan is within the limit and every request of it is good. A request outside any
session is a session of its own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.report.measures import NS_PER_MS, Measures
from replayproxy.report.sessions import makespans_ns, session_groups

REQUEST_METRICS = ("ttft", "tpot", "itl", "e2e")
SESSION_METRICS = ("makespan",)
METRICS = (*REQUEST_METRICS, *SESSION_METRICS)
UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
_CLAUSE = re.compile(
    r"^(?P<metric>[a-z0-9_]+)(?::p(?P<pct>\d+(?:\.\d+)?))?<=(?P<value>[0-9]*\.?[0-9]+)(?P<unit>[a-z]*)$"
)


class SloError(BadOption):
    """An SLO spec that cannot be parsed; the message names the clause and what is wrong."""


@dataclass(frozen=True, slots=True)
class Slo:
    metric: str
    limit_ms: float
    percentile: float | None = None  # None: every request (session, for makespan) must meet it

    @property
    def per_session(self) -> bool:
        return self.metric in SESSION_METRICS

    @property
    def text(self) -> str:
        where = f":p{self.percentile:g}" if self.percentile is not None else ""
        return f"{self.metric}{where}<={self.limit_ms:g}ms"


def parse_slo(spec: str) -> tuple[Slo, ...]:
    """Parse `ttft<=500ms,tpot:p95<=50ms`; raises SloError with a one-line reason."""
    clauses = [c.strip() for c in spec.split(",")]
    if not spec.strip() or any(not c for c in clauses):
        raise SloError(f"empty SLO clause in {spec!r}; expected e.g. 'ttft<=500ms,tpot<=50ms'")
    slos = []
    for clause in clauses:
        text = clause.replace(" ", "").lower()
        match = _CLAUSE.match(text)
        if match is None:
            raise SloError(_why(clause, text))
        metric, unit = match["metric"], match["unit"]
        if metric not in METRICS:
            raise SloError(f"unknown SLO metric {metric!r} in {clause!r}; valid: {', '.join(METRICS)}")
        if unit not in UNITS_MS:
            what = f"unknown unit {unit!r}" if unit else "missing unit"
            raise SloError(f"{what} in SLO clause {clause!r}; use us, ms or s")
        percentile = float(match["pct"]) if match["pct"] is not None else None
        if percentile is not None and not 0 < percentile <= 100:
            raise SloError(f"percentile must be within (0, 100] in {clause!r}")
        slos.append(Slo(metric, float(match["value"]) * UNITS_MS[unit], percentile))
    return tuple(slos)


def _why(clause: str, text: str) -> str:
    if "<=" not in text:
        return f"SLO clause {clause!r} needs '<=' (e.g. 'ttft<=500ms')"
    name = text.split("<=")[0]
    if ":" in name and not re.fullmatch(r"[a-z0-9_]+:p\d+(\.\d+)?", name):
        return f"bad percentile in SLO clause {clause!r}; write e.g. 'ttft:p95<=800ms'"
    return f"bad limit in SLO clause {clause!r}; write a number and a unit (us, ms, s), e.g. '500ms'"


@dataclass(frozen=True, slots=True)
class PercentileCheck:
    slo: Slo
    value_ms: float
    count: int

    @property
    def met(self) -> bool:
        return bool(self.count > 0 and self.value_ms <= self.slo.limit_ms)


@dataclass(frozen=True, slots=True)
class SessionGoodput:
    """Sessions whose makespan meets every per-session clause and whose requests are all good."""

    good: int
    total: int
    sessions_per_s: float

    @property
    def fraction(self) -> float:
        return self.good / self.total if self.total else math.nan


@dataclass(frozen=True, slots=True)
class Goodput:
    good: int  # requests meeting every per-request SLO
    total: int  # all requests, errors included
    requests_per_s: float
    checks: tuple[PercentileCheck, ...]
    slos: tuple[Slo, ...]
    not_applicable: int = 0  # successful requests with no TPOT/ITL to judge (whole-body or one-token)
    sessions: SessionGoodput | None = None  # with a per-session clause: what the verdict decides by

    @property
    def per_request(self) -> bool:
        """Whether any SLO applies to each request (else only run-level percentiles were given)."""
        return any(s.percentile is None for s in self.slos)

    @property
    def fraction(self) -> float:
        return self.good / self.total if self.total else math.nan

    @property
    def percentiles_met(self) -> bool:
        return all(c.met for c in self.checks)


def request_values(m: Measures, metric: str) -> np.ndarray:
    """The per-request value of a metric in ms (NaN when not measured); itl is the worst gap."""
    if metric == "itl":
        worst = np.full(m.n, np.nan)
        if len(m.itl_ms):
            order = np.lexsort((m.itl_ms, m.itl_owner))
            owners = m.itl_owner[order]
            last = np.r_[owners[1:] != owners[:-1], True]
            worst[owners[last]] = m.itl_ms[order][last]
        return worst
    return {"ttft": m.ttft_ms, "tpot": m.tpot_ms, "e2e": m.e2e_ms}[metric]


def session_makespans(m: Measures) -> tuple[np.ndarray, np.ndarray]:
    """Each request's session number and each session's makespan in ms."""
    req = m.requests
    session = req.session if len(req.session) == m.n else np.zeros(m.n, np.uint64)
    group, count = session_groups(session)
    return group, makespans_ns(group, count, req.sent_ns, req.e2e_ns) / NS_PER_MS


def pooled_values(m: Measures, metric: str) -> np.ndarray:
    """The run's distribution of a metric: itl pools every gap, makespan is one value per session,
    the others one value per request."""
    if metric == "makespan":
        return session_makespans(m)[1]
    return m.itl_ms if metric == "itl" else request_values(m, metric)


def goodput(m: Measures, slos: tuple[Slo, ...]) -> Goodput:
    """A request is good when it succeeded and each per-request SLO holds for it.

    A metric a successful request has no value for counts as met when it cannot exist for it
    (TPOT and ITL of a one-token or a whole-body reply: their count is `not_applicable`) and as
    missed otherwise (e.g. no TTFT measured).
    """
    good = m.ok.copy()
    no_decode = (m.output_tokens < 2) | ~m.requests.stream.astype(bool)
    for slo in slos:
        if slo.percentile is not None or slo.per_session:
            continue
        values = request_values(m, slo.metric)
        absent_ok = no_decode if slo.metric in ("tpot", "itl") else np.zeros(m.n, bool)
        with np.errstate(invalid="ignore"):
            good &= np.where(np.isnan(values), absent_ok, values <= slo.limit_ms)
    checks = []
    for slo in slos:
        if slo.percentile is None:
            continue
        values = pooled_values(m, slo.metric)
        values = values[np.isfinite(values)]
        value = float(np.percentile(values, slo.percentile)) if len(values) else math.nan
        checks.append(PercentileCheck(slo, value, len(values)))
    count = int(good.sum())
    rate = count / m.duration_s if m.duration_s > 0 else math.nan
    sessions = _session_goodput(m, good, slos) if any(s.per_session for s in slos) else None
    return Goodput(count, m.n, rate, tuple(checks), slos, int((m.ok & no_decode).sum()), sessions)


def _session_goodput(m: Measures, good: np.ndarray, slos: tuple[Slo, ...]) -> SessionGoodput:
    """A session is good when every request of it is good and each per-session clause holds."""
    group, makespan_ms = session_makespans(m)
    all_good = np.ones(len(makespan_ms), bool)
    np.logical_and.at(all_good, group, good)
    for slo in slos:
        if slo.per_session and slo.percentile is None:
            all_good &= makespan_ms <= slo.limit_ms
    count = int(all_good.sum())
    rate = count / m.duration_s if m.duration_s > 0 else math.nan
    return SessionGoodput(count, len(makespan_ms), rate)
