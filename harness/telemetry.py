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
"""

from __future__ import annotations

import io
import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pandas as pd

from harness.errors import RingError

__all__ = [
    "MAGIC",
    "RING_FIELDS",
    "RING_VERSION",
    "ROUTE_TRACE_VERSION",
    "Ring",
    "RingGeometry",
    "RingWriter",
    "describe_ring",
    "read_ring",
    "read_ring_since",
]

MAGIC = b"HRING\x00\r\n"
# Format version history:
#   1: first format (fixed 64-byte prefix, NUL-separated field names, per-slot seqlock marker).
RING_VERSION = 1
# The reference runtime's --route-trace JSONL (harness.refbox.model documents the records):
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

_PREFIX = struct.Struct("<8sIIIIqqqiiii")
_SEQUENCE_OFFSET = 32
_SEQUENCE_WORD = _SEQUENCE_OFFSET // 8
_DROPPED_WORD = 40 // 8
_ALIGN = 64
_MAX_HEADER_BYTES = 1 << 16

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RingGeometry:
    """Model geometry stored in a ring header, so a ring can be read without its run record."""

    layers: int
    experts: int
    top_k: int
    hot_slots: int


@dataclass(frozen=True, eq=False)
class Ring:
    """A ring read back: header facts plus the surviving records in write order.

    ``frame`` has a ``seq`` column (1-based write sequence) and one int64 column per field.
    ``lost`` counts records the reader cannot give back: overwritten by wrap-around, torn (a slot
    whose marker does not match), and, for a whole-ring read, the header's dropped count.
    """

    path: str
    version: int
    fields: tuple[str, ...]
    capacity: int
    sequence: int
    dropped: int
    geometry: RingGeometry | None
    frame: pd.DataFrame
    lost: int
    torn: int = 0


@dataclass(frozen=True)
class _Header:
    version: int
    header_bytes: int
    record_bytes: int
    fields: tuple[str, ...]
    capacity: int
    sequence: int
    dropped: int
    geometry: RingGeometry


def _check_fields(fields: Sequence[str], where: str) -> tuple[str, ...]:
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
    total = _PREFIX.size + len(names)
    total += -total % _ALIGN
    return names.ljust(total - _PREFIX.size, b"\x00")


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
        self.fields = _check_fields(fields, self.path)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise RingError(f"{self.path}: capacity must be a positive integer, got {capacity!r}")
        names = _header_bytes_for(self.fields)
        self._header_bytes = _PREFIX.size + len(names)
        self._record_bytes = 8 * (1 + len(self.fields))
        self._capacity = capacity
        prefix = _PREFIX.pack(
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
        with open(self.path, "w+b") as handle:
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


def _read_header(path: str, handle: io.FileIO, file_bytes: int) -> _Header:
    raw = handle.read(_PREFIX.size)
    if len(raw) < len(MAGIC):
        raise RingError(f"{path}: truncated ring: {len(raw)} bytes, not even a magic number")
    if raw[: len(MAGIC)] != MAGIC:
        raise RingError(
            f"{path}: not a telemetry ring (magic {raw[: len(MAGIC)]!r}, expected {MAGIC!r}); "
            "for a header-less ring pass its field names"
        )
    if len(raw) < _PREFIX.size:
        raise RingError(f"{path}: truncated header ({len(raw)} of {_PREFIX.size} bytes)")
    (_, version, header_bytes, record_bytes, n_fields, capacity, sequence, dropped, *geo) = (
        _PREFIX.unpack(raw)
    )
    if version != RING_VERSION:
        raise RingError(
            f"{path}: ring format version {version} is not supported (this harness reads "
            f"version {RING_VERSION}); upgrade the harness or rewrite the ring"
        )
    if not _PREFIX.size < header_bytes <= _MAX_HEADER_BYTES or header_bytes % _ALIGN:
        raise RingError(f"{path}: corrupt header: header_bytes={header_bytes}")
    if n_fields < 1 or record_bytes != 8 * (1 + n_fields):
        raise RingError(
            f"{path}: corrupt header: record_bytes={record_bytes} does not fit {n_fields} fields"
        )
    if capacity < 1 or sequence < 0 or dropped < 0:
        raise RingError(
            f"{path}: corrupt header: capacity={capacity} sequence={sequence} dropped={dropped}"
        )
    names_raw = handle.read(header_bytes - _PREFIX.size)
    if len(names_raw) < header_bytes - _PREFIX.size:
        raise RingError(f"{path}: truncated header ({file_bytes} bytes, needs {header_bytes})")
    try:
        names = tuple(names_raw.rstrip(b"\x00").decode("ascii").split("\x00"))
    except UnicodeDecodeError as exc:
        raise RingError(f"{path}: corrupt header: field names are not ASCII") from exc
    if len(names) != n_fields:
        raise RingError(
            f"{path}: corrupt header: {n_fields} fields declared, names {list(names)} found"
        )
    _check_fields(names, path)
    needed = header_bytes + capacity * record_bytes
    if file_bytes < needed:
        raise RingError(
            f"{path}: truncated ring: {file_bytes} bytes, header says {needed} "
            f"({capacity} slots of {record_bytes} bytes); the copy was cut short"
        )
    return _Header(
        version=version,
        header_bytes=header_bytes,
        record_bytes=record_bytes,
        fields=names,
        capacity=capacity,
        sequence=sequence,
        dropped=dropped,
        geometry=RingGeometry(*geo),
    )


def _read_slots(
    path: str, handle: io.FileIO, header: _Header, first: int, count: int
) -> Int64Array:
    """Copy the slots of sequences ``first .. first+count-1`` (count <= capacity), in order."""
    width = header.record_bytes // 8
    rows: Int64Array = np.empty((count, width), dtype="<i8")
    start = (first - 1) % header.capacity
    head = min(count, header.capacity - start)
    # Two contiguous reads straight into the result put the records in write order with no
    # extra copy, which is what keeps a 15M-record read close to np.fromfile.
    for offset_slot, part in ((start, rows[:head]), (0, rows[head:])):
        if part.shape[0] == 0:
            continue
        handle.seek(header.header_bytes + offset_slot * header.record_bytes)
        target = part.data.cast("B")
        done = 0
        while done < part.nbytes:  # an unbuffered read returns at most ~2 GiB at a time
            got = handle.readinto(target[done:])
            if not got:
                raise RingError(f"{path}: truncated ring: short read of the record area")
            done += got
    return rows


def _load_sequence(handle: io.FileIO) -> int:
    """The header's sequence as one aligned 8-byte load, never torn by a concurrent store."""
    with mmap.mmap(handle.fileno(), _PREFIX.size, access=mmap.ACCESS_READ) as view:
        word = np.frombuffer(view, dtype="<i8", count=1, offset=_SEQUENCE_OFFSET)
        value = int(word[0])
        del word  # release the buffer export before the map closes
    return value


def _read_window(
    path: str, after_sequence: int, fields: Sequence[str] | None
) -> tuple[_Header, Int64Array, int, int]:
    """Records with seq > after_sequence still in the ring: (header, rows, overwritten, torn)."""
    # Unbuffered: a buffered first read would cache slots the writer may fill before the
    # sequence is loaded, and they would then look torn.
    with open(path, "rb", buffering=0) as handle:
        file_bytes = os.fstat(handle.fileno()).st_size
        header = _read_header(path, handle, file_bytes)
        header = replace(header, sequence=_load_sequence(handle))
        if fields is not None:
            wanted = _check_fields(fields, path)
            missing = [name for name in wanted if name not in header.fields]
            if missing:
                raise RingError(
                    f"{path}: fields {missing} are not in this ring; it has {list(header.fields)}"
                )
        newest = header.sequence
        if after_sequence > newest:
            raise RingError(
                f"{path}: ring sequence {newest} is behind after_sequence {after_sequence}; "
                "the runtime recreated the ring, so start draining again from 0"
            )
        first = max(after_sequence, newest - header.capacity) + 1
        overwritten = first - after_sequence - 1
        count = newest - first + 1
        rows = _read_slots(path, handle, header, first, count)
        newest_now = _load_sequence(handle)
        # Slots the writer reached since the header read (including one in progress) now hold
        # sequences up to newest_now + 1; our rows with seq <= newest_now + 1 - capacity may have
        # changed under the copy, so re-read their markers and drop any that moved.
        reached = min(count, newest_now + 1 - header.capacity - first + 1)
        changed = np.zeros(count, dtype=bool)
        if reached > 0:
            again = _read_slots(path, handle, header, first, reached)
            changed[:reached] = again[:, 0] != rows[:reached, 0]
    expected = np.arange(first, newest + 1, dtype=np.int64)
    bad = (rows[:, 0] != expected) | changed
    torn = int(np.count_nonzero(bad))
    if torn:
        rows = rows[~bad]
    return header, rows, overwritten, torn


def _frame(rows: Int64Array, fields: tuple[str, ...]) -> pd.DataFrame:
    # copy=False keeps the columns as views of the one block we read (pandas 3 copies by default).
    return pd.DataFrame(rows, columns=["seq", *fields], copy=False)


def _read_headerless(path: str, fields: Sequence[str]) -> Ring:
    names = _check_fields(fields, path)
    width = 8 * len(names)
    try:
        file_bytes = os.path.getsize(path)
    except OSError as exc:
        raise RingError(f"{path}: cannot read ring: {exc.strerror}") from exc
    if file_bytes % width:
        raise RingError(
            f"{path}: truncated header-less ring: {file_bytes} bytes is not a whole number of "
            f"{len(names)}-field records ({width} bytes each); check the declared fields"
        )
    count = file_bytes // width
    rows: Int64Array = np.empty((count, 1 + len(names)), dtype="<i8")
    rows[:, 0] = np.arange(1, count + 1, dtype=np.int64)
    rows[:, 1:] = np.fromfile(path, dtype="<i8").reshape(count, len(names))
    return Ring(
        path=path,
        version=0,
        fields=names,
        capacity=count,
        sequence=count,
        dropped=0,
        geometry=None,
        frame=_frame(rows, names),
        lost=0,
    )


def _starts_with_magic(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError as exc:
        raise RingError(f"{path}: cannot read ring: {exc.strerror}") from exc


def read_ring(path: str | os.PathLike[str], *, fields: Sequence[str] | None = None) -> Ring:
    """Read a whole ring, records in write order, torn and overwritten ones counted in ``lost``.

    With ``fields`` and a file without the ring magic, the file is read as a header-less ring of
    ``len(fields)`` int64 per record, in file order. With ``fields`` and a headed ring, the names
    must all be present in the header (a profile's declaration is checked, not trusted).
    """
    name = os.fspath(path)
    if fields is not None and not _starts_with_magic(name):
        return _read_headerless(name, fields)
    try:
        header, rows, overwritten, torn = _read_window(name, 0, fields)
    except OSError as exc:
        raise RingError(f"{name}: cannot read ring: {exc.strerror}") from exc
    return Ring(
        path=name,
        version=header.version,
        fields=header.fields,
        capacity=header.capacity,
        sequence=header.sequence,
        dropped=header.dropped,
        geometry=header.geometry,
        frame=_frame(rows, header.fields),
        lost=overwritten + torn + header.dropped,
        torn=torn,
    )


def read_ring_since(path: str | os.PathLike[str], after_sequence: int) -> Ring:
    """Read only records with ``seq > after_sequence``, for draining a live ring.

    Start with ``after_sequence=0`` and pass the previous result's ``sequence`` next time.
    ``lost`` counts records in that range that were overwritten or torn before this read; it
    does not include the header's cumulative ``dropped`` (diff that field between drains).
    """
    name = os.fspath(path)
    if after_sequence < 0:
        raise RingError(f"{name}: after_sequence must be >= 0, got {after_sequence}")
    try:
        header, rows, overwritten, torn = _read_window(name, after_sequence, None)
    except OSError as exc:
        raise RingError(f"{name}: cannot read ring: {exc.strerror}") from exc
    return Ring(
        path=name,
        version=header.version,
        fields=header.fields,
        capacity=header.capacity,
        sequence=max(header.sequence, after_sequence),
        dropped=header.dropped,
        geometry=header.geometry,
        frame=_frame(rows, header.fields),
        lost=overwritten + torn,
        torn=torn,
    )


def describe_ring(path: str | os.PathLike[str], *, fields: Sequence[str] | None = None) -> str:
    """A human summary for ``harness ring show FILE``: header, geometry, records, lost, sums."""
    ring = read_ring(path, fields=fields)
    frame = ring.frame
    lines = [f"ring {ring.path}"]
    if ring.version:
        lines.append(f"  format version {ring.version}, capacity {ring.capacity} records")
    else:
        lines.append("  header-less ring (declared fields), records in file order")
    if ring.geometry is not None:
        geo = ring.geometry
        lines.append(
            f"  geometry: {geo.layers} layers x {geo.experts} experts, top-{geo.top_k}, "
            f"{geo.hot_slots} hot slots"
        )
    lines.append(f"  fields: {', '.join(ring.fields)}")
    lines.append(
        f"  records: {len(frame)} readable of {ring.sequence} written; lost {ring.lost} "
        f"(torn {ring.torn}, dropped by the writer {ring.dropped})"
    )
    if len(frame):
        lines.append(f"  seq span: {int(frame['seq'].iloc[0])}..{int(frame['seq'].iloc[-1])}")
    if "t_ns" in ring.fields and len(frame) > 1:
        span_s = (int(frame["t_ns"].iloc[-1]) - int(frame["t_ns"].iloc[0])) / 1e9
        lines.append(f"  time span: {span_s:.3f} s")
    sums = frame[list(ring.fields)].sum()
    width = max(len(name) for name in ring.fields)
    lines.append("  per-field sums:")
    for name in ring.fields:
        lines.append(f"    {name:<{width}}  {int(sums[name])}")
    return "\n".join(lines)
