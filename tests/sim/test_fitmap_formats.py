"""``harness fit-map --format``: SGLang's ``--init-expert-location`` JSON and .pt and KT's frequency
file, fitted from a count dump, an SGLang recorder dump or a trace, and scored held-out as KT's
frequency placement would place them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import BadInput, MapError
from harness.formats.expert_distribution import read_logical_count, write_stat_dump
from harness.formats.maps import write_count_dump
from harness.formats.torchfile import read_torch_file
from harness.sim.fitmap import frequency_hot
from tests.sim.test_fitmap import EXPERTS, cli

COUNTS = [[5, 1, 9, 0], [0, 0, 3, 3]]


def test_kt_frequency_placement_is_the_global_top_with_ties_to_lower_positions() -> None:
    # 2 per layer x 2 layers = the global top 4: 9, 5, then the tie 3/3 (layer 1 experts 2, 3).
    assert frequency_hot(COUNTS, 2) == [[0, 2], [2, 3]]
    # 1 per layer = the top 2 globally: both in layer 0 (a layer may get more than K, or none).
    assert frequency_hot(COUNTS, 1) == [[0, 2], []]
    with pytest.raises(MapError, match=r"must be in 0\.\.4"):
        frequency_hot(COUNTS, 5)


def test_a_dense_layer_takes_no_share_of_the_gpu_budget() -> None:
    # Layer 0 dense (no router: a row of zeros). KT places K x MoE layers = 2 x 2 globally.
    counts = [[0, 0, 0, 0], *COUNTS]
    assert frequency_hot(counts, 2) == [[], [0, 2], [2, 3]]


def test_each_format_writes_the_file_its_engine_reads(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    write_count_dump(dump, COUNTS, 1.0)
    out_json = str(tmp_path / "l.json")
    code, text = cli("fit-map", str(dump), "--format", "sglang-json", "-o", out_json)
    assert code == 0 and "logical_count [1, 2, 4], 21 selections, from count dump" in text
    # One pass deep, [1, layers, experts]: KT's loader refuses anything but 3-D, and SGLang's
    # init_by_eplb takes it as it takes 2-D (tests/engines/test_kt_conformance.py runs KT's).
    assert json.loads((tmp_path / "l.json").read_text()) == {"logical_count": [COUNTS]}
    for kind in ("sglang-pt", "kt-frequency"):
        out = tmp_path / f"{kind}.pt"
        code, _ = cli("fit-map", str(dump), "--format", kind, "-o", str(out))
        assert code == 0
        raw = read_torch_file(out)
        assert list(raw) == ["logical_count"] and raw["logical_count"].tolist() == [COUNTS]
    with pytest.raises(BadInput, match=r"writes a \.pt file"):
        cli("fit-map", str(dump), "--format", "kt-frequency", "-o", str(tmp_path / "x.json"))
    with pytest.raises(BadInput, match="drop --hotlist"):
        cli("fit-map", str(dump), "--format", "sglang-pt", "--hotlist", "3",
            "-o", str(tmp_path / "x.pt"))  # fmt: skip


def test_a_recorder_dump_is_a_source_and_a_counts_map_scores_held_out(tmp_path: Path) -> None:
    # A stat dump of two passes sums to COUNTS.
    passes = np.array([[[5, 1, 0, 0], [0, 0, 3, 0]], [[0, 0, 9, 0], [0, 0, 0, 3]]], np.int32)
    source = tmp_path / "expert_distribution_recorder_1.pt"
    write_stat_dump(source, passes)
    out = tmp_path / "freq.pt"
    np.save(tmp_path / "held.npy", EXPERTS)  # 3 decode tokens, 2 layers, top-2: 12 selections
    code, text = cli("fit-map", str(source), "--format", "kt-frequency", "--top", "2",
                     "-o", str(out), "--score", str(tmp_path / "held.npy"))  # fmt: skip
    assert code == 0 and read_logical_count(out).tolist() == COUNTS
    # Hot: layer 0 {0, 2}, layer 1 {2, 3}. held.npy tokens: [3,3]/[3,3] -> layer 1: 2;
    # [0,1]/[2,3] -> 1 + 2; [0,2]/[2,1] -> 2 + 1: 8 of 12.
    assert "covered 8 of 12 selections (66.67%)" in text
    code, text = cli("fit-map", "--map", str(out), "--format", "kt-frequency", "--top", "2",
                     "--score", str(tmp_path / "held.npy"))  # fmt: skip
    assert code == 0 and "covered 8 of 12 selections" in text
    with pytest.raises(BadInput, match="give --top K"):
        cli("fit-map", "--map", str(out), "--format", "kt-frequency",
            "--score", str(tmp_path / "held.npy"))  # fmt: skip
    with pytest.raises(BadInput, match="in-sample"):
        cli("fit-map", str(source), "--map", str(out), "--format", "kt-frequency", "--top", "2",
            "--score", str(source))  # fmt: skip
