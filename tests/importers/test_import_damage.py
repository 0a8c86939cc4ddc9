"""Damaged results files give only our errors (exit 2 material), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import BadInput
from harness.importers.write import read_source

FIXTURES = Path(__file__).parent.parent / "data" / "importers"


def _vllm(tmp_path: Path) -> Path:
    path = tmp_path / "v.json"
    data = {"duration": 1.0, "completed": 2, "median_tpot_ms": 10.0, "output_throughput": 5.0,
            "ttfts": [0.1, 0.2], "itls": [[0.01, 0.01], [0.02]], "output_lens": [3, 2],
            "errors": ["", ""]}  # fmt: skip
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _ds4(tmp_path: Path) -> Path:
    path = tmp_path / "d.csv"
    header = (FIXTURES / "ds4-header-40.csv").read_text(encoding="utf-8")
    path.write_text(header, encoding="utf-8")
    return path


SOURCES = {
    "vllm": _vllm,
    "ds4": _ds4,
    "aiperf": lambda t: FIXTURES / "aiperf-profile_export_aiperf.json",
    "knee": lambda t: FIXTURES / "knee.json",
    "llama-bench": lambda t: FIXTURES / "llama-bench.json",
    "sglang": lambda t: _one_sglang(t),
}


def _one_sglang(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    lines = (FIXTURES / "sglang-bench_serving.jsonl").read_text(encoding="utf-8").splitlines()
    path.write_text(lines[0] + "\n", encoding="utf-8")
    return path


def _mutations(data: bytes) -> list[bytes]:
    return [
        data[: len(data) // 2],
        b"",
        b"\xff\xfe" + data,
        data.replace(b",", b"\x00", 1),
        data.replace(b"1", b"9" * 5000, 1),
        data.replace(b"0.", b'"x', 1),
        b"[" * 100_000,
        data.replace(b"{", b"[", 1),
    ]


@pytest.mark.parametrize("fmt", list(SOURCES))
def test_every_mutation_is_bad_input_or_reads(tmp_path: Path, fmt: str) -> None:
    original = SOURCES[fmt](tmp_path).read_bytes()
    read_source(fmt, SOURCES[fmt](tmp_path))  # the unmutated file reads
    for index, data in enumerate(_mutations(original)):
        path = tmp_path / f"m{index}{SOURCES[fmt](tmp_path).suffix}"
        path.write_bytes(data)
        try:
            read_source(fmt, path)
        except BadInput as exc:
            assert str(path) in exc.message, exc.message


@pytest.mark.parametrize("bad", [1e308, 2.5, 10**12])
def test_a_token_count_no_request_holds_is_bad_input_not_an_allocation(
    tmp_path: Path, bad: float
) -> None:
    path = _vllm(tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["output_lens"] = [3, bad]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BadInput, match=r"output_lens\[1\]: .* is no token count"):
        read_source("vllm", path)
