"""ds4-bench CSV, read by header name (andreaborio/ds4, ``docs/benchmarks/raw/*.csv``).

The seed-004 build (ba2a729) writes 39 columns (``ctx_tokens``, ``prefill_tokens``,
``prefill_tps``, ``ttft_ms``, ``gen_tokens``, ``gen_tps``, ``gen_tpot_p50_ms``,
``gen_tpot_p95_ms``, ``gen_hit_rate``, pread and eviction counts…); other builds of the fork wrote
other headers. Columns are found by name, so any header with the required ones works, and a
column we do not use is ignored.
One row per context size; ``select: {ctx_tokens: 8192}`` keeps some, and each metric is the
geomean over the kept rows that measured it (decode speed over rows with ``gen_tokens`` > 0,
prefill over rows with ``prefill_tokens`` > 0). A block is summary-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.formats.bench_table import parse_result_rows
from harness.formats.textfile import read_text
from harness.importers.common import SourceBlock, file_sha256
from harness.importers.tables import Selector, add_metric, select_rows

FORMAT = "ds4"
_REQUIRED = ("ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps")


def _positive(column: str) -> Any:
    def accept(row: dict[str, Any]) -> bool:
        try:
            return float(row.get(column) or 0) > 0
        except ValueError:
            return False

    return accept


def read_ds4(path: Path, select: Selector | None = None) -> SourceBlock:
    """One ds4-bench CSV as a block (summary-only)."""
    text = read_text(path, ResultFileError, "ds4-bench CSV")
    header = [h.strip() for h in text.split("\n", 1)[0].split(",")]
    lacking = [c for c in _REQUIRED if c not in header]
    if lacking:
        raise ResultFileError(
            f"{path}:1: {', '.join(lacking)}: missing from the header; not a ds4-bench CSV "
            "(check the FORMAT given to harness import)"
        )
    # The one CSV reader of benchmark tables, as the command driver reads ds4-bench's stdout.
    rows = [
        {k.strip(): v for k, v in row.items()}
        for row in parse_result_rows(text, "csv", str(path), ResultFileError)
    ]
    if not rows:
        raise ResultFileError(f"{path}: no data rows under the header")
    kept = select_rows(rows, select or {}, path, set(header))
    block = SourceBlock(path=path, format=FORMAT, sha256=file_sha256(path))
    block.identity = {"columns": len(header), "ctx_tokens": [r.get("ctx_tokens") for r in kept]}
    gen, pre = _positive("gen_tokens"), _positive("prefill_tokens")
    where = " row "
    add_metric(block, kept, "gen_tps", "decode_tok_s", where=where, include=gen)
    add_metric(block, kept, "prefill_tps", "prefill_tok_s", where=where, include=pre)
    add_metric(block, kept, "gen_tpot_p50_ms", "tpot_p50_ms", where=where, include=gen)
    add_metric(block, kept, "gen_tpot_p95_ms", "tpot_p95_ms", where=where, include=gen)
    add_metric(block, kept, "ttft_ms", "ttft_ms", where=where, include=pre)
    add_metric(block, kept, "gen_hit_rate", "hit_rate", where=where, include=gen)
    block.notes.append(
        "summary-only (ds4-bench): one figure per context size, reduced by geomean over the "
        "selected rows; no per-request data"
    )
    return block
