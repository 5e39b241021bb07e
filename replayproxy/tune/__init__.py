"""`replayproxy tune`: each candidate engine at its best operating point on the trace, then best vs best.

Glue, like the sweep package: it starts engine processes from a candidates file, measures each
configuration with the sweep's rate search (replay subprocesses, result files on disk) and hands the
results to the report. Nothing imports this package.
"""
