"""Trace files (.rpt): the contract between recorders and every consumer.

This face holds what a consumer of trace files needs: read them (load, read_trace_files, Columns,
ragged_rows), write them (TraceWriter, write_trace, write_columns), and name them (TraceHeader,
SUFFIX, FORMAT_*). The codec lives in the submodules and is imported from there: frames.py (the
frame sequence), header.py (the header map), column_file.py (column-wise batches, also the result
container), mapped.py (memory-mapped temporary columns), storage.py (local and object-store
paths). See docs/trace-format.md.
"""

from replayproxy.trace.column_file import expand_paths
from replayproxy.trace.columns import Columns, load, ragged_rows, read_trace_files, require_requests
from replayproxy.trace.frames import ReadReport
from replayproxy.trace.header import FORMAT_NAME, FORMAT_VERSION, SUFFIX, TraceFormatError, TraceHeader
from replayproxy.trace.writer import TraceWriter, write_columns, write_trace

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUFFIX",
    "Columns",
    "ReadReport",
    "TraceFormatError",
    "TraceHeader",
    "TraceWriter",
    "expand_paths",
    "load",
    "ragged_rows",
    "read_trace_files",
    "require_requests",
    "write_columns",
    "write_trace",
]
