"""The telemetry ring: a fixed-size circular file with one int64 record per host step.

File layout (all little-endian)::

    offset  size  what
    0       8     magic  b"HRING\\x00\\r\\n" (the CR LF catches text-mode mangling, as PNG does)
    8       4     u32 format version (RING_VERSION)
    12      4     u32 header_bytes: where slot 0 starts (a multiple of 64)
    16      4     u32 record_bytes: one slot = 8 * (1 + number of fields)
    20      4     u32 number of fields
    24      8     i64 capacity (slots)
    32      8     i64 sequence: records ever written; record n (1-based) is in slot (n-1) % cap
    40      8     i64 dropped: records the runtime chose not to write (``RingWriter.note_dropped``)
    48      16    4 x i32 geometry: layers, experts, top_k, hot_slots
    64      ...   field names, ASCII, NUL-separated, NUL-padded to header_bytes
    header_bytes  capacity slots of ``[marker, field_0, field_1, ...]`` int64

Torn-record protection, a per-slot seqlock: the first int64 of a slot is its marker, the 1-based
sequence number of the record it holds (0 = empty or being written). The writer sets the marker
to 0, writes the fields, then writes the marker LAST, and only then advances the header's
sequence. A reader keeps a slot only when its marker equals the sequence number the header says
that slot must hold, so a half-written slot (marker 0) or a slot left behind by a crashed writer
is dropped and counted as lost instead of being read as data. A reader of a live ring re-reads
the header after its copy and re-checks the markers of the slots the writer may have reached in
the meantime, dropping any whose marker changed. Markers and header counters are written as single
aligned 8-byte stores (a numpy element store; ``struct.pack_into`` zero-fills first and could be
caught half done). The live-read guarantee relies on stores becoming visible in program order,
which x86-64 (TSO) provides; on a weakly ordered CPU (ARM64) a reader racing the writer could in
rare cases accept a torn record. A ring whose writer has stopped or closed reads exactly.

A runtime profile may instead declare a header-less ring: a flat file of N named int64 fields
per record (seed 000's CUDA lane writes four per step). Those are read in file order with no
wrap-around or torn-record information.

This module is the format and its writer; :mod:`harness.formats.ring_read` reads rings back.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import numpy as np
import numpy.typing as npt

from harness.errors import RingError
from harness.formats.safe_write import open_in_place

__all__ = [
    "HEADER_ALIGN",
    "HEADER_PREFIX",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "RING_FIELDS",
    "RING_VERSION",
    "ROUTE_TRACE_VERSION",
    "SEQUENCE_OFFSET",
    "Int64Array",
    "RingGeometry",
    "RingWriter",
    "check_fields",
]

MAGIC = b"HRING\x00\r\n"
# Format version history:
#   1: first format (fixed 64-byte prefix, NUL-separated field names, per-slot seqlock marker).
RING_VERSION = 1
# The reference runtime's --route-trace JSONL (harness.refbox.engine documents the records):
#   1: drains fell on decode steps with step % drain_every == 0 and were not recorded;
#   2: drains fall every drain_every decode steps and each one is recorded.
ROUTE_TRACE_VERSION = 2
RING_FIELDS = (
    "t_ns",
    "dur_ns",
    "tokens",
    "lookups",
    "cold_lookups",
    "swaps",
    "bytes_read",
    "phase",
)

# The layout above, shared with the readers: the fixed prefix, the sequence counter's offset
# (loaded and stored as one aligned word), the header's alignment and a sanity bound on its size.
HEADER_PREFIX = struct.Struct("<8sIIIIqqqiiii")
SEQUENCE_OFFSET = 32
_SEQUENCE_WORD = SEQUENCE_OFFSET // 8
_DROPPED_WORD = 40 // 8
HEADER_ALIGN = 64
MAX_HEADER_BYTES = 1 << 16

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RingGeometry:
    """Model geometry stored in a ring header, so a ring can be read without its run record."""

    layers: int
    experts: int
    top_k: int
    hot_slots: int


def check_fields(fields: Sequence[str], where: str) -> tuple[str, ...]:
    """``fields`` as a tuple of ring field names, or a RingError naming ``where`` and the fault."""
    names = tuple(fields)
    if not names:
        raise RingError(f"{where}: a ring needs at least one field name")
    for name in names:
        if not (isinstance(name, str) and name.isascii() and name.isidentifier()):
            raise RingError(f"{where}: field name {name!r} must be an ASCII identifier")
        if name == "seq":
            raise RingError(f"{where}: field name 'seq' is reserved for the write sequence")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise RingError(f"{where}: duplicate field names {duplicates}")
    return names


def _header_bytes_for(fields: tuple[str, ...]) -> bytes:
    names = b"\x00".join(name.encode("ascii") for name in fields) + b"\x00"
    total = HEADER_PREFIX.size + len(names)
    total += -total % HEADER_ALIGN
    return names.ljust(total - HEADER_PREFIX.size, b"\x00")


class RingWriter:
    """Writes one record per host step into a ring file through a shared memory map.

    ``append`` costs three ``struct.pack_into`` calls and a header update (well under 2 µs), and
    never allocates; use it as a context manager or call ``close``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity: int,
        geometry: RingGeometry,
        fields: Sequence[str] = RING_FIELDS,
    ) -> None:
        """Create (or truncate) ``path`` as an empty ring of ``capacity`` slots."""
        self.path = os.fspath(path)
        self.fields = check_fields(fields, self.path)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise RingError(f"{self.path}: capacity must be a positive integer, got {capacity!r}")
        names = _header_bytes_for(self.fields)
        self._header_bytes = HEADER_PREFIX.size + len(names)
        self._record_bytes = 8 * (1 + len(self.fields))
        self._capacity = capacity
        prefix = HEADER_PREFIX.pack(
            MAGIC,
            RING_VERSION,
            self._header_bytes,
            self._record_bytes,
            len(self.fields),
            capacity,
            0,
            0,
            geometry.layers,
            geometry.experts,
            geometry.top_k,
            geometry.hot_slots,
        )
        size = self._header_bytes + capacity * self._record_bytes
        with open_in_place(self.path, "w+b") as handle:
            handle.write(prefix + names)
            # A sparse zero-filled body: every marker 0 means "empty" to readers.
            handle.truncate(size)
            handle.flush()
            self._mm: mmap.mmap | None = mmap.mmap(handle.fileno(), size)
        # The same map, typed non-optional for the hot path; _words is None once it is closed.
        self._target: mmap.mmap = self._mm
        # The whole file as int64 words: markers and header counters are stored through this
        # view because a numpy element store is one aligned 8-byte write, while
        # struct.pack_into zero-fills its target before packing, which a concurrent reader
        # could catch half done.
        self._words: Int64Array | None = np.frombuffer(self._mm, dtype="<i8")
        self._record = struct.Struct(f"<{len(self.fields)}q")
        self._sequence = 0
        self._dropped = 0
        self._first_marker = self._header_bytes // 8
        self._marker_stride = self._record_bytes // 8
        self._end_marker = size // 8
        self._next_marker = self._first_marker

    @property
    def sequence(self) -> int:
        """Records ever written (the 1-based sequence number of the latest record)."""
        return self._sequence

    @property
    def dropped(self) -> int:
        """Records the runtime reported as not written (``note_dropped``)."""
        return self._dropped

    def append(self, values: Sequence[int]) -> None:
        """Write one record (one int per field, in field order)."""
        words = self._words
        if words is None:
            raise RingError(f"{self.path}: append on a closed ring writer")
        if len(values) != len(self.fields):
            raise RingError(
                f"{self.path}: record has {len(values)} values, ring has {len(self.fields)} "
                f"fields {list(self.fields)}"
            )
        marker = self._next_marker
        sequence = self._sequence + 1
        # Seqlock order: invalidate the slot, write the fields, publish the marker, then the header.
        words[marker] = 0
        try:
            self._record.pack_into(self._target, marker * 8 + 8, *values)
        except struct.error as exc:
            raise RingError(f"{self.path}: record {list(values)!r} is not int64: {exc}") from exc
        words[marker] = sequence
        words[_SEQUENCE_WORD] = sequence
        self._sequence = sequence
        marker += self._marker_stride
        self._next_marker = self._first_marker if marker == self._end_marker else marker

    def extend(self, records: npt.ArrayLike) -> None:
        """Write many records at once from an int64 array ``[n, fields]`` (for simulators).

        Only the last ``capacity`` rows land in the file; the sequence still advances by ``n``,
        so readers count the rest as overwritten, exactly as if they had been appended one by one.
        """
        words = self._words
        if words is None:
            raise RingError(f"{self.path}: extend on a closed ring writer")
        rows = np.asarray(records)
        if rows.ndim != 2 or rows.shape[1] != len(self.fields):
            raise RingError(
                f"{self.path}: records must have shape [n, {len(self.fields)}], got {rows.shape}"
            )
        if rows.shape[0] == 0:
            return
        rows = rows.astype("<i8", copy=False)
        first = self._sequence + 1
        total = rows.shape[0]
        keep = min(total, self._capacity)
        sequences = np.arange(first + total - keep, first + total, dtype=np.int64)
        slots = (sequences - 1) % self._capacity
        body = words[self._first_marker :].reshape(self._capacity, self._marker_stride)
        body[slots, 0] = 0
        body[slots, 1:] = rows[total - keep :]
        body[slots, 0] = sequences
        self._sequence = first + total - 1
        words[_SEQUENCE_WORD] = self._sequence
        next_slot = self._sequence % self._capacity
        self._next_marker = self._first_marker + next_slot * self._marker_stride

    def note_dropped(self, count: int = 1) -> None:
        """Count records the runtime skipped (it could not keep up); readers add them to lost."""
        words = self._words
        if words is None:
            raise RingError(f"{self.path}: note_dropped on a closed ring writer")
        self._dropped += count
        words[_DROPPED_WORD] = self._dropped

    def flush(self) -> None:
        """Ask the OS to write the mapped pages back to the file."""
        if self._mm is not None:
            self._mm.flush()

    def close(self) -> None:
        """Flush and unmap; the file stays. Closing twice is harmless."""
        if self._mm is not None:
            self._words = None  # release the buffer export, or the map refuses to close
            self._mm.flush()
            self._mm.close()
            self._mm = None

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
