"""Reading telemetry rings back: whole or since a sequence, headed or header-less, and summed up.

The format, its torn-record protection and the writer are in :mod:`harness.formats.ring`; this
module holds only the reading side of that protocol: every record it returns was checked against
the slot's marker, and what it cannot give back is counted as lost.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from harness.errors import RingError
from harness.formats.ring import (
    HEADER_ALIGN,
    HEADER_PREFIX,
    MAGIC,
    MAX_HEADER_BYTES,
    RING_VERSION,
    SEQUENCE_OFFSET,
    Int64Array,
    RingGeometry,
    check_fields,
)
from harness.formats.textfile import check_regular

__all__ = ["Ring", "describe_ring", "read_ring", "read_ring_since"]


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


def _read_header(path: str, handle: io.FileIO, file_bytes: int) -> _Header:
    raw = handle.read(HEADER_PREFIX.size)
    if len(raw) < len(MAGIC):
        raise RingError(f"{path}: truncated ring: {len(raw)} bytes, not even a magic number")
    if raw[: len(MAGIC)] != MAGIC:
        raise RingError(
            f"{path}: not a telemetry ring (magic {raw[: len(MAGIC)]!r}, expected {MAGIC!r}); "
            "for a header-less ring pass its field names"
        )
    if len(raw) < HEADER_PREFIX.size:
        raise RingError(f"{path}: truncated header ({len(raw)} of {HEADER_PREFIX.size} bytes)")
    (_, version, header_bytes, record_bytes, n_fields, capacity, sequence, dropped, *geo) = (
        HEADER_PREFIX.unpack(raw)
    )
    if version != RING_VERSION:
        raise RingError(
            f"{path}: ring format version {version} is not supported (this harness reads "
            f"version {RING_VERSION}); upgrade the harness or rewrite the ring"
        )
    if not HEADER_PREFIX.size < header_bytes <= MAX_HEADER_BYTES or header_bytes % HEADER_ALIGN:
        raise RingError(f"{path}: corrupt header: header_bytes={header_bytes}")
    if n_fields < 1 or record_bytes != 8 * (1 + n_fields):
        raise RingError(
            f"{path}: corrupt header: record_bytes={record_bytes} does not fit {n_fields} fields"
        )
    if capacity < 1 or sequence < 0 or dropped < 0:
        raise RingError(
            f"{path}: corrupt header: capacity={capacity} sequence={sequence} dropped={dropped}"
        )
    names_raw = handle.read(header_bytes - HEADER_PREFIX.size)
    if len(names_raw) < header_bytes - HEADER_PREFIX.size:
        raise RingError(f"{path}: truncated header ({file_bytes} bytes, needs {header_bytes})")
    try:
        names = tuple(names_raw.rstrip(b"\x00").decode("ascii").split("\x00"))
    except UnicodeDecodeError as exc:
        raise RingError(f"{path}: corrupt header: field names are not ASCII") from exc
    if len(names) != n_fields:
        raise RingError(
            f"{path}: corrupt header: {n_fields} fields declared, names {list(names)} found"
        )
    check_fields(names, path)
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
    with mmap.mmap(handle.fileno(), HEADER_PREFIX.size, access=mmap.ACCESS_READ) as view:
        word = np.frombuffer(view, dtype="<i8", count=1, offset=SEQUENCE_OFFSET)
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
            wanted = check_fields(fields, path)
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
    names = check_fields(fields, path)
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
    check_regular(name, RingError, "a ring")  # a FIFO would block the read forever
    if fields is not None and not _starts_with_magic(name):
        return _read_headerless(name, fields)
    ring = _read_headed(name, 0, fields)
    # A whole-ring read also counts what the writer never wrote.
    return replace(ring, lost=ring.lost + ring.dropped)


def read_ring_since(path: str | os.PathLike[str], after_sequence: int) -> Ring:
    """Read only records with ``seq > after_sequence``, for draining a live ring.

    Start with ``after_sequence=0`` and pass the previous result's ``sequence`` next time.
    ``lost`` counts records in that range that were overwritten or torn before this read; it
    does not include the header's cumulative ``dropped`` (diff that field between drains).
    """
    name = os.fspath(path)
    check_regular(name, RingError, "a ring")
    if after_sequence < 0:
        raise RingError(f"{name}: after_sequence must be >= 0, got {after_sequence}")
    return _read_headed(name, after_sequence, None)


def _read_headed(name: str, after_sequence: int, fields: Sequence[str] | None) -> Ring:
    """A headed ring's records with seq > after_sequence; ``lost`` is overwritten + torn."""
    try:
        header, rows, overwritten, torn = _read_window(name, after_sequence, fields)
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
