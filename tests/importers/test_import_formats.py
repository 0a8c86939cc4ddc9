"""AIPerf, SGLang and knee-JSON imports, from fixtures written to each tool's documented format."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.errors import ResultFileError
from harness.importers.write import read_source
from tests.importers.test_import import _cli, _labels, _mapping

FIXTURES = Path(__file__).parent.parent / "data" / "importers"


def _aiperf(data: Any, speed: float) -> str:
    for name in ("inter_token_latency", "request_latency"):
        data[name] = {k: (v / speed if k != "unit" else v) for k, v in data[name].items()}
    data["output_token_throughput"]["avg"] *= speed
    return json.dumps(data)


def _sglang(lines: Any, speed: float) -> str:
    out = []
    for run in lines:
        run["median_tpot_ms"] /= speed
        run["output_throughput"] *= speed
        out.append(json.dumps(run))
    return "\n".join(out) + "\n"


def _knee(data: Any, speed: float) -> str:
    data["rows"] = [[c, agg * speed, user * speed] for c, agg, user in data["rows"]]
    return json.dumps(data)


def _load(name: str) -> Any:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


CASES: dict[str, tuple[str, Callable[[Any, float], str], str]] = {
    "aiperf": ("aiperf-profile_export_aiperf.json", _aiperf, ""),
    "sglang": ("sglang-bench_serving.jsonl", _sglang, "select: {max_concurrency: 8}"),
    "knee": ("knee.json", _knee, "select: {C: 8}"),
}


@pytest.mark.parametrize("fmt", list(CASES))
def test_an_abba_of_each_format_is_decided(tmp_path: Path, fmt: str) -> None:
    fixture, scale, select = CASES[fmt]
    rng = np.random.default_rng(3)
    folder = tmp_path / "files"
    folder.mkdir()
    files = []
    for cycle, order in enumerate(["ABBA", "BAAB", "ABBA"]):
        for slot, arm in enumerate(order):
            cell = "stale" if arm == "A" else "seed"
            speed = (1.0 if arm == "A" else 1.15) * float(rng.normal(1, 0.01))
            path = folder / f"{cell}-c{cycle}-s{slot}.json"
            path.write_text(scale(_load(fixture), speed), encoding="utf-8")
            files.append(path)
    extra = dict([select.split(": ", 1)]) if select else {}
    mapping = _mapping(tmp_path / "m.yaml", **extra)
    code, text = _cli(
        "import", fmt, *map(str, files), "--map", str(mapping), "-o", str(tmp_path / "o")
    )
    assert code == 0, text
    labels = _labels(tmp_path / "o")
    assert labels[("seed", "decode_tok_s")][0] == "better"
    assert labels[("seed", "decode_tok_s")][1] == pytest.approx(1.15, rel=0.03)
    assert ("seed", "output_tok_s") in labels


def test_aiperf_fields_are_read_with_their_units(tmp_path: Path) -> None:
    block = read_source("aiperf", FIXTURES / "aiperf-profile_export_aiperf.json")
    assert block.summary_only
    assert block.metrics["tpot_p50_ms"] == 51.98 and block.metrics["ttft_ms"] == 787.5439584999999
    assert block.metrics["decode_tok_s"] == pytest.approx(1000 / 51.98)
    assert block.identity["model_names"] == ["openai/gpt-oss-20b"]
    data = _load("aiperf-profile_export_aiperf.json")
    data["time_to_first_token"]["unit"] = "s"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(
        ResultFileError, match=r"bad.json: time_to_first_token.unit: 's', expected 'ms'"
    ):
        read_source("aiperf", bad)


def test_sglang_several_runs_need_select(tmp_path: Path) -> None:
    path = FIXTURES / "sglang-bench_serving.jsonl"
    with pytest.raises(ResultFileError, match="2 runs in the file; name one with `select`"):
        read_source("sglang", path)
    block = read_source("sglang", path, {"max_concurrency": 16})
    assert block.metrics["output_tok_s"] == 610.0 and block.metrics["tpot_p50_ms"] == 24.9
    with pytest.raises(ResultFileError, match="select: no row has max_concurrency=3"):
        read_source("sglang", path, {"max_concurrency": 3})


def test_knee_rows_and_c1(tmp_path: Path) -> None:
    block = read_source("knee", FIXTURES / "knee.json", {"C": 1})
    assert block.metrics == {"decode_tok_s": 48.2, "output_tok_s": 48.2, "c1_tok_s": 48.2}
    block = read_source("knee", FIXTURES / "knee.json")
    assert "c1_tok_s" in block.metrics and block.identity["tag"] == "moe-lane-stale"
    bad = tmp_path / "k.json"
    bad.write_text('{"tag": "x", "rows": [[1, 2]], "ts": 0}', encoding="utf-8")
    with pytest.raises(ResultFileError, match=r"k.json: rows\[0\]: must be"):
        read_source("knee", bad)
