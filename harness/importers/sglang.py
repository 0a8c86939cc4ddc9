"""SGLang ``python -m sglang.bench_serving --output-file F`` JSONL (bench_serving.py).

Each run appends one JSON object per line: the run's settings (``backend``, ``dataset_name``,
``request_rate``, ``max_concurrency``…), its summary (``duration``, ``completed``,
``output_throughput``, ``median_ttft_ms``, ``median_tpot_ms``, ``p99_tpot_ms``,
``median_e2e_latency_ms``, ``p99_itl_ms``…) and, with ``--output-details``, the per-request
``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``generated_texts``, ``errors`` in vLLM's
shape. One file is one block: a file holding several runs needs ``select`` in the mapping
(``select: {max_concurrency: 8}``) to name one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.formats.textfile import parse_json, read_text
from harness.importers.common import SourceBlock
from harness.importers.tables import Selector, select_rows
from harness.importers.vllm import read_result

FORMAT = "sglang"
_SUMMARY = {
    "median_tpot_ms": "tpot_p50_ms",
    "p95_tpot_ms": "tpot_p95_ms",
    "p99_tpot_ms": "tpot_p99_ms",
    "median_ttft_ms": "ttft_ms",
    "median_e2e_latency_ms": "e2el_ms",
    "p99_itl_ms": "itl_p99_ms",
    "output_throughput": "output_tok_s",
}


def read_sglang(path: Path, select: Selector | None = None) -> SourceBlock:
    """One run of an SGLang bench_serving JSONL file as a block."""
    text = read_text(path, ResultFileError, "SGLang bench_serving output")
    runs: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        run = parse_json(line, str(path), ResultFileError, first_line=number)
        if not isinstance(run, dict) or "completed" not in run or "duration" not in run:
            raise ResultFileError(
                f"{path}:{number}: not an SGLang bench_serving result (no `completed`/"
                "`duration`); check the FORMAT given to harness import"
            )
        runs.append(run)
    if not runs:
        raise ResultFileError(f"{path}: empty; bench_serving writes one JSON object per run")
    kept = select_rows(runs, select or {}, path, {k for r in runs for k in r})
    if len(kept) > 1:
        raise ResultFileError(
            f"{path}: {len(kept)} runs in the file; name one with `select` in the mapping "
            "(e.g. select: {max_concurrency: 8})"
        )
    return read_result(kept[0], path, FORMAT, _SUMMARY, "--output-details")
