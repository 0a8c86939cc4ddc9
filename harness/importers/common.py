"""What every format reader returns, and the checks they share.

A reader turns one results file of another tool into a :class:`SourceBlock`: the metrics that
tool reported (named as in :data:`harness.catalog.METRICS`, with the field each came from), the
per-request rows when the file holds them (so the harness computes its own metrics from them,
exactly as for a run it drove), the file's SHA-256 and what the file says about the build.
A file of the wrong format, or a field of the wrong type, is a :class:`ResultFileError` naming
the file and the field.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.errors import ResultFileError
from harness.formats.textfile import parse_json, read_bytes, read_text

__all__ = [
    "REQUEST_METRICS",
    "SourceBlock",
    "file_sha256",
    "geomean",
    "number",
    "read_json_file",
    "request_frames",
]

# Metrics the analysis computes itself from per-request rows (analyze/metrics.py); a file with
# per-request data provides these whatever its summary says.
REQUEST_METRICS = frozenset(
    {
        "decode_tok_s",
        "c1_tok_s",
        "tpot_p50_ms",
        "tpot_p95_ms",
        "tpot_p99_ms",
        "ttft_ms",
        "e2el_ms",
        "itl_p99_ms",
        "first_request_tok_s",
    }
)


@dataclass
class SourceBlock:
    """One imported results file: one block of one arm (one boot)."""

    path: Path
    format: str
    sha256: str
    # Catalog metric -> value as the tool reported it, and the field(s) it was read from.
    metrics: dict[str, float] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    # Where a metric would have come from when the file lacks it (for the error naming it).
    wanted: dict[str, str] = field(default_factory=dict)
    requests: pd.DataFrame | None = None  # per-request rows (records.RUN_TABLE_COLUMNS)
    chunks: pd.DataFrame | None = None
    identity: dict[str, Any] = field(default_factory=dict)  # build, model, date, as the file says
    notes: list[str] = field(default_factory=list)  # how summary figures differ from ours
    # Requests the tool says failed or were cancelled, of how many it sent (None: not said),
    # and the fields that said so: a block is the cell's measurement only if they ran.
    failed: int = 0
    sent: int | None = None
    failed_field: str = ""

    @property
    def summary_only(self) -> bool:
        """True when the file holds no per-request data: only the tool's own summary."""
        return self.requests is None

    def provides(self, metric: str) -> bool:
        """Whether this block yields ``metric`` (from its requests or the tool's summary)."""
        if metric in self.metrics:
            return True
        return not self.summary_only and metric in REQUEST_METRICS

    def missing_field(self, metric: str) -> str:
        """The source field that would have given ``metric`` (for a missing-field error)."""
        return self.wanted.get(metric, f"(none: {self.format} files do not report {metric})")


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    return hashlib.sha256(read_bytes(path, ResultFileError, "results file")).hexdigest()


def read_json_file(path: Path, what: str) -> Any:
    """A JSON document, every failure a ResultFileError naming the file."""
    return parse_json(read_text(path, ResultFileError, what), str(path), ResultFileError)


def number(value: Any, where: str, *, positive: bool = False, non_negative: bool = False) -> float:
    """``value`` as a finite float, or a ResultFileError naming ``where`` (file: field).

    ``non_negative`` for a duration or a count: a negative one is a damaged file, not data."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResultFileError(f"{where}: must be a number, got {value!r:.40}")
    try:
        result = float(value)
    except OverflowError:
        raise ResultFileError(f"{where}: number too large") from None
    if not math.isfinite(result) or (positive and result <= 0):
        raise ResultFileError(f"{where}: must be a finite{' positive' if positive else ''} number")
    if non_negative and result < 0:
        raise ResultFileError(
            f"{where}: must not be negative (a duration or a count), got {result}"
        )
    return result


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of the positive finite values, or None when there are none."""
    array = np.asarray([v for v in values if math.isfinite(v) and v > 0], dtype=float)
    if array.size == 1:
        return float(array[0])  # exactly the value the file holds, not exp(log(x))
    return float(np.exp(np.mean(np.log(array)))) if array.size else None


def request_frames(
    ttft_s: Sequence[float],
    itls_s: Sequence[Sequence[float]],
    output_lens: Sequence[int],
    *,
    ok: Sequence[bool],
    prompt_lens: Sequence[int] | None = None,
    e2el_s: Sequence[float] | None = None,
    start_s: Sequence[float] | None = None,
    errors: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``requests.parquet`` and ``chunks.parquet`` rows from per-request timings.

    The first chunk arrives at TTFT and each inter-token gap adds one chunk, so the chunk table
    gives the analysis the tool's own ITLs; E2EL is the tool's latency when it saved one, else
    TTFT plus the gaps (what vLLM's completions client measures as latency).
    """
    import hashlib as _hashlib

    n = len(ttft_s)
    rows: list[dict[str, Any]] = []
    chunk_rows: list[dict[str, Any]] = []
    clock = 0.0
    for i in range(n):
        gaps = [float(g) for g in itls_s[i]]
        ttft = float(ttft_s[i])
        e2el = float(e2el_s[i]) if e2el_s is not None else ttft + sum(gaps)
        t0 = float(start_s[i]) if start_s is not None else clock
        clock = t0 + e2el
        text = texts[i] if texts is not None else ""
        rows.append(
            {
                "request": i,
                "cell": "",
                "prompt_id": f"r{i:05d}",
                "domain": "imported",
                "phase": "imported",
                "phase_index": 0,
                "warmup": False,
                "ok": bool(ok[i]),
                "error": (errors[i] if errors is not None else "") or "",
                "first_after_boot": i == 0,
                "t_start_s": t0,
                "scheduling_delay_s": 0.0,
                "ttft_s": ttft if ok[i] else math.nan,
                "e2el_s": e2el if ok[i] else math.nan,
                "completion_tokens": int(output_lens[i]),
                "prompt_tokens": int(prompt_lens[i]) if prompt_lens is not None else 0,
                "n_chunks": len(gaps) + 1,
                "output_text": text,
                "output_sha256": _hashlib.sha256(text.encode("utf-8")).hexdigest(),
            }
        )
        t = t0 + ttft
        chunk_rows.append({"request": i, "chunk": 0, "t_s": t, "chars": 0})
        for j, gap in enumerate(gaps, start=1):
            t += gap
            chunk_rows.append({"request": i, "chunk": j, "t_s": t, "chars": 0})
    requests = pd.DataFrame(rows)
    if prompt_lens is None:
        # No prompt lengths saved: prefill speed is unknown, not infinite.
        requests["prompt_tokens"] = np.nan
    chunks = pd.DataFrame(chunk_rows, columns=["request", "chunk", "t_s", "chars"])
    return requests, chunks
