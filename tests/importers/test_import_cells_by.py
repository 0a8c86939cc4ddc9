"""``harness import llama-bench --cells-by n_cpu_moe``: one llama-bench file holding several
placements, split into cells, and the placement kept in each block's identity.

The fixture (tests/data/importers/llama-bench-ncmoe.json) is ``llama-bench -ncmoe 0,16,16,0
-p 64 -n 32 -r 3 -o json`` written in the layout and fields of llama-cpp-python 0.3.36's
llama-bench (its json_printer; `n_cpu_moe` exists there, not in 0.3.16's), with made-up figures
(no GPU here to run it): each setting's pp64 then tg32 test, avg_ts the mean of samples_ts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.formats.records import CampaignDir, read_json
from harness.importers.llamabench import read_llama_bench_blocks
from tests.importers.test_import import FIXTURES, _cli, _labels

NCMOE = FIXTURES / "llama-bench-ncmoe.json"


def _mapping(path: Path, control: str = "n_cpu_moe-0") -> Path:
    path.write_text(
        f"campaign: ncmoe\nbox: h200\ncontrol: {control}\n"
        "gates: [{kind: better, metric: decode_tok_s}]\n",
        encoding="utf-8",
    )
    return path


def test_a_repeated_setting_is_two_blocks_of_one_model_load() -> None:
    blocks = read_llama_bench_blocks(NCMOE, "n_cpu_moe")
    assert [(value, load) for value, load, _ in blocks] == [
        ("0", 0),
        ("16", 1),
        ("16", 1),
        ("0", 2),
    ]
    decode = [block.metrics["decode_tok_s"] for _, _, block in blocks]
    assert decode == pytest.approx([171.3, 98.4, 97.9, 170.6])
    first = blocks[1][2]
    assert first.identity["n_cpu_moe"] == 16 and first.identity["n_gpu_layers"] == 99
    assert first.identity["tensor_buft_overrides"] == "none"
    assert first.metrics["prefill_tok_s"] == pytest.approx(2890.6)


def test_a_real_llama_bench_file_splits_the_same_way() -> None:
    # Real 0.3.36 output (this CPU): a repeated setting's tests follow each other, pp then tg.
    real = FIXTURES / "llama-bench-ncmoe-cpu.json"
    blocks = read_llama_bench_blocks(real, "n_cpu_moe")
    assert [(value, load) for value, load, _ in blocks] == [("0", 0), ("2", 1), ("2", 1), ("0", 2)]
    assert all(set(block.metrics) == {"prefill_tok_s", "decode_tok_s"} for _, _, block in blocks)
    fixture = json.loads(NCMOE.read_text())[0]
    first = json.loads(real.read_text())[0]
    assert fixture.keys() == first.keys()  # the made-up file has the real one's fields
    assert {k: type(v) for k, v in fixture.items()} == {k: type(v) for k, v in first.items()}


def test_one_file_is_one_mirrored_cycle_and_its_placement_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "imported"
    code, text = _cli("import", "llama-bench", str(NCMOE), "--cells-by", "n_cpu_moe",
                      "--map", str(_mapping(tmp_path / "m.yaml")), "-o", str(out))  # fmt: skip
    assert code == 0, text
    assert "imported 4 runs (1 cycles, 4 summary-only)" in text
    runs = CampaignDir(out).plan()["runs"]
    assert [(r["cell"], r["slot"], r["arm"]) for r in runs] == [
        ("n_cpu_moe-0", 0, "A"), ("n_cpu_moe-16", 1, "B"), ("n_cpu_moe-16", 2, "B"),
        ("n_cpu_moe-0", 3, "A"),
    ]  # fmt: skip
    records = [read_json(out / "runs" / r["run_id"] / "run.json") for r in runs]
    assert [r["runtime"]["identity"]["n_cpu_moe"] for r in records] == [0, 16, 16, 0]
    # The two middle blocks ran on one model load; the outer ones each loaded it again.
    boots = [r["boot_id"] for r in records]
    assert boots[1] == boots[2] and len(set(boots)) == 3
    imported = json.loads((out / "runs" / runs[1]["run_id"] / "imported.json").read_text())
    assert imported["metrics"]["decode_tok_s"] == pytest.approx(98.4)
    (cell, label) = next((k, v) for k, v in _labels(out).items() if k[1] == "decode_tok_s")
    assert cell[0] == "n_cpu_moe-16"
    ratio = (98.4 * 97.9) ** 0.5 / (171.3 * 170.6) ** 0.5
    assert label[1] == pytest.approx(ratio, rel=1e-6)


def test_blocks_that_are_not_mirrored_cycles_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = json.loads(NCMOE.read_text())
    three = tmp_path / "three.json"
    three.write_text(json.dumps(rows[:6]))
    mapping = str(_mapping(tmp_path / "m.yaml"))
    out = str(tmp_path / "o")

    def refused(*argv: str) -> str:
        code, _ = _cli("import", "llama-bench", *argv, "--map", mapping, "-o", out)
        assert code == 2
        return capsys.readouterr().err

    assert "3 blocks (0, 16, 16); a mirrored cycle is four" in refused(
        str(three), "--cells-by", "n_cpu_moe"
    )
    assert "--cells-by n_cpu_mo: no test has that field" in refused(
        str(NCMOE), "--cells-by", "n_cpu_mo"
    )
    err = refused(str(NCMOE))
    assert "give `files` or `pattern`" in err and "--cells-by FIELD" in err
