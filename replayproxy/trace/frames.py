"""Frame codec shared by trace and result files: zstd frames behind skippable index frames.

Each data frame is preceded by a zstd skippable frame holding its compressed length and record
count, so a reader steps over a corrupt frame and detects a truncated tail exactly; plain
`zstd -d` still decodes a whole file. Damage is reported in a ReadReport, never raised mid-file.
"""

from __future__ import annotations

import io
import mmap
import struct
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

import zstandard

from replayproxy.trace.header import TraceFormatError

Part = bytes | bytearray | memoryview  # a piece of a frame's payload (a numpy array as a memoryview)

_SKIPPABLE_MAGIC = 0x184D2A5E  # one of zstd's 16 skippable-frame magic numbers
_INDEX = struct.Struct("<IIII")  # magic, payload size (8), compressed length, record count
_INDEX_PAYLOAD = 8


def compression_params(level: int) -> zstandard.ZstdCompressionParameters:
    """zstd `level` retuned for frames of packed 64-bit hashes: the fast strategy with a 2 MiB
    window, a 128k hash table and acceleration 16 compressed trace frames 1.7x faster than plain
    level 3 for 3% more bytes (419 vs 406 per request, BENCHMARKS.md "Trace I/O"); any zstd
    reader decodes them."""
    fast = {"strategy": zstandard.STRATEGY_FAST, "window_log": 21, "hash_log": 17, "target_length": 16}
    return zstandard.ZstdCompressionParameters.from_level(level, write_checksum=1, **fast)


class FrameWriter:
    """Appends index + zstd frames to one open file; shared by trace and result files.

    A frame's parts (msgpack pieces and the column blobs as they are) are laid end to end in one
    buffer reused from frame to frame, then compressed in one call: fresh memory costs a page
    fault per 4 KiB, which on a VM cost as much as compressing the same bytes (BENCHMARKS.md).
    """

    def __init__(self, stream: IO[bytes], level: int = 3) -> None:
        self._stream = stream
        self._compressor = zstandard.ZstdCompressor(compression_params=compression_params(level))
        self._payload = io.BytesIO()
        self.bytes_written = 0

    def write_frame(self, parts: Iterable[Part], records: int) -> None:
        """One zstd frame of the parts' bytes, in order."""
        self._payload.seek(0)
        self._payload.writelines(parts)
        with self._payload.getbuffer() as whole, whole[: self._payload.tell()] as payload:
            compressed = self._compressor.compress(payload)
        self._stream.write(_INDEX.pack(_SKIPPABLE_MAGIC, _INDEX_PAYLOAD, len(compressed), records))
        self._stream.write(compressed)
        self._stream.flush()
        self.bytes_written += _INDEX.size + len(compressed)


@dataclass(slots=True)
class ReadReport:
    """What a read saw besides records: every skipped byte is accounted for here."""

    files: int = 0
    records: int = 0
    frames: int = 0
    warnings: list[str] = field(default_factory=list)
    skipped_frames: int = 0
    lost_records: int = 0  # records known to be in skipped frames
    skipped_files: int = 0  # of several files, ones that could not be read at all
    duplicate_files: int = 0  # files holding the same records as one read before (read once)
    joined_turns: int = 0  # turns another file's reply continues, joined to that session (trace.fleet)
    footers: int = 0
    content: Any = None  # a hashlib object to digest every file's bytes as read, in order (None: not asked)
    paths: list[str] = field(default_factory=list)  # the files read, in order


def iter_frame_payloads(
    data: bytes | mmap.mmap, name: str, report: ReadReport
) -> Generator[memoryview, None, None]:
    """Decompressed payloads of every readable frame; damage is reported, never raised mid-file.

    Each payload is a view into one buffer that the next frame overwrites: decompressing into
    memory already touched spares a page fault per 4 KiB, which cost more than zstd itself when
    a million-record trace was decompressed into fresh `bytes` (BENCHMARKS.md "Trace I/O"). Copy
    what you keep before asking for the next one. The generator holds a view of `data`: close it
    (contextlib.closing) before closing a memory-mapped `data`.

    A frame whose index points past the end is a truncated tail (a crash while writing) unless
    another index follows, in which case the index itself was damaged and reading resumes there.
    """
    if not data:
        raise TraceFormatError(f"{name}: empty file, not a replayproxy file")
    if not _MARKER.startswith(data[:8]):
        raise TraceFormatError(f"{name}: not a replayproxy file (bad magic)")
    pos = 0
    view = memoryview(data)
    buffer = _Buffer()
    released = 0
    while pos < len(data):
        if not _is_index(data, pos):
            nxt = _find_index(data, pos + 1)
            if nxt < 0:
                cut = _MARKER.startswith(data[pos : pos + 8])
                what = "truncated frame index" if cut else "unreadable bytes"
                left = len(data) - pos
                report.warnings.append(f"{name}: {what} at offset {pos} skipped ({left} bytes at the end)")
                return
            report.warnings.append(f"{name}: {nxt - pos} unreadable bytes at offset {pos} skipped")
            pos = nxt
            continue
        _, _, length, records = _INDEX.unpack_from(data, pos)
        start = pos + _INDEX.size
        if start + length > len(data):
            nxt = _find_index(data, start)
            if nxt >= 0:
                report.skipped_frames += 1
                skipped = nxt - pos
                report.warnings.append(f"{name}: damaged frame index at offset {pos}; {skipped} bytes cut")
                pos = nxt
                continue
            report.skipped_frames += 1
            report.lost_records += records
            report.warnings.append(
                f"{name}: truncated last frame at offset {pos} skipped "
                f"({len(data) - pos} of {_INDEX.size + length} bytes present, {records} records lost)"
            )
            return
        try:
            payload = buffer.decompress(view[start : start + length])
        except zstandard.ZstdError as e:
            report.skipped_frames += 1
            report.lost_records += records
            lost = f"{records} records lost"
            report.warnings.append(f"{name}: corrupt frame at offset {pos} skipped ({lost}): {e}")
        else:
            report.frames += 1
            yield payload
        pos = start + length
        released = _release_read(data, released, pos)


RELEASE_BYTES = 8 << 20  # mapped file pages already read are dropped this many at a time


def _release_read(data: bytes | mmap.mmap, released: int, pos: int) -> int:
    """Drop the mapped pages before `pos` from memory (they are read again if touched): a
    multi-GB trace read frame by frame then never holds more than a few MB of its file resident."""
    done = pos - pos % mmap.PAGESIZE
    if not isinstance(data, mmap.mmap) or done - released < RELEASE_BYTES:
        return released
    data.madvise(mmap.MADV_DONTNEED, released, done - released)
    return done


def frame_totals(data: bytes | mmap.mmap) -> tuple[int, int]:
    """Records and decompressed bytes that the file's chain of frame indexes announces.

    An estimate read from the frame headers alone (damage ends the walk), so a reader can size
    its arrays once instead of growing them.
    """
    pos = records = payload_bytes = 0
    while _is_index(data, pos):
        _, _, length, count = _INDEX.unpack_from(data, pos)
        start = pos + _INDEX.size
        if start + length > len(data):
            break
        records += count
        payload_bytes += plausible_size(_content_size(data[start : start + min(length, 18)]), length)
        pos = start + length
    return records, payload_bytes


# Frames of trace and result columns compress 3-10x (BENCHMARKS.md "Trace I/O"); a size declared
# past this ratio is not believed before the bytes are there: memory is sized for what a frame can
# hold, and what it really holds grows it.
PLAUSIBLE_RATIO = 64
_MAX_WINDOW = 1 << 25  # writers use a 2 MiB window (compression_params); refuse frames that ask more


def plausible_size(declared: int, compressed: int) -> int:
    """A frame's decompressed size as far as it may be believed before decompressing it."""
    return max(0, min(declared, PLAUSIBLE_RATIO * compressed + 4096))


class _Buffer:
    """One growing buffer that frames are decompressed into, each over the last."""

    def __init__(self) -> None:
        self._memory = bytearray()
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)

    def decompress(self, frame: memoryview) -> memoryview:
        size = _content_size(frame)
        if size < 0 or size > plausible_size(size, len(frame)):
            # No size declared, or one not to be believed: decompress the slow way, where memory
            # grows only with the bytes that really come out.
            whole = self._decompressor.decompressobj().decompress(frame)
            if size >= 0 and len(whole) != size:
                raise zstandard.ZstdError(f"frame holds {len(whole)} bytes, its header declares {size}")
            return memoryview(whole)
        if size > len(self._memory):
            self._memory = bytearray(size + size // 4)
        target = memoryview(self._memory)[:size]
        reader = self._decompressor.stream_reader(frame, read_size=len(frame))
        got = reader.readinto(target)
        if got != size or reader.read(1):
            raise zstandard.ZstdError(f"frame holds other than the {size} bytes its header declares")
        return target


def _content_size(frame: bytes | memoryview) -> int:
    """The decompressed size a zstd frame header declares; -1 when absent or unreadable."""
    try:
        return int(zstandard.frame_content_size(frame))
    except zstandard.ZstdError:
        return -1


_MARKER = struct.pack("<II", _SKIPPABLE_MAGIC, _INDEX_PAYLOAD)


def _is_index(data: bytes | mmap.mmap, pos: int) -> bool:
    return len(data) - pos >= _INDEX.size and data[pos : pos + 8] == _MARKER


def _find_index(data: bytes | mmap.mmap, start: int) -> int:
    """The next index at or after `start` that is complete (a partial one at the end is a tail)."""
    found = data.find(_MARKER, start)
    return found if 0 <= found <= len(data) - _INDEX.size else -1
