"""The telemetry ring: round trips, wrap-around, torn and truncated files, header-less rings."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import RingError
from harness.formats.ring import MAGIC, RING_FIELDS, RING_VERSION, RingGeometry, RingWriter
from harness.formats.ring_read import describe_ring, read_ring, read_ring_since

GEOMETRY = RingGeometry(layers=4, experts=16, top_k=2, hot_slots=12)


def record(index: int) -> list[int]:
    """A record whose every field is derived from its index, so order mistakes show."""
    return [index * 10 + field for field in range(len(RING_FIELDS))]


def write_ring(path: Path, capacity: int, count: int) -> None:
    with RingWriter(path, capacity, GEOMETRY) as writer:
        for index in range(count):
            writer.append(record(index))


def slot_offset(path: Path, slot: int) -> int:
    """Byte offset of a slot, from the header's own header_bytes and record_bytes."""
    header_bytes, record_bytes = struct.unpack_from("<II", path.read_bytes(), 12)
    return int(header_bytes + slot * record_bytes)


def test_round_trip_keeps_fields_order_and_geometry(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=16, count=5)
    ring = read_ring(path)
    assert ring.version == RING_VERSION
    assert ring.fields == RING_FIELDS
    assert ring.geometry == GEOMETRY
    assert (ring.capacity, ring.sequence, ring.dropped, ring.lost, ring.torn) == (16, 5, 0, 0, 0)
    assert list(ring.frame.columns) == ["seq", *RING_FIELDS]
    assert ring.frame["seq"].tolist() == [1, 2, 3, 4, 5]
    assert ring.frame[list(RING_FIELDS)].to_numpy().tolist() == [record(i) for i in range(5)]


def test_wrap_around_returns_last_capacity_records_in_order(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=8, count=20)
    ring = read_ring(path)
    assert ring.sequence == 20
    assert ring.lost == 12
    assert ring.frame["seq"].tolist() == list(range(13, 21))
    assert ring.frame["t_ns"].tolist() == [record(i)[0] for i in range(12, 20)]


def test_empty_ring_reads_as_no_records(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=4, count=0)
    ring = read_ring(path)
    assert len(ring.frame) == 0
    assert ring.lost == 0


def test_dropped_records_count_as_lost(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    with RingWriter(path, 8, GEOMETRY) as writer:
        writer.append(record(0))
        writer.note_dropped(3)
    ring = read_ring(path)
    assert (ring.dropped, ring.lost, len(ring.frame)) == (3, 3, 1)


def test_extend_matches_appending_one_by_one(tmp_path: Path) -> None:
    rows = np.array([record(i) for i in range(23)], dtype=np.int64)
    one, many = tmp_path / "one.bin", tmp_path / "many.bin"
    write_ring(one, capacity=8, count=23)
    with RingWriter(many, 8, GEOMETRY) as writer:
        writer.extend(rows[:5])
        writer.extend(rows[5:])
    assert one.read_bytes() == many.read_bytes()


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=8, count=3)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    with pytest.raises(RingError, match=r"ring\.bin: truncated ring"):
        read_ring(path)
    path.write_bytes(data[:40])
    with pytest.raises(RingError, match="truncated"):
        read_ring(path)


def test_torn_record_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=8, count=6)
    data = bytearray(path.read_bytes())
    # Slot 2 holds seq 3; a marker of 0 is what an interrupted write leaves behind.
    struct.pack_into("<q", data, slot_offset(path, 2), 0)
    path.write_bytes(bytes(data))
    ring = read_ring(path)
    assert ring.frame["seq"].tolist() == [1, 2, 4, 5, 6]
    assert (ring.torn, ring.lost) == (1, 1)


def test_stale_marker_from_an_older_lap_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=4, count=10)
    data = bytearray(path.read_bytes())
    # Slot 1 should hold seq 10; put back seq 6, as if the writer died before publishing.
    struct.pack_into("<q", data, slot_offset(path, 1), 6)
    path.write_bytes(bytes(data))
    ring = read_ring(path)
    assert ring.frame["seq"].tolist() == [7, 8, 9]
    assert ring.lost == 6 + 1


def test_bad_magic_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "not-a-ring.bin"
    path.write_bytes(b"GARBAGE!" + bytes(200))
    with pytest.raises(RingError, match=r"not-a-ring\.bin: not a telemetry ring"):
        read_ring(path)


def test_unknown_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=4, count=1)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, len(MAGIC), 99)
    path.write_bytes(bytes(data))
    with pytest.raises(RingError, match="version 99 is not supported"):
        read_ring(path)


def test_declared_fields_must_exist_in_a_headed_ring(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=4, count=1)
    assert len(read_ring(path, fields=["t_ns", "swaps"]).frame) == 1
    with pytest.raises(RingError, match=r"fields \['hits'\] are not in this ring"):
        read_ring(path, fields=["t_ns", "hits"])


def test_headerless_ring_of_four_int64(tmp_path: Path) -> None:
    path = tmp_path / "lane.ring"
    rows = np.arange(24, dtype="<i8").reshape(6, 4)
    rows.tofile(path)
    fields = ("t_ns", "dur_ns", "cold_lookups", "swaps")
    ring = read_ring(path, fields=fields)
    assert ring.geometry is None
    assert ring.fields == fields
    assert ring.frame["seq"].tolist() == [1, 2, 3, 4, 5, 6]
    assert ring.frame[list(fields)].to_numpy().tolist() == rows.tolist()
    with path.open("ab") as handle:
        handle.write(b"\x00" * 8)
    with pytest.raises(RingError, match="not a whole number of 4-field records"):
        read_ring(path, fields=fields)


def test_read_since_drains_a_live_ring(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    with RingWriter(path, 8, GEOMETRY) as writer:
        for index in range(5):
            writer.append(record(index))
        first = read_ring_since(path, 0)
        assert first.frame["seq"].tolist() == [1, 2, 3, 4, 5]
        for index in range(5, 7):
            writer.append(record(index))
        second = read_ring_since(path, first.sequence)
        assert second.frame["seq"].tolist() == [6, 7]
        assert second.lost == 0
        for index in range(7, 19):
            writer.append(record(index))
        third = read_ring_since(path, second.sequence)
        # seq 8..19 were written, only 12..19 survive in 8 slots.
        assert third.frame["seq"].tolist() == list(range(12, 20))
        assert third.lost == 4
        assert len(read_ring_since(path, third.sequence).frame) == 0
    with pytest.raises(RingError, match="recreated the ring"):
        read_ring_since(path, 100)


def test_describe_ring_summarises(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    write_ring(path, capacity=8, count=10)
    text = describe_ring(path)
    assert "4 layers x 16 experts, top-2, 12 hot slots" in text
    assert "records: 8 readable of 10 written; lost 2" in text
    swaps_sum = sum(record(i)[RING_FIELDS.index("swaps")] for i in range(2, 10))
    assert f"swaps         {swaps_sum}" in text


def test_writer_refuses_bad_records_and_names(tmp_path: Path) -> None:
    path = tmp_path / "ring.bin"
    with pytest.raises(RingError, match="duplicate field names"):
        RingWriter(path, 4, GEOMETRY, fields=("a", "a"))
    with pytest.raises(RingError, match="reserved"):
        RingWriter(path, 4, GEOMETRY, fields=("seq",))
    with RingWriter(path, 4, GEOMETRY, fields=("a", "b")) as writer:
        with pytest.raises(RingError, match="2 fields"):
            writer.append([1])
        with pytest.raises(RingError, match="not int64"):
            writer.append([1, 2**63])
        writer.append([1, 2])
    ring = read_ring(path)
    assert ring.frame[["a", "b"]].to_numpy().tolist() == [[1, 2]]


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 12), count=st.integers(0, 40), chunk=st.integers(1, 13))
def test_any_count_round_trips_the_last_records(
    tmp_path_factory: pytest.TempPathFactory, capacity: int, count: int, chunk: int
) -> None:
    path = tmp_path_factory.mktemp("ring") / "ring.bin"
    rows = np.array([record(i) for i in range(count)], dtype=np.int64).reshape(
        count, len(RING_FIELDS)
    )
    with RingWriter(path, capacity, GEOMETRY) as writer:
        # Mix single appends and bulk extends, which must be indistinguishable to a reader.
        for start in range(0, count, chunk):
            part = rows[start : start + chunk]
            if start // chunk % 2:
                writer.extend(part)
            else:
                for row in part.tolist():
                    writer.append(row)
    ring = read_ring(path)
    kept = min(count, capacity)
    assert ring.sequence == count
    assert ring.lost == count - kept
    assert ring.frame["seq"].tolist() == list(range(count - kept + 1, count + 1))
    assert ring.frame[list(RING_FIELDS)].to_numpy().tolist() == rows[count - kept :].tolist()


WRITER_SCRIPT = """
import sys
from harness.formats.ring import RING_FIELDS, RingGeometry, RingWriter
path, count = sys.argv[1], int(sys.argv[2])
with RingWriter(path, 64, RingGeometry(4, 16, 2, 12)) as writer:
    print("ready", flush=True)
    for index in range(count):
        writer.append([index * 10 + field for field in range(len(RING_FIELDS))])
"""


def test_live_reader_never_returns_a_torn_record(tmp_path: Path) -> None:
    """A reader racing a writer process gets only whole records, and accounts for the rest."""
    path = tmp_path / "live.bin"
    count = 300_000
    with subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(path), str(count)],
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        seen = lost = after = drains = 0
        while True:
            done = writer.poll() is not None
            ring = read_ring_since(path, after)
            seqs = ring.frame["seq"].to_numpy()
            expected = (seqs - 1)[:, None] * 10 + np.arange(len(RING_FIELDS))
            assert (ring.frame[list(RING_FIELDS)].to_numpy() == expected).all()
            assert (np.diff(seqs) > 0).all()
            seen += len(seqs)
            lost += ring.lost
            drains += 1
            after = ring.sequence
            if done:
                break
    assert writer.returncode == 0
    assert seen + lost == count
    assert drains > 1
