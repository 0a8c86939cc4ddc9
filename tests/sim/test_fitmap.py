"""Map fitting and offline coverage: hand counts, file formats, in-sample refusal."""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.errors import BadInput
from harness.formats.maps import read_hotlist, read_rowmap, write_count_dump
from harness.sim.commands import register
from harness.sim.fitmap import coverage, fit_top_k, load_counts
from harness.sim.trace_files import load_trace
from harness.sim.traces import trace_from_arrays

# 2 layers, 4 experts, top-2, 3 tokens (the first a prefill token, which scoring ignores).
EXPERTS = np.array(
    [
        [[3, 3], [3, 3]],
        [[0, 1], [2, 3]],
        [[0, 2], [2, 1]],
    ]
)


def cli(*argv: str) -> tuple[int, str]:
    """Run one of our verbs in-process."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    out = io.StringIO()
    return args.handler(args, out), out.getvalue()


def test_top_k_coverage_equals_a_hand_count() -> None:
    """Top-1 per layer from decode counts: layer 0 keeps 0 (2 of 4), layer 1 keeps 2 (2 of 4)."""
    trace = trace_from_arrays(EXPERTS, prefill=[True, False, False], experts_count=4)
    counts = np.zeros((2, 4))
    for token in EXPERTS[1:]:
        for layer in range(2):
            for expert in token[layer]:
                counts[layer, expert] += 1
    hot = fit_top_k(counts, 1)
    assert hot == [[0], [2]]
    result = coverage(trace, hot=hot)
    assert (result.covered, result.selections) == (4, 8)
    assert result.per_layer.tolist() == [0.5, 0.5] and result.share == 0.5
    records = coverage(trace, records=[(0, 0), (0, 1), (1, 1)])
    assert (records.covered, records.selections) == (4, 8)
    assert records.worst_layer == 1  # layer 1 covers 1 of 4


def test_fit_from_a_count_dump_writes_a_bootable_rowmap(tmp_path: Path) -> None:
    """The count-dump source; the rowmap partitions every layer and records its calibration."""
    dump = tmp_path / "dump.json"
    write_count_dump(dump, [[5, 1, 9, 0], [0, 0, 3, 3]], 1.0)
    code, text = cli("fit-map", str(dump), "--top", "2", "-o", str(tmp_path / "map.json"))
    assert code == 0 and "top 2 of 4 per layer" in text
    rowmap = read_rowmap(tmp_path / "map.json", experts=4)
    assert rowmap.hot == [[0, 2], [2, 3]]  # ties go to the lower id
    assert rowmap.meta["source_kind"] == "count dump"
    assert load_counts(dump).counts.tolist() == [[5, 1, 9, 0], [0, 0, 3, 3]]


def test_hotlist_fit_and_scores_refuse_in_sample(tmp_path: Path) -> None:
    """A trace-fitted hotlist; scoring on its own trace (or a copy) is refused unless asked."""
    np.savez(tmp_path / "fit.npz", experts=EXPERTS, prefill=[True, False, False])
    shutil.copy(tmp_path / "fit.npz", tmp_path / "copy.npz")
    np.save(tmp_path / "held.npy", EXPERTS[::-1].copy())
    out = str(tmp_path / "hot.txt")
    code, text = cli("fit-map", str(tmp_path / "fit.npz"), "--hotlist", "3", "-o", out,
                     "--score", str(tmp_path / "held.npy"))  # fmt: skip
    assert code == 0
    entries = read_hotlist(out).entries
    assert [(e[0], e[1], e[2]) for e in entries] == [(0, 0, 2), (1, 2, 2), (0, 1, 1)]
    # held.npy: 3 decode tokens (no prefill flag); selections 12; covered: layer 0 ids 0/1,
    # layer 1 id 2 -> tokens [0,2]/[2,1] -> 0,2 | [0,1]/[2,3] -> 0,1,2 | [3,3]/[3,3] -> none.
    assert "covered 5 of 12 selections (41.67%)" in text and "in-sample" not in text
    for same in ("fit.npz", "copy.npz"):
        with pytest.raises(BadInput, match="in-sample"):
            cli("fit-map", str(tmp_path / "fit.npz"), "--hotlist", "3", "-o", out,
                "--score", str(tmp_path / same))  # fmt: skip
    code, text = cli("fit-map", str(tmp_path / "fit.npz"), "--hotlist", "3", "-o", out,
                     "--score", str(tmp_path / "copy.npz"), "--in-sample")  # fmt: skip
    assert code == 0 and "[in-sample]" in text


def test_scoring_an_existing_rowmap_knows_its_source(tmp_path: Path) -> None:
    """--map scores a fitted rowmap; its meta names the source, so in-sample is still caught."""
    np.save(tmp_path / "fit.npy", EXPERTS)
    code, _ = cli(
        "fit-map", str(tmp_path / "fit.npy"), "--top", "2", "-o", str(tmp_path / "m.json")
    )
    assert code == 0
    with pytest.raises(BadInput, match="in-sample"):
        cli("fit-map", "--map", str(tmp_path / "m.json"), "--top", "2",
            "--score", str(tmp_path / "fit.npy"))  # fmt: skip
    np.save(tmp_path / "held.npy", EXPERTS[:2])
    code, text = cli("fit-map", "--map", str(tmp_path / "m.json"), "--top", "2",
                     "--score", str(tmp_path / "held.npy"))  # fmt: skip
    hot = read_rowmap(tmp_path / "m.json").hot
    expected = coverage(load_trace(tmp_path / "held.npy"), hot=hot)
    assert code == 0 and f"({100 * expected.share:.2f}%)" in text
