"""The results store: ``reports/history/<campaign>--<stamp>--<key>.parquet``, one per campaign.

Each file holds one row per cell × cache state × metric of one finished campaign: the campaign
and its directory, when it finished, the box, the build (binary SHA-256, version and git
describe as its runs recorded them), the metric's value (median over the cell's completed runs)
and its per-block values, the comparison's label and ratio against the control, and whether the
campaign passed. A file is written whole to a temporary name and renamed into place, so a reader
never sees half a file and two campaigns finishing at once write two files, never one. A
campaign writes only its own file (its key is the hash of its directory), so gating it again
after a resume replaces its own row set and nothing else: the store is append-only across
campaigns. Reading globs the folder; a damaged file is named, never skipped silently.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.catalog import METRICS
from harness.errors import RecordError
from harness.formats.heads import HISTORY_DIR, store_dir
from harness.formats.records import read_parquet, write_parquet

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

__all__ = ["HISTORY_DIR", "append_history", "history_dir", "history_rows", "read_history"]

COLUMNS = (
    "campaign", "stamp", "dir", "finished_at", "box", "cell", "cache_state", "control", "metric",
    "value", "block_values", "label", "ratio", "passed", "binary_sha256", "version",
    "git_describe", "imported",
)  # fmt: skip


def history_dir(root: Path) -> Path | None:
    """``reports/history`` for a campaign at ``reports/<campaign>/<stamp>``, else None: only
    the standard layout records history, so gating a copied or test folder elsewhere adds
    nothing to anyone's store (the journal heads are kept in the same folder)."""
    return store_dir(root)


def _build(analysis: CampaignAnalysis, cell: str) -> dict[str, Any]:
    """The build a cell ran, from the first completed run's ``run.json`` that names one."""
    campaign = analysis.campaign
    out: dict[str, Any] = {"binary_sha256": None, "version": None, "git_describe": None}
    runs = analysis.runs
    for run_id in runs[(runs["cell"] == cell) & (runs["status"] == "ok")]["run_id"]:
        record = campaign.run_record(str(run_id)) or {}
        runtime = record.get("runtime") or {}
        for key in out:
            value = runtime.get(key)
            if out[key] is None and isinstance(value, str) and value:
                out[key] = value[:200]
        if runtime.get("imported"):
            out["imported"] = str(runtime["imported"])
    return out


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def history_rows(analysis: CampaignAnalysis, passed: bool) -> pd.DataFrame:
    """The rows one finished campaign adds to the store."""
    card = analysis.card
    root = analysis.campaign.root
    box = card.box if isinstance(card.box, str) else (card.box.host or card.box.kind)
    labels = {
        (str(r["cell"]), str(r["cache_state"]), str(r["metric"])): r
        for r in analysis.comparison_table().to_dict("records")
    }
    runs = analysis.runs
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    rows: list[dict[str, Any]] = []
    finished = time.time()
    for cell in card.cells:
        build = _build(analysis, cell)
        for state in card.design.cache_states:
            group = ok[(ok["cell"] == cell) & (ok["cache_state"] == state)]
            for metric in METRICS:
                if metric not in group.columns:
                    continue
                values = [v for v in (_finite(x) for x in group[metric]) if v is not None]
                if not values:
                    continue
                comparison = labels.get((cell, state, metric), {})
                rows.append(
                    {
                        "campaign": card.campaign,
                        "stamp": root.name,
                        "dir": str(root.resolve()),
                        "finished_at": finished,
                        "box": box,
                        "cell": cell,
                        "cache_state": state,
                        "control": card.control,
                        "metric": metric,
                        "value": float(pd.Series(values).median()),
                        "block_values": values,
                        "label": comparison.get("label"),
                        "ratio": _finite(comparison.get("ratio")),
                        "passed": passed,
                        "binary_sha256": build["binary_sha256"],
                        "version": build["version"],
                        "git_describe": build["git_describe"],
                        "imported": build.get("imported"),
                    }
                )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def append_history(analysis: CampaignAnalysis, passed: bool) -> Path | None:
    """Write the campaign's rows, with whether its gates passed, into its store (when it has one);
    returns the file."""
    root = analysis.campaign.root
    folder = history_dir(root)
    if folder is None:
        return None
    rows = history_rows(analysis, passed)
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    path = folder / f"{analysis.card.campaign}--{root.name}--{key}.parquet"
    write_parquet(rows, path)
    return path


def _store_file(path: Path) -> pd.DataFrame:
    """One store file, refused naming it when it lacks the store's columns (a file another
    tool or version left there once stopped `history` with a traceback)."""
    frame = read_parquet(path)
    lacking = [c for c in COLUMNS if c not in frame.columns]
    if lacking:
        raise RecordError(
            f"{path}: not a results-store file (no {', '.join(lacking[:4])}"
            f"{'…' if len(lacking) > 4 else ''}); move it out of the history folder"
        )
    return frame


def read_history(folder: Path) -> pd.DataFrame:
    """Every row of the store at ``folder`` (``reports/history``), oldest first."""
    paths = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    frames = [_store_file(p) for p in paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["finished_at", "stamp"], kind="stable").reset_index(drop=True)
