"""Recording: request shapes of copies of the exchanges, written to rotating trace files.

Two processes' code: `recorder` runs in the forwarding process (a bounded queue and a pipe, never
waited on); `child` is the recorder process (`python -m replayproxy.proxy.recording.child`), which
builds shapes and writes traces (`core`), uploads rotated files (`upload`) and reports its counts
back (`tally`). `wire` is the pipe's message format between the two.
"""
