"""SGLang's expert-distribution files: recorder dumps of each mode, KT's GPU masks, and the
``--init-expert-location`` / KT frequency files, pinned on small fixed tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import BadInput
from harness.formats.expert_distribution import (
    combine_dumps,
    gpu_hits,
    read_dump,
    read_logical_count,
    write_logical_count,
    write_stat_dump,
)
from harness.formats.torchfile import read_torch_file, write_torch_file
from tests.conftest import run_cli

# Two passes, two layers, three experts.
COUNTS = np.array([[[4, 0, 1], [2, 2, 1]], [[0, 3, 2], [5, 0, 0]]], dtype=np.int32)
MASKS = np.array([[[1, 0, 0], [0, 1, 1]], [[1, 1, 0], [0, 0, 1]]], dtype=bool)


def test_a_stat_dump_with_kt_masks_is_written_as_sglang_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "expert_distribution_recorder_1.pt"
    write_stat_dump(path, COUNTS, MASKS)
    raw = read_torch_file(path)
    assert set(raw) == {
        "rank",
        "logical_count",
        "average_utilization_rate_over_window",
        "gpu_expert_masks",
    }
    assert raw["logical_count"].dtype == np.int32 and raw["gpu_expert_masks"].dtype == bool
    dump = read_dump(path)
    assert dump.mode == "stat" and dump.counts.shape == (2, 2, 3)
    # GPU hits: pass 0: 4 (l0 e0) + 2 + 1 (l1 e1, e2) = 7; pass 1: 0 + 3 (l0 e0, e1) + 0 = 3.
    assert gpu_hits(dump) == (10, 20 - 10)


def test_masks_pair_with_the_counts_pass_by_pass_and_other_lengths_are_refused(
    tmp_path: Path,
) -> None:
    # KT's recorder appends a mask with every counted pass (into a buffer of the same size), so
    # its two files are of one length, pass i with pass i. A masks file of another length is
    # another dump's: refused, naming both files and both lengths, never paired by guess.
    counts_path, masks_path = tmp_path / "c.pt", tmp_path / "m.pt"
    write_stat_dump(counts_path, COUNTS)
    write_torch_file(masks_path, {"gpu_expert_masks": MASKS})
    dump = combine_dumps([read_dump(counts_path), read_dump(masks_path)], "d")
    assert gpu_hits(dump) == (10, 20 - 10)
    write_torch_file(masks_path, {"gpu_expert_masks": MASKS[1:]})
    dump = combine_dumps([read_dump(counts_path), read_dump(masks_path)], "d")
    with pytest.raises(BadInput) as caught:
        gpu_hits(dump)
    message = str(caught.value)
    assert f"{masks_path}: gpu_expert_masks holds 1 passes" in message, message
    assert f"{counts_path}: logical_count 2" in message, message
    # Passes left out (KT ran them wholly on the GPU) count in neither hits nor misses.
    assert gpu_hits(read_dump(_with_masks(tmp_path)), np.array([False, True])) == (7, 10 - 7)


def _with_masks(folder: Path) -> Path:
    path = folder / "both.pt"
    write_stat_dump(path, COUNTS, MASKS)
    return path


def test_a_per_pass_dump_maps_physical_experts_to_logical_ones(tmp_path: Path) -> None:
    # Four physical slots for three logical experts: slot 3 is a replica of expert 0.
    mapping = np.array([[0, 1, 2, 0], [0, 1, 2, 2]], dtype=np.int64)
    records = [
        {"forward_pass_id": 0, "rank": 0, "global_physical_count": np.array([[1, 2, 0, 3]] * 2)},
        {"forward_pass_id": 1, "rank": 0, "global_physical_count": np.array([[0, 0, 1, 1]] * 2)},
    ]
    path = tmp_path / "expert_distribution_recorder_1_0.pt"
    write_torch_file(path, {"records": records, "last_physical_to_logical_map": mapping})
    dump = read_dump(path)
    assert dump.mode == "per_pass"
    assert dump.counts.tolist() == [[[4, 2, 0], [1, 2, 3]], [[1, 0, 1], [0, 0, 2]]]
    assert gpu_hits(dump) is None


def test_dumps_of_other_shapes_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    write_torch_file(path, {"something": 1})
    with pytest.raises(BadInput, match=f"{path}: not an expert-distribution dump"):
        read_dump(path)
    write_stat_dump(path, COUNTS, MASKS[:, :, :2])
    with pytest.raises(BadInput, match="differ in layers or experts"):
        read_dump(path)


@pytest.mark.parametrize("kind", ["json", "pt", "pt-bare", "pt-steps"])
def test_location_and_frequency_files_give_counts_per_layer(tmp_path: Path, kind: str) -> None:
    summed = COUNTS.sum(axis=0).astype(np.int64)
    if kind == "json":
        path = tmp_path / "loc.json"
        write_logical_count(path, summed)
        # One pass deep, as KT's loader wants it (SGLang's takes 2-D or 3-D).
        assert json.loads(path.read_text()) == {"logical_count": [summed.tolist()]}
    elif kind == "pt":
        path = tmp_path / "loc.pt"
        write_logical_count(path, summed)
    elif kind == "pt-bare":
        path = tmp_path / "bare.pt"
        write_torch_file(path, summed)  # torch.save(tensor): the tensor itself
    else:
        path = tmp_path / "dump.pt"
        write_stat_dump(path, COUNTS)
    assert read_logical_count(path).tolist() == summed.tolist()


def test_a_location_file_without_logical_count_says_what_to_give(tmp_path: Path) -> None:
    path = tmp_path / "loc.json"
    path.write_text('{"physical_to_logical_map": [[0, 1]]}')
    with pytest.raises(BadInput, match="no logical_count"):
        read_logical_count(path)


@pytest.mark.parametrize("bad", [np.nan, -3.0, np.inf])
def test_counts_that_are_nan_or_negative_are_refused_naming_the_file(
    tmp_path: Path, bad: float
) -> None:
    # A NaN cast to int64 is a huge negative number, and a map fitted from it (or from
    # negative counts) ranks experts by garbage; every .pt reader of counts refuses them.
    counts = np.ones((1, 2, 4), dtype=np.float32)
    counts[0, 1, 2] = bad
    path = tmp_path / "dump.pt"
    write_torch_file(path, {"logical_count": counts})
    for read in (read_dump, read_logical_count):
        with pytest.raises(BadInput, match=f"{path}: logical_count holds"):
            read(path)


def test_counts_that_add_up_past_int64_are_refused_not_wrapped(tmp_path: Path) -> None:
    # Two steps of 2^62 for expert 0: summed in int64 they wrapped negative, and fit-map ranked
    # the hottest expert coldest; a count past 2^63 raised out of the JSON reader.
    source = tmp_path / "counts.json"
    for counts, words in (
        ([[[2**62, 5, 1, 2]], [[2**62, 5, 1, 2]]], "adds up to 2^62 or more selections"),
        ([[[2**64, 5, 1, 2]]], "rectangular array of integers (each under 2^63)"),
    ):
        source.write_text(json.dumps({"logical_count": counts}), encoding="utf-8")
        done = run_cli("fit-map", str(source), "--top", "2", "-o", str(tmp_path / "map.json"))
        assert done.code == 2 and words in done.stderr, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "map.json").exists()
