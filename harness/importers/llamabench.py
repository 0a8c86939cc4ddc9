"""llama-bench ``-o json`` (a JSON array of tests) or ``-o jsonl`` (one test per line).

Each test object carries the build (``build_commit``, ``build_number``), the model
(``model_filename``, ``model_type``), the settings (``n_threads``, ``n_gpu_layers``…), the test
(``n_prompt``, ``n_gen``, ``n_depth``) and its speed over ``-r`` repetitions (``avg_ts``,
``stddev_ts``, ``samples_ts``). A prompt-processing test (``n_prompt`` > 0, ``n_gen`` = 0)
gives prefill tok/s, a generation test (``n_gen`` > 0, ``n_prompt`` = 0) decode tok/s, each
``avg_ts`` (geomean over the selected tests of that kind). llama-bench keeps no per-request
data, so a block is summary-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.formats.bench_table import parse_result_rows
from harness.formats.textfile import read_text
from harness.importers.common import SourceBlock, file_sha256
from harness.importers.tables import Selector, add_metric, select_rows

FORMAT = "llama-bench"
_NEEDED = ("n_prompt", "n_gen", "avg_ts")
_IDENTITY = ("build_commit", "build_number", "model_filename", "model_type", "backends",
             "cpu_info", "gpu_info", "n_threads", "n_gpu_layers", "test_time")  # fmt: skip


def _tests(path: Path) -> list[dict[str, Any]]:
    text = read_text(path, ResultFileError, "llama-bench output")
    data = parse_result_rows(text, "json", str(path), ResultFileError)
    if not data:
        raise ResultFileError(
            f"{path}: not llama-bench `-o json`/`-o jsonl` output (a list of test objects); "
            "check the FORMAT given to harness import"
        )
    for index, test in enumerate(data):
        lacking = [k for k in _NEEDED if k not in test]
        if lacking:
            raise ResultFileError(f"{path}: test {index}: {', '.join(lacking)}: missing")
    return data


def read_llama_bench(path: Path, select: Selector | None = None) -> SourceBlock:
    """One llama-bench output file as a block (summary-only)."""
    tests = _tests(path)
    columns = {k for t in tests for k in t}
    kept = select_rows(tests, select or {}, path, columns)
    block = SourceBlock(path=path, format=FORMAT, sha256=file_sha256(path))
    first = kept[0]
    block.identity = {k: first[k] for k in _IDENTITY if k in first}

    def prompt_only(t: dict[str, Any]) -> bool:
        return bool(t.get("n_prompt")) and not t.get("n_gen")

    def gen_only(t: dict[str, Any]) -> bool:
        return bool(t.get("n_gen")) and not t.get("n_prompt")

    add_metric(block, kept, "avg_ts", "prefill_tok_s", where=" test ", include=prompt_only)
    add_metric(block, kept, "avg_ts", "decode_tok_s", where=" test ", include=gen_only)
    block.wanted["prefill_tok_s"] = "avg_ts of a prompt test (-p N, n_gen 0)"
    block.wanted["decode_tok_s"] = "avg_ts of a generation test (-n N, n_prompt 0)"
    block.notes.append(
        "summary-only (llama-bench): decode and prefill tok/s are llama-bench's avg_ts over its "
        "repetitions; no per-request data, so no TPOT percentiles, TTFT or ITL"
    )
    return block
