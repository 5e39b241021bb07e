"""Trace files (.rpt): the contract between recorders and every consumer.

A file is a sequence of frames (frames.py); its records are a header map (header.py), column-wise
batches of request shapes (table.py) and a footer. writer.py writes them, columns.py reads them
back as shapes or numpy columns. See docs/trace-format.md.
"""

from replayproxy.trace.columns import RAGGED, Columns, iter_shapes, load, read_tables
from replayproxy.trace.frames import FrameWriter, ReadReport, iter_frame_payloads
from replayproxy.trace.header import (
    FORMAT_NAME,
    FORMAT_VERSION,
    SUFFIX,
    TraceFormatError,
    TraceHeader,
    checked_fields,
)
from replayproxy.trace.table import (
    CODED_KINDS,
    NUMERIC_KINDS,
    RAGGED_KINDS,
    Pieces,
    Table,
    TableFile,
    encode_column,
    expand_paths,
    read_each,
    read_table,
    with_defaults,
)
from replayproxy.trace.writer import TraceWriter, write_columns, write_trace

__all__ = [
    "CODED_KINDS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "NUMERIC_KINDS",
    "RAGGED",
    "RAGGED_KINDS",
    "SUFFIX",
    "Columns",
    "FrameWriter",
    "Pieces",
    "ReadReport",
    "Table",
    "TableFile",
    "TraceFormatError",
    "TraceHeader",
    "TraceWriter",
    "checked_fields",
    "encode_column",
    "expand_paths",
    "iter_frame_payloads",
    "iter_shapes",
    "load",
    "read_each",
    "read_table",
    "read_tables",
    "with_defaults",
    "write_columns",
    "write_trace",
]
