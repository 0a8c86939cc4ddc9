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
from harness.formats.torchfile import read_torch_file, write_torch_file
from harness.sim.fitmap import cut_ties, frequency_hot, separate_ties
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


def _distinct_counts(written: list[list[list[float]]]) -> bool:
    """COUNTS as fit-map writes them: each within float32 steps of its count, and every value
    distinct, in the order the harness ranks them (count, then the lower layer, then the lower
    expert): 9, 5, the tied 3s (layer 1's expert 2 above its expert 3), 1, then the zeros as
    the least normal float32s. So no engine's tie rule can place another set than it scores."""
    assert np.array(written).shape == (1, 2, 4)
    flat = np.array(written[0], dtype=np.float64).ravel()
    ranked = [2, 0, 6, 7, 1, 3, 4, 5]  # flat positions, hottest first
    close = np.allclose(flat, np.ravel(COUNTS), rtol=1e-6, atol=1e-30)
    return close and bool(np.all(np.diff(flat[ranked]) < 0))


def test_each_format_writes_the_file_its_engine_reads(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    write_count_dump(dump, COUNTS, 1.0)
    out_json = str(tmp_path / "l.json")
    code, text = cli("fit-map", str(dump), "--format", "sglang-json", "-o", out_json)
    assert code == 0 and "logical_count [1, 2, 4], 21 selections, from count dump" in text
    # One pass deep, [1, layers, experts]: KT's loader refuses anything but 3-D, and SGLang's
    # init_by_eplb takes it as it takes 2-D (tests/engines/test_kt_conformance.py runs KT's).
    written = json.loads((tmp_path / "l.json").read_text())
    assert list(written) == ["logical_count"] and _distinct_counts(written["logical_count"])
    for kind in ("sglang-pt", "kt-frequency"):
        out = tmp_path / f"{kind}.pt"
        code, _ = cli("fit-map", str(dump), "--format", kind, "-o", str(out))
        assert code == 0
        raw = read_torch_file(out)
        assert list(raw) == ["logical_count"] and raw["logical_count"].dtype == np.float32
        assert _distinct_counts(raw["logical_count"].tolist())
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
    assert code == 0 and np.allclose(read_logical_count(out), COUNTS)
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


def test_a_dense_layer_has_no_place_even_where_moe_counts_tie_at_zero() -> None:
    # 2 per MoE layer x 2 = 4 places: 5, 3, 1, then a tie at 0 that goes to the lowest MoE
    # position (layer 1's expert 2), never to the dense layer 0 before it.
    counts = [[0, 0, 0, 0], [5, 1, 0, 0], [0, 0, 3, 0]]
    assert frequency_hot(counts, 2) == [[], [0, 1, 2], [2]]
    # KT could break the tie at 0 for any zero, the dense layer's included; as written, the
    # MoE zeros rise above the dense row's, in that order, and nothing ties at the cut.
    hot = frequency_hot(counts, 2)
    assert cut_ties(counts, hot) == 1
    written = separate_ties(counts)
    assert written[0].tolist() == [0, 0, 0, 0] and frequency_hot(written, 2) == hot
    assert cut_ties(written, hot) == 0


def test_decayed_counts_are_written_as_the_fractions_they_are(tmp_path: Path) -> None:
    # A half-life of 1 step over 3 decode steps: the last step weighs 1, the one before 0.5 and
    # the first 0.25. Written as integers, 0.5 and 0.25 were 0 and tied with every unused
    # expert; each format now holds them (float32), and SGLang's own loader takes floats
    # (tests/engines/test_sglang_conformance.py).
    np.savez(tmp_path / "fit.npz", experts=np.array([[[0, 1]], [[2, 1]], [[3, 1]]]),
             step=[0, 1, 2])  # fmt: skip
    for kind, name in (("sglang-json", "l.json"), ("sglang-pt", "l.pt"), ("kt-frequency", "k.pt")):
        code, text = cli("fit-map", str(tmp_path / "fit.npz"), "--decay-half-life-steps", "1",
                         "--format", kind, "-o", str(tmp_path / name))  # fmt: skip
        assert code == 0 and "3.50 decay-weighted selections" in text, text
        assert np.allclose(read_logical_count(tmp_path / name), [[0.25, 1.75, 0.5, 1]])


def test_sglang_files_are_not_scored_as_a_gpu_hot_set(tmp_path: Path) -> None:
    # SGLang keeps every expert on a GPU; the counts choose only which get redundant replicas.
    dump = tmp_path / "dump.json"
    write_count_dump(dump, COUNTS, 1.0)
    np.save(tmp_path / "held.npy", EXPERTS)
    for kind in ("sglang-json", "sglang-pt"):
        with pytest.raises(BadInput, match="--format kt-frequency --top K"):
            cli("fit-map", str(dump), "--format", kind, "--top", "2", "-o",
                str(tmp_path / f"x.{kind[7:]}"), "--score", str(tmp_path / "held.npy"))  # fmt: skip


def test_scoring_a_file_with_ties_at_the_cut_says_kt_may_place_others(tmp_path: Path) -> None:
    # A file another tool wrote, integer counts: where they tie at the cut KT's torch.topk
    # breaks the tie its own way, so the score is of one of the sets KT may place; fit-map
    # says so, and how to write the file without ties.
    tied = tmp_path / "tied.pt"
    write_torch_file(tied, {"logical_count": np.array([COUNTS])})
    np.save(tmp_path / "held.npy", EXPERTS)
    code, text = cli("fit-map", "--map", str(tied), "--format", "kt-frequency", "--top", "2",
                     "--score", str(tmp_path / "held.npy"))  # fmt: skip
    assert code == 0 and "WARNING" not in text  # 9, 5, 3, 3 above the 1 left out
    three = tmp_path / "three.pt"
    write_torch_file(three, {"logical_count": np.array([[[5, 1, 9, 0], [0, 3, 3, 3]]])})
    code, text = cli("fit-map", "--map", str(three), "--format", "kt-frequency", "--top", "2",
                     "--score", str(tmp_path / "held.npy"))  # fmt: skip
    assert code == 0 and f"WARNING: {three}: 2 of the GPU experts scored tie at the cut" in text
    assert f"`harness fit-map {three} --format kt-frequency -o NEW.pt`" in text
    # The remedy: the rewritten file ties nowhere, and scores the same set.
    fixed = tmp_path / "fixed.pt"
    assert cli("fit-map", str(three), "--format", "kt-frequency", "-o", str(fixed))[0] == 0
    again = cli("fit-map", "--map", str(fixed), "--format", "kt-frequency", "--top", "2",
                "--score", str(tmp_path / "held.npy"))[1]  # fmt: skip
    assert "WARNING" not in again and again.splitlines()[-1] == text.splitlines()[-1]
