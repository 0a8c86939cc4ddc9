"""Rowmaps, ds4 hotlists and route-count dumps in the real runtimes' formats."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import MapError
from harness.formats.maps import (
    HOTLIST_MAGIC,
    fit_hotlist,
    fit_rowmap,
    read_count_dump,
    read_count_snapshot,
    read_hotlist,
    read_rowmap,
    write_count_dump,
    write_hotlist,
    write_rowmap,
)

# --- rowmaps -------------------------------------------------------------------------------


def test_rowmap_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "rowmap.json"
    hot = [[0, 2, 4, 8], [7, 1, 3, 5]]
    write_rowmap(path, hot, experts=9, meta={"calibration": "mix", "n_hot": 4})
    document = json.loads(path.read_text())
    assert document["layers"]["0"] == {"hot": [0, 2, 4, 8], "cold": [1, 3, 5, 6, 7]}
    rowmap = read_rowmap(path, experts=9)
    assert rowmap.hot == hot
    assert rowmap.experts == 9
    assert rowmap.meta == {"calibration": "mix", "n_hot": 4}


def test_rowmap_in_the_lane_format_reads(tmp_path: Path) -> None:
    path = tmp_path / "rowmap-mix-v1.json"
    path.write_text(
        '{"layers": {"0": {"hot": [0, 2, 4, 8], "cold": [1, 3, 5, 6, 7]}},'
        ' "meta": {"calibration": "what it was fitted on", "n_hot": 285}}'
    )
    rowmap = read_rowmap(path)
    assert (rowmap.hot, rowmap.experts) == ([[0, 2, 4, 8]], 9)


def write_layers(path: Path, layers: dict[str, object]) -> None:
    path.write_text(json.dumps({"layers": layers, "meta": {}}))


@pytest.mark.parametrize(
    ("layer1", "message"),
    [
        ({"hot": [0, 1], "cold": [2]}, r"layer 1: ids \[3\] are neither hot nor cold"),
        ({"hot": [0, 1, 3], "cold": [2, 3]}, r"layer 1: ids \[3\] are both hot and cold"),
        ({"hot": [0, 1, 1], "cold": [2, 3]}, r"layer 1: ids \[1\] are listed twice"),
        ({"hot": [0, 1, 9], "cold": [2, 3]}, r"layer 1: ids \[9\] are not in 0..3"),
    ],
)
def test_rowmap_partition_violations_name_layer_and_ids(
    tmp_path: Path, layer1: dict[str, list[int]], message: str
) -> None:
    path = tmp_path / "bad.json"
    write_layers(path, {"0": {"hot": [0, 1], "cold": [2, 3]}, "1": layer1})
    with pytest.raises(MapError) as caught:
        read_rowmap(path, experts=4)
    problems = caught.value.problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path}: layer 1: ")
    assert re.search(message, problems[0])


def test_rowmap_layer_keys_must_be_contiguous(tmp_path: Path) -> None:
    path = tmp_path / "gap.json"
    write_layers(path, {"0": {"hot": [0], "cold": [1]}, "2": {"hot": [0], "cold": [1]}})
    with pytest.raises(MapError, match=r"layer keys must be \"0\"..\"1\""):
        read_rowmap(path)


def test_write_rowmap_refuses_bad_ids(tmp_path: Path) -> None:
    with pytest.raises(MapError, match="refusing to write"):
        write_rowmap(tmp_path / "x.json", [[0, 5]], experts=4)
    assert not (tmp_path / "x.json").exists()


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"layers":\n {"0": [1, 2,]}}')
    with pytest.raises(MapError, match=r"broken\.json:2: not valid JSON"):
        read_rowmap(path)


# --- hotlists ------------------------------------------------------------------------------

HOTLIST_TEXT = f"""{HOTLIST_MAGIC}
# model flash-q2
# layers 43
# experts 256
# layer_records 2752
# selections 16512
# columns: layer expert hits weight
12 201 4411 0.0213
3 7 9 0.5
4 4 0 0
"""


def test_hotlist_reads_the_ds4_format_and_skips_zero_hits(tmp_path: Path) -> None:
    path = tmp_path / "hotlist.txt"
    path.write_text(HOTLIST_TEXT)
    hotlist = read_hotlist(path)
    assert hotlist.entries == [(12, 201, 4411, 0.0213), (3, 7, 9, 0.5)]
    assert (hotlist.layers, hotlist.experts, hotlist.model) == (43, 256, "flash-q2")
    assert (hotlist.layer_records, hotlist.selections) == (2752, 16512)


def test_hotlist_round_trip_sorts_by_hits_then_weight(tmp_path: Path) -> None:
    path = tmp_path / "hotlist.txt"
    entries = [(0, 1, 5, 0.1), (1, 2, 9, 0.3), (0, 3, 5, 0.2), (1, 0, 9, 0.3)]
    write_hotlist(path, entries, layers=2, experts=4)
    lines = path.read_text().splitlines()
    assert lines[:7] == [
        HOTLIST_MAGIC,
        "# model refbox",
        "# layers 2",
        "# experts 4",
        "# layer_records 4",
        "# selections 28",
        "# columns: layer expert hits weight",
    ]
    hotlist = read_hotlist(path)
    assert hotlist.entries == [(1, 0, 9, 0.3), (1, 2, 9, 0.3), (0, 3, 5, 0.2), (0, 1, 5, 0.1)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("12 201 4411", "expected 'layer expert hits weight', got 3 fields"),
        ("12 x 4411 0.1", "expected integers and a number"),
        ("43 1 5 0.1", r"\(layer 43, expert 1\) is outside 43 layers x 256 experts"),
        ("1 1 -5 0.1", "hits and weight must be >= 0"),
    ],
)
def test_hotlist_bad_line_names_path_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(HOTLIST_TEXT + row + "\n")
    with pytest.raises(MapError, match=rf"bad\.txt:11: {message}"):
        read_hotlist(path)


def test_hotlist_needs_its_header(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    path.write_text("12 201 4411 0.0213\n")
    with pytest.raises(MapError, match=r"plain\.txt:1: expected the header line"):
        read_hotlist(path)
    path.write_text(HOTLIST_MAGIC + "\n# experts 4\n1 1 1 0.5\n")
    with pytest.raises(MapError, match=r"missing header line '# layers <N>'"):
        read_hotlist(path)


# --- count dumps ---------------------------------------------------------------------------


def test_count_dump_round_trip_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "counts.json"
    counts = np.array([[3, 0, 7], [1, 1, 0]], dtype=np.int64)
    write_count_dump(path, counts, time_s=1727191530.2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counts.json"]  # no temp left over
    assert read_count_dump(path).tolist() == counts.tolist()
    snapshot = read_count_snapshot(path)
    assert snapshot.time_s == 1727191530.2
    assert json.loads(path.read_text())["layers"] == {"0": [3, 0, 7], "1": [1, 1, 0]}


def test_count_dump_refuses_ragged_layers(tmp_path: Path) -> None:
    path = tmp_path / "ragged.json"
    path.write_text(json.dumps({"layers": {"0": [1, 2], "1": [1]}, "time": 1.0}))
    with pytest.raises(MapError, match="same length"):
        read_count_dump(path)
    path.write_text(json.dumps({"layers": {"0": [1, -2]}, "time": 1.0}))
    with pytest.raises(MapError, match="non-negative integers"):
        read_count_dump(path)


# --- fitting -------------------------------------------------------------------------------


def test_fit_rowmap_equals_a_hand_count() -> None:
    counts = np.array(
        [
            [5, 1, 5, 0, 9],  # top 3: 4 (9), then 0 and 2 (5, 5)
            [2, 2, 2, 2, 3],  # top 3: 4 (3), then ties 0 and 1 by lower id
        ]
    )
    assert fit_rowmap(counts, 3) == [[0, 2, 4], [0, 1, 4]]


def test_fit_hotlist_is_the_global_top_with_layer_shares() -> None:
    counts = np.array([[6, 2, 0, 2], [1, 0, 0, 9]])
    entries = fit_hotlist(counts, 3)
    assert entries == [(1, 3, 9, 0.9), (0, 0, 6, 0.6), (0, 1, 2, 0.2)]
    assert len(fit_hotlist(counts, 100)) == 5  # zero counts are never listed


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    layers=st.integers(1, 4),
    experts=st.integers(1, 12),
    data=st.data(),
)
def test_fitted_maps_survive_their_files(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    layers: int,
    experts: int,
    data: st.DataObject,
) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 5, size=(layers, experts))
    hot_slots = data.draw(st.integers(0, experts))
    directory = tmp_path_factory.mktemp("maps")
    hot = fit_rowmap(counts, hot_slots)
    write_rowmap(directory / "rowmap.json", hot, experts)
    assert read_rowmap(directory / "rowmap.json", experts=experts).hot == hot
    # Every hot expert counts at least as much as every cold one in its layer.
    for layer, ids in enumerate(hot):
        cold = sorted(set(range(experts)) - set(ids))
        if ids and cold:
            assert counts[layer, ids].min() >= counts[layer, cold].max()
    entries = fit_hotlist(counts, data.draw(st.integers(0, layers * experts)))
    write_hotlist(directory / "hotlist.txt", entries, layers, experts)
    back = read_hotlist(directory / "hotlist.txt").entries
    assert [row[:3] for row in back] == [row[:3] for row in entries]
    assert [row[3] for row in back] == pytest.approx([row[3] for row in entries], rel=1e-5)
