"""AIPerf ``profile_export_aiperf.json``: the aggregated statistics of one ``aiperf profile``.

Each metric is an object ``{"unit", "avg", "p50", "p95", "p99", "min", "max", "std"…}``:
``time_to_first_token`` and ``request_latency`` (ms), ``inter_token_latency`` (ms; AIPerf's
per-request (latency − TTFT)/(OSL − 1), our TPOT), ``output_token_throughput`` (tokens/sec,
``avg`` only), ``output_token_throughput_per_user``; beside them ``benchmark_duration``,
``request_count``, ``start_time``, ``end_time`` and ``input_config`` (model, endpoint, load).
Per-request records live in a separate ``profile_export.jsonl``, not read here: a block is
summary-only, decode tok/s being 1000 / median inter-token latency, as for vLLM's summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.importers.common import SourceBlock, file_sha256, number, read_json_file

FORMAT = "aiperf"
# (AIPerf metric, statistic, unit) -> catalog metric
_STATS = {
    ("inter_token_latency", "p50", "ms"): "tpot_p50_ms",
    ("inter_token_latency", "p95", "ms"): "tpot_p95_ms",
    ("inter_token_latency", "p99", "ms"): "tpot_p99_ms",
    ("time_to_first_token", "p50", "ms"): "ttft_ms",
    ("request_latency", "p50", "ms"): "e2el_ms",
    ("output_token_throughput", "avg", "tokens/sec"): "output_tok_s",
}


def _count(data: dict[str, Any], name: str, path: Path) -> int | None:
    """An AIPerf count metric (``{"unit": "requests", "avg": N}``), or None when absent."""
    entry = data.get(name)
    if entry is None:
        return None
    value = entry.get("avg") if isinstance(entry, dict) else entry
    return int(number(value, f"{path}: {name}", non_negative=True))


def _failures(data: dict[str, Any], path: Path) -> tuple[int, int | None]:
    """(errored requests, requests sent): AIPerf writes ``error_request_count`` only when some
    request errored (a timeout cancels and counts there), beside ``request_count``, the ones
    that completed."""
    cancelled = data.get("was_cancelled")
    if cancelled is True:
        raise ResultFileError(
            f"{path}: was_cancelled is true: the profile was stopped before it finished, so its "
            "figures are of part of the requests it was asked for"
        )
    errors = _count(data, "error_request_count", path) or 0
    if cancelled not in (None, False):
        errors += _count(data, "was_cancelled", path) or 0
    completed = _count(data, "request_count", path)
    return errors, None if completed is None else completed + errors


def read_aiperf(path: Path) -> SourceBlock:
    """One ``profile_export_aiperf.json`` as a block (summary-only)."""
    data = read_json_file(path, "AIPerf profile export")
    if not isinstance(data, dict) or not any(
        isinstance(data.get(k), dict) and "unit" in data[k] for k in ("request_latency",
                                                                       "time_to_first_token")
    ):  # fmt: skip
        raise ResultFileError(
            f"{path}: not an AIPerf profile_export_aiperf.json (no request_latency or "
            "time_to_first_token statistics); check the FORMAT given to harness import"
        )
    block = SourceBlock(path=path, format=FORMAT, sha256=file_sha256(path))
    for (name, stat, unit), metric in _STATS.items():
        block.wanted[metric] = f"{name}.{stat}"
        entry: Any = data.get(name)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ResultFileError(f"{path}: {name}: must be an object of statistics")
        if entry.get(stat) is None:
            continue
        if entry.get("unit") != unit:
            raise ResultFileError(f"{path}: {name}.unit: {entry.get('unit')!r}, expected {unit!r}")
        block.metrics[metric] = number(entry[stat], f"{path}: {name}.{stat}", positive=True)
        block.fields[metric] = f"{name}.{stat}"
    block.failed, block.sent = _failures(data, path)
    block.failed_field = "error_request_count, was_cancelled"
    tpot = block.metrics.get("tpot_p50_ms")
    block.wanted["decode_tok_s"] = "inter_token_latency.p50"
    if tpot is not None:
        block.metrics["decode_tok_s"] = 1000.0 / tpot
        block.fields["decode_tok_s"] = "1000 / inter_token_latency.p50"
    raw_config = data.get("input_config")
    config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    raw_endpoint = config.get("endpoint")
    endpoint: dict[str, Any] = raw_endpoint if isinstance(raw_endpoint, dict) else {}
    block.identity = {
        k: v
        for k, v in {
            "start_time": data.get("start_time"),
            "end_time": data.get("end_time"),
            "model_names": endpoint.get("model_names"),
            "cli_command": config.get("cli_command"),
        }.items()
        if v is not None
    }
    block.notes.append(
        "summary-only (AIPerf aggregate): decode tok/s is 1000 / median inter-token latency, "
        "TTFT and E2EL are medians; per-request records (profile_export.jsonl) are not read"
    )
    return block
