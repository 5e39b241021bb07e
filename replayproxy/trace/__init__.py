"""Trace files (.rpt): the contract between recorders and every consumer.

A file is a sequence of frames (frames.py); its records are a header map (header.py), column-wise
batches of request shapes (column_file.py) and a footer. writer.py writes them, columns.py reads them
back as numpy columns. See docs/trace-format.md.
"""

from replayproxy.trace.column_file import (
    CODED_KINDS,
    NUMERIC_KINDS,
    RAGGED_KINDS,
    ColumnFileData,
    ColumnFileWriter,
    Pieces,
    encode_column,
    expand_paths,
    read_column_file,
    read_each,
    with_defaults,
)
from replayproxy.trace.columns import (
    RAGGED,
    Columns,
    load,
    ragged_rows,
    read_trace_files,
    require_requests,
    row_starts,
    take_rows,
)
from replayproxy.trace.frames import FrameWriter, ReadReport, iter_frame_payloads
from replayproxy.trace.header import (
    FORMAT_NAME,
    FORMAT_VERSION,
    SUFFIX,
    TraceFormatError,
    TraceHeader,
    checked_fields,
)
from replayproxy.trace.mapped import SpilledArray, gather, is_mapped, mapped_array, release_pages
from replayproxy.trace.storage import Named, ObjectURL, Source
from replayproxy.trace.writer import TraceWriter, write_columns, write_trace

__all__ = [
    "Named",
    "ObjectURL",
    "Source",
    "require_requests",
    "SpilledArray",
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
    "ColumnFileData",
    "ColumnFileWriter",
    "TraceFormatError",
    "TraceHeader",
    "TraceWriter",
    "checked_fields",
    "encode_column",
    "expand_paths",
    "gather",
    "is_mapped",
    "iter_frame_payloads",
    "load",
    "mapped_array",
    "read_each",
    "read_column_file",
    "ragged_rows",
    "row_starts",
    "take_rows",
    "release_pages",
    "read_trace_files",
    "with_defaults",
    "write_columns",
    "write_trace",
]
