"""The preparer: one process that plans the whole replay once and deals wire bytes to each sender.

Planning walks every request in arrival order (a request's prompt copies its prefix donor's,
whichever sender sends the donor), so it is done once, here, not once per sender. The process is
started before the target is described and loads the trace meanwhile (a remote trace from the local
copies its parent downloaded: one download serves both); each run (a warm-up, a
measured run) is then one `Job`: the schedule, which sender sends each request, and one pipe per
sender (passed over the control socket), into which it writes that sender's requests as batches of
wire bytes (replay.feed). Pipes whose senders stop reading (their windows are full) make the
preparer wait, once every sender has what was planned for it; a sender that is gone ends the job. It
runs in its own interpreter, so it never holds a sender's GIL, on another core where it may, else at
a lower priority, so the sender still wakes on time.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection as Pipe

import numpy as np

from replayproxy import trace
from replayproxy.errors import UserError
from replayproxy.replay import feed, flavors
from replayproxy.replay.connection import Target
from replayproxy.replay.plan import Planner, PlanOptions
from replayproxy.replay.prepared import Prepared, Schedule
from replayproxy.trace import storage

PIPE_BYTES = 1 << 20  # asked of the kernel for each sender's pipe (Linux; the default is 64 KiB)
PREPARER_NICE = 10  # on the sender's only core, the sender wins the CPU whenever it wakes for a send
NOBODY = -1  # a request only planned (a prefix donor of what is sent), not sent by this job


@dataclass(frozen=True, slots=True)
class Job:
    """One run's requests: every planned request's schedule, and which sender sends each."""

    schedule: Schedule  # every planned request, in planning (arrival) order
    senders: np.ndarray  # int32 per position: the sender (0..count-1), or NOBODY
    count: int  # senders, each with a pipe (they follow the job on the control socket)
    flavor: flavors.Flavor
    options: PlanOptions
    target: str
    headers: dict[str, str]


class Preparer:
    """The parent's handle on the preparer process: started early, given one job per run."""

    def __init__(self, traces: Sequence[str | storage.Spilled]) -> None:
        """`traces`: names as `trace.load` takes them, or local copies of remote objects (read
        from there, not downloaded again)."""
        self._context = multiprocessing.get_context("spawn")
        self._control, child = self._context.Pipe(duplex=True)  # a socket: it carries pipes too
        self._process = self._context.Process(
            target=_main, args=(tuple(traces), child), name="replay-preparer", daemon=True
        )
        self._process.start()
        child.close()

    def deal(
        self,
        schedule: Schedule,
        shares: Sequence[np.ndarray],
        flavor: flavors.Flavor,
        options: PlanOptions,
        target: str,
        headers: Mapping[str, str],
    ) -> list[Pipe]:
        """Start preparing `shares` (positions into `schedule`, one array per sender); returns each
        sender's reading end (to pass to a worker process or read here)."""
        senders = np.full(len(schedule.trace_index), NOBODY, np.int32)
        for sender, positions in enumerate(shares):
            senders[positions] = sender
        pipes = [self._context.Pipe(duplex=False) for _ in shares]
        job = Job(schedule, senders, len(shares), flavor, options, target, dict(headers))
        try:
            self._control.send(job)
            for _, writing in pipes:
                with contextlib.suppress(OSError):  # a bigger pipe where the kernel allows it
                    fcntl.fcntl(writing.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
                reduction.send_handle(self._control, writing.fileno(), self._process.pid)
        except OSError:
            pass  # the preparer is gone: each sender finds its pipe ended, and says so
        finally:
            for _, writing in pipes:
                writing.close()
        return [reading for reading, _ in pipes]

    def close(self) -> None:
        self._control.close()  # the preparer ends when it sees the control socket close
        self._process.join(1)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5)


def _main(traces: tuple[str | storage.Spilled, ...], control: Pipe) -> None:
    """Entry point of the preparer process: load the trace, then serve jobs until the parent closes.
    Ctrl-C is the senders' to handle: when they stop reading, the job ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1:
        with contextlib.suppress(OSError):  # pinned to the sender's only core: let the sender win it
            os.nice(PREPARER_NICE)
    try:
        cols = trace.load(traces)
    except UserError:
        return  # the parent reads the same files before it deals a job, and says why in one line
    while True:
        try:
            job: Job = control.recv()
            pipes = [Pipe(reduction.recv_handle(control), readable=False) for _ in range(job.count)]
        except (EOFError, OSError):
            return  # the parent is done (or gone)
        try:
            serve(cols, job, pipes)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a sender stopped (interrupted or failed): the run is over
        finally:
            for pipe in pipes:
                pipe.close()


def serve(cols: trace.Columns, job: Job, pipes: Sequence[Pipe]) -> None:
    """Plan every request up to the last one sent, writing each sender's requests into its pipe
    in batches (feed.BATCH_BYTES / BATCH_REQUESTS), then an empty frame once it has them all.
    When the pipes take no more, every sender is first handed what was planned for it, then the
    planning waits for one to read (feed.FeedWriter). In closed loop, a request the planner links to
    a turn another sender sends (an edited-reply continuation) moves to that sender, the only one
    that sees that turn end: so each sender's last frame waits for the end of the plan."""
    planner = Planner(cols, job.schedule.trace_index, job.flavor, job.options, job.schedule)
    target = Target.parse(job.target)
    senders = job.senders
    sent = np.flatnonzero(senders != NOBODY)
    last = np.full(job.count, -1, np.int64)
    np.maximum.at(last, senders[sent], sent)
    moving = job.options.closed_loop and job.count > 1
    writer = feed.FeedWriter(pipes)
    for sender in np.flatnonzero(last < 0).tolist():
        writer.put(sender, b"")  # nothing to send
    batches: list[list[feed.Entry]] = [[] for _ in pipes]
    sizes = [0] * job.count

    def hand_over(sender: int) -> None:
        writer.put(sender, feed.encode(batches[sender]))
        batches[sender], sizes[sender] = [], 0

    def add(sender: int, entry: feed.Entry) -> None:
        batches[sender].append(entry)
        sizes[sender] += len(entry[1])

    for position in range(int(sent[-1]) + 1 if len(sent) else 0):
        sender = int(senders[position])
        prepared = planner.next(render=sender != NOBODY)
        if prepared is None:
            continue
        wire = feed.wire_of(target, job.headers, prepared)
        home = _home(job, prepared, position) if moving else sender
        if home == sender:
            add(sender, (prepared, wire, feed.OWN))
        else:
            add(sender, (prepared, b"", feed.MOVED))
            add(home, (prepared, wire, feed.JOINED))
            hand_over(home)  # at once: it is due as soon as that turn has ended
        batch = batches[sender]
        done = position == last[sender]
        if done or sizes[sender] >= feed.BATCH_BYTES or len(batch) >= feed.BATCH_REQUESTS:
            hand_over(sender)
        if done and not moving:
            writer.put(sender, b"")
        if writer.full:
            for other, waiting in enumerate(batches):
                if waiting:
                    hand_over(other)
            writer.wait()
    if moving:
        for sender in np.flatnonzero(last >= 0).tolist():
            if batches[sender]:
                hand_over(sender)
            writer.put(sender, b"")
    writer.wait(until_empty=True)


def _home(job: Job, prepared: Prepared, position: int) -> int:
    """The sender that sends `prepared`: the one that sends the turn the planner linked it to, when
    that differs from the schedule's link and another sender sends it; else the one dealt it."""
    dealt = int(job.senders[position])
    after = prepared.after
    if after < 0 or after == int(job.schedule.after[position]):
        return dealt
    rows = job.schedule.trace_index
    at = int(np.searchsorted(rows, after))  # rows are trace rows in arrival order: ascending
    if at >= len(rows) or int(rows[at]) != after or int(job.senders[at]) == NOBODY:
        return dealt  # a turn only planned (another shard's): the link cannot be honoured
    return int(job.senders[at])
