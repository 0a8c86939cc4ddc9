"""``vllm bench serve --save-result`` JSON (vllm/benchmarks/serve.py).

The saved object holds the run's summary — ``duration``, ``completed``, ``failed``,
``output_throughput``, and per selected metric ``mean_/median_/std_<m>_ms`` and
``p<q>_<m>_ms`` for ``ttft``, ``tpot``, ``itl``, ``e2el`` (percentiles from
``--metric-percentiles``, default 99) — and, with ``--save-detailed``, per request
``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (lists of s), ``generated_texts``,
``errors`` (and in newer versions ``start_times`` and ``latencies``). Without
``--save-detailed`` those lists are deleted before saving, and the block is summary-only.

Per-request data becomes ``requests.parquet``/``chunks.parquet``, so decode speed, TPOT
percentiles, TTFT and ITL are the harness's own (geomeans over requests, as for a driven run).
Summary-only, the tool's figures are used as they are: decode tok/s is 1000 / median TPOT
(the median request's speed, not the geomean), TTFT and E2EL are medians, and the statistics
have no per-request spread to bootstrap or to set drift thresholds from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.importers.common import (
    SourceBlock,
    file_sha256,
    number,
    read_json_file,
    request_frames,
)

FORMAT = "vllm"
_DETAILED = ("ttfts", "itls", "output_lens")
# Summary field -> catalog metric (the direct ones; decode speed is derived from median TPOT).
_SUMMARY = {
    "median_tpot_ms": "tpot_p50_ms",
    "p95_tpot_ms": "tpot_p95_ms",
    "p99_tpot_ms": "tpot_p99_ms",
    "median_ttft_ms": "ttft_ms",
    "median_e2el_ms": "e2el_ms",
    "p99_itl_ms": "itl_p99_ms",
    "output_throughput": "output_tok_s",
}
_IDENTITY = ("date", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
             "request_rate", "max_concurrency", "version", "dataset_name", "tag")  # fmt: skip


def _list(data: dict[str, Any], key: str, path: Path, n: int | None) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ResultFileError(f"{path}: {key}: must be a list (one entry per request)")
    if n is not None and len(value) != n:
        raise ResultFileError(f"{path}: {key}: {len(value)} entries, ttfts has {n}")
    return value


def read_vllm(path: Path) -> SourceBlock:
    """One ``vllm bench serve`` result file as a block."""
    data = read_json_file(path, "vLLM bench result")
    if not isinstance(data, dict) or "completed" not in data or "duration" not in data:
        raise ResultFileError(
            f"{path}: not a `vllm bench serve --save-result` file (no `completed`/`duration` "
            "fields); check the FORMAT given to harness import"
        )
    return read_result(data, path, FORMAT, _SUMMARY, "--save-detailed")


# More requests than any benchmark client sends in a run: a count past it is a damaged file
# (`completed: 10**30` was imported, and every rate drawn from it).
_MAX_REQUESTS = 10**9


def _count(value: object, where: str) -> int:
    """A request count: a whole, non-negative number no client could exceed."""
    count = number(value, where, non_negative=True)
    if count != int(count) or count > _MAX_REQUESTS:
        raise ResultFileError(
            f"{where}: must be a whole number of requests up to {_MAX_REQUESTS:,}, "
            f"got {value!r:.40}"
        )
    return int(count)


def read_result(
    data: dict[str, Any], path: Path, fmt: str, summary: dict[str, str], detail_flag: str
) -> SourceBlock:
    """A vLLM-style result object (vLLM's and SGLang's clients save the same shape): the
    summary fields named by ``summary`` and, when saved, the per-request lists."""
    wanted = {metric: field for field, metric in summary.items()}
    wanted["decode_tok_s"] = f"median_tpot_ms (or ttfts/itls/output_lens with {detail_flag})"
    block = SourceBlock(path=path, format=fmt, sha256=file_sha256(path), wanted=wanted)
    block.identity = {k: data[k] for k in _IDENTITY if k in data and data[k] is not None}
    for source, metric in summary.items():
        if data.get(source) is not None:
            # Times and throughputs: a zero or negative figure is no measurement.
            block.metrics[metric] = number(data[source], f"{path}: {source}", positive=True)
            block.fields[metric] = source
    # The run's length: a zero or negative duration is no run (SGLang's `duration: -42` was
    # imported as if measured).
    number(data.get("duration"), f"{path}: duration", positive=True)
    completed = _count(data.get("completed"), f"{path}: completed")
    failed = _count(data.get("failed", 0) or 0, f"{path}: failed")
    block.failed, block.sent, block.failed_field = failed, completed + failed, "failed"
    if completed == 0 and failed == 0:
        raise ResultFileError(f"{path}: completed is 0: the run measured no request")
    present = [k for k in _DETAILED if k in data]
    if present and len(present) < len(_DETAILED):
        lacking = [k for k in _DETAILED if k not in data]
        raise ResultFileError(f"{path}: {', '.join(lacking)}: missing beside {present[0]}")
    if present:
        _read_detailed(data, path, block)
        return block
    tpot = block.metrics.get("tpot_p50_ms")
    if tpot is not None and tpot > 0:
        block.metrics["decode_tok_s"] = 1000.0 / tpot
        block.fields["decode_tok_s"] = "1000 / median_tpot_ms"
    block.notes.append(
        f"summary-only (saved without {detail_flag}): decode tok/s is 1000 / median TPOT and "
        "TTFT/E2EL are medians, not geomeans over requests; no per-request spread, so no "
        "prompt-level bootstrap and no within-block noise for the drift flags"
    )
    return block


# Tokens one request may hold, far above any context window: a count past it (1e308 once) is a
# damaged file, not a request, and would be allocated per token.
MAX_TOKENS = 10_000_000


def _tokens(value: Any, where: str) -> int:
    count = number(value, where, non_negative=True)
    if count > MAX_TOKENS or count != int(count):
        raise ResultFileError(f"{where}: {count:g} is no token count (0..{MAX_TOKENS:,})")
    return int(count)


def _read_detailed(data: dict[str, Any], path: Path, block: SourceBlock) -> None:
    ttfts = _list(data, "ttfts", path, None)
    n = len(ttfts)
    itls = _list(data, "itls", path, n)
    outs = _list(data, "output_lens", path, n)
    errors = _list(data, "errors", path, n) if "errors" in data else [""] * n
    ok = [not e for e in errors]
    erred = ok.count(False)
    if erred > block.failed:  # the per-request errors, where the summary says fewer
        block.failed, block.sent, block.failed_field = erred, n, "errors"
    ttft = [
        number(v, f"{path}: ttfts[{i}]", non_negative=True) if ok[i] else 0.0
        for i, v in enumerate(ttfts)
    ]
    gaps: list[list[float]] = []
    for i, row in enumerate(itls):
        if not isinstance(row, list):
            raise ResultFileError(f"{path}: itls[{i}]: must be a list of seconds")
        gaps.append(
            [number(g, f"{path}: itls[{i}][{j}]", non_negative=True) for j, g in enumerate(row)]
        )
    lens = [_tokens(v, f"{path}: output_lens[{i}]") for i, v in enumerate(outs)]
    prompt = None
    if "input_lens" in data:
        raw = _list(data, "input_lens", path, n)
        prompt = [_tokens(v, f"{path}: input_lens[{i}]") for i, v in enumerate(raw)]
    e2el = None
    if "latencies" in data:
        raw = _list(data, "latencies", path, n)
        e2el = [
            number(v, f"{path}: latencies[{i}]", non_negative=True) if ok[i] else 0.0
            for i, v in enumerate(raw)
        ]
    start = None
    if "start_times" in data:
        raw = _list(data, "start_times", path, n)
        start = [number(v, f"{path}: start_times[{i}]") for i, v in enumerate(raw)]
    texts = _list(data, "generated_texts", path, n) if "generated_texts" in data else None
    block.requests, block.chunks = request_frames(
        ttft,
        gaps,
        lens,
        ok=ok,
        prompt_lens=prompt,
        e2el_s=e2el,
        start_s=start,
        errors=[str(e or "") for e in errors],
        texts=[str(t or "") for t in texts] if texts is not None else None,
    )
    # The harness computes these itself from the requests; the tool's medians are not kept
    # beside them, so one name never holds two definitions.
    for metric in ("tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms", "ttft_ms", "e2el_ms",
                   "itl_p99_ms"):  # fmt: skip
        block.metrics.pop(metric, None)
        block.fields.pop(metric, None)
