"""llama-bench ``-o json`` (a JSON array of tests) or ``-o jsonl`` (one test per line).

Each test object carries the build (``build_commit``, ``build_number``), the model
(``model_filename``, ``model_type``), the settings (``n_threads``, ``n_gpu_layers``…), the test
(``n_prompt``, ``n_gen``, ``n_depth``) and its speed over ``-r`` repetitions (``avg_ts``,
``stddev_ts``, ``samples_ts``). A prompt-processing test (``n_prompt`` > 0, ``n_gen`` = 0)
gives prefill tok/s, a generation test (``n_gen`` > 0, ``n_prompt`` = 0) decode tok/s, each
``avg_ts`` (geomean over the selected tests of that kind). llama-bench keeps no per-request
data, so a block is summary-only. The placement a test ran with (``n_gpu_layers``,
``n_cpu_moe``, ``tensor_buft_overrides``, ``load_mode``; the fields its build writes) is kept
in the block's identity.

One file may hold several arms: ``llama-bench -ncmoe 0,16,16,0`` runs its tests for the four
settings in that order (reloading the model when the setting changes).
:func:`read_llama_bench_blocks` splits a file's tests into those blocks (``harness import
--cells-by n_cpu_moe``).
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
             "cpu_info", "gpu_info", "n_threads", "n_gpu_layers", "n_cpu_moe",
             "tensor_buft_overrides", "load_mode", "test_time")  # fmt: skip


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


def _block(path: Path, sha256: str, kept: list[dict[str, Any]]) -> SourceBlock:
    block = SourceBlock(path=path, format=FORMAT, sha256=sha256)
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


def read_llama_bench(path: Path, select: Selector | None = None) -> SourceBlock:
    """One llama-bench output file as a block (summary-only)."""
    tests = _tests(path)
    columns = {k for t in tests for k in t}
    kept = select_rows(tests, select or {}, path, columns)
    return _block(path, file_sha256(path), kept)


def read_llama_bench_blocks(
    path: Path, field: str, select: Selector | None = None
) -> list[tuple[str, int, SourceBlock]]:
    """The file's selected tests as llama-bench ran them, one block per test instance set:
    (the ``field`` value, the model load it ran in, the block), in file order.

    A block ends where ``field`` changes or a test repeats one already in the block (``-ncmoe
    16,16`` runs the same tests twice in a row); llama-bench reloads the model only when the
    placement changes, so the load number counts the changes of ``field``.
    """
    tests = _tests(path)
    columns = {k for t in tests for k in t}
    if field not in columns:
        raise ResultFileError(
            f"{path}: --cells-by {field}: no test has that field; the file has "
            f"{', '.join(sorted(columns))}"
        )
    kept = select_rows(tests, select or {}, path, columns)
    sha256 = file_sha256(path)
    runs: list[tuple[str, int, list[dict[str, Any]]]] = []
    seen: set[tuple[Any, ...]] = set()
    load = -1
    for index, test in enumerate(kept):
        if field not in test:
            raise ResultFileError(f"{path}: test {index}: {field}: missing")
        value = str(test[field])
        shape = (test.get("n_prompt"), test.get("n_gen"), test.get("n_depth"))
        changed = not runs or runs[-1][0] != value
        if changed or shape in seen:
            load += changed
            runs.append((value, load, []))
            seen = set()
        seen.add(shape)
        runs[-1][2].append(test)
    return [(value, load, _block(path, sha256, rows)) for value, load, rows in runs]
