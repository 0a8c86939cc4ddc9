"""The CUDA lane's knee JSON: ``{"tag", "rows": [[C, aggregate_tok_s, per_user_tok_s], …], "ts"}``.

One row per concurrency C of a sweep: the aggregate output tokens per second and what one user
sees. ``select: {C: 8}`` keeps some rows (default: all); decode tok/s is the geomean of
``per_user_tok_s`` over them, output tok/s of ``aggregate_tok_s``, and C1 the per-user speed
at C = 1 when that row is kept. ``tag`` and ``ts`` are kept as the block's identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ResultFileError
from harness.importers.common import SourceBlock, file_sha256, number, read_json_file
from harness.importers.tables import Selector, add_metric, select_rows

FORMAT = "knee"
_COLUMNS = ("C", "aggregate_tok_s", "per_user_tok_s")


def read_knee(path: Path, select: Selector | None = None) -> SourceBlock:
    """One knee JSON as a block (summary-only)."""
    data = read_json_file(path, "knee JSON")
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ResultFileError(
            f'{path}: not a knee JSON ({{"tag", "rows": [[C, aggregate_tok_s, '
            'per_user_tok_s], …], "ts"}); check the FORMAT given to harness import'
        )
    rows: list[dict[str, Any]] = []
    for index, row in enumerate(data["rows"]):
        if not isinstance(row, list) or len(row) != 3:
            raise ResultFileError(f"{path}: rows[{index}]: must be [C, aggregate_tok_s, "
                                  "per_user_tok_s]")  # fmt: skip
        values = [number(v, f"{path}: rows[{index}][{j}]") for j, v in enumerate(row)]
        rows.append(dict(zip(_COLUMNS, values, strict=True)))
    if not rows:
        raise ResultFileError(f"{path}: rows: empty")
    kept = select_rows(rows, select or {}, path, set(_COLUMNS))
    block = SourceBlock(path=path, format=FORMAT, sha256=file_sha256(path))
    block.identity = {k: data[k] for k in ("tag", "ts") if k in data}
    add_metric(block, kept, "per_user_tok_s", "decode_tok_s", where=" rows ")
    add_metric(block, kept, "aggregate_tok_s", "output_tok_s", where=" rows ")
    add_metric(block, kept, "per_user_tok_s", "c1_tok_s", where=" rows ",
               include=lambda r: r["C"] == 1)  # fmt: skip
    block.wanted["c1_tok_s"] = "per_user_tok_s of the row with C = 1"
    block.notes.append(
        "summary-only (knee JSON): per-user and aggregate tok/s per concurrency, reduced by "
        "geomean over the selected rows; no per-request data"
    )
    return block
