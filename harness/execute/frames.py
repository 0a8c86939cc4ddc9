"""The tables a run leaves: requests and chunks frames, and its counters before, after and delta.

Frames of several pieces of one run (checkpoint segments, earlier boots) are joined with request
numbers made run-wide, so a resumed run's records read like those of one that ran straight.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from harness.drive.client import RequestResult
from harness.execute.resume import CheckpointState
from harness.formats.records import RUN_TABLE_COLUMNS
from harness.runtimes.counters import timings_columns


def requests_frame(results: list[RequestResult], cell: str, boot: int = 0) -> pd.DataFrame:
    """One row a request of one boot: identity, outcome, timings, and the server's own timings."""
    rows = []
    for index, r in enumerate(results):
        rows.append(
            {
                "request": index,
                "cell": cell,
                "boot": boot,
                "prompt_id": r.prompt_id,
                "domain": r.domain,
                "phase": r.phase,
                "phase_index": r.phase_index,
                "warmup": r.warmup,
                "ok": r.ok,
                "error": r.error,
                "first_after_boot": r.first_after_boot,
                "t_start_s": r.t_start_s,
                "scheduling_delay_s": r.scheduling_delay_s,
                "ttft_s": r.ttft_s,
                "e2el_s": r.e2el_s,
                "completion_tokens": r.completion_tokens,
                "prompt_tokens": r.prompt_tokens,
                "prompt_bytes": r.prompt_bytes,
                "target_prompt_tokens": r.target_prompt_tokens,
                "n_chunks": len(r.chunk_times_s),
                "output_text": r.output_text,
                "output_sha256": r.output_sha256,
                **timings_columns(r.server_timings),
                # Only where asked for (workload.logprobs): JSON, one entry a token.
                **({"logprobs": json.dumps(r.logprobs)} if r.logprobs else {}),
            }
        )
    if not rows:
        # A run that sent nothing (a command driver's): the columns readers check, no rows.
        return _empty_requests()
    return pd.DataFrame(rows)


def _empty_requests() -> pd.DataFrame:
    kinds = {"int": "int64", "bool": "bool", "number": "float64", "text": "object"}
    columns = RUN_TABLE_COLUMNS["requests.parquet"]
    return pd.DataFrame({name: pd.Series(dtype=kinds[kind]) for name, kind in columns.items()})


def chunks_frame(results: list[RequestResult]) -> pd.DataFrame:
    """One row a streamed chunk: its request, when it came and how many characters it held."""
    rows = [
        {"request": index, "chunk": k, "t_s": t, "chars": chars}
        for index, r in enumerate(results)
        for k, (t, chars) in enumerate(zip(r.chunk_times_s, r.chunk_chars, strict=True))
    ]
    if not rows:
        kinds = {"request": "int64", "chunk": "int64", "t_s": "float64", "chars": "int64"}
        return pd.DataFrame({name: pd.Series(dtype=kind) for name, kind in kinds.items()})
    return pd.DataFrame(rows, columns=["request", "chunk", "t_s", "chars"])


def numbered(frames: list[tuple[pd.DataFrame, pd.DataFrame]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Requests and chunks frames of several pieces joined, request numbers made run-wide."""
    requests, chunks, offset = [], [], 0
    for request_frame, chunk_frame in frames:
        request_frame = request_frame.copy()
        chunk_frame = chunk_frame.copy()
        if len(request_frame):  # a run that sent nothing has a frame with no columns
            request_frame["request"] = request_frame["request"].astype("int64") + offset
            chunk_frame["request"] = chunk_frame["request"].astype("int64") + offset
        offset += len(request_frame)
        requests.append(request_frame)
        chunks.append(chunk_frame)
    nonempty = [f for f in requests if len(f)]
    joined = pd.concat(nonempty, ignore_index=True) if nonempty else requests[0]
    parts = [f for f in chunks if len(f)]
    chunk_all = pd.concat(parts, ignore_index=True) if parts else chunks[0]
    return joined, chunk_all


def counters_record(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    swap_before: int | None,
    swap_after: int | None,
    previous: CheckpointState | None,
    unscored: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``counters.json`` of a run: counters before and after its scored workload, and the delta.

    The delta adds the new swap-out pages and, for a resumed run, what each earlier boot counted
    up to its last checkpoint; it leaves out ``unscored``, what the counters grew by while
    ``until_recovered`` extensions ran (kept beside it as ``unscored``).
    """
    delta = counter_delta(before, after)
    if unscored:
        for key, value in unscored.items():
            if key in delta:
                delta[key] -= value
    if swap_before is not None and swap_after is not None:
        delta["new_swapout_pages"] = swap_after - swap_before
    payload: dict[str, Any] = {"before": before, "after": after, "delta": delta}
    if unscored is not None:
        payload["unscored"] = unscored
    if previous is not None:
        # A resumed run: each earlier boot adds what it counted up to its last checkpoint.
        per_boot = []
        for earlier in previous.boots:
            if not earlier.segments:
                continue
            counted = counter_delta(earlier.counters_before, earlier.counters_last)
            if earlier.swap_before is not None and earlier.swap_last is not None:
                counted["new_swapout_pages"] = earlier.swap_last - earlier.swap_before
            per_boot.append({"boot": earlier.boot, "delta": counted})
            for key, value in counted.items():
                if key in delta:
                    delta[key] += value
        payload["earlier_boots"] = per_boot
    return payload


def counter_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float]:
    """How much each numeric counter grew; nothing when either scrape failed (a dead runtime)."""
    if before is None or after is None:
        return {}
    out = {}
    for key, value in after.items():
        if isinstance(value, int | float) and isinstance(before.get(key), int | float):
            out[key] = value - before[key]
    return out
