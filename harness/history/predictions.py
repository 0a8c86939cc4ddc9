"""The desk's record: every campaign's predicted-against-measured rows, kept across campaigns.

A campaign that had a prediction (a simulated sibling, ``harness simulate``) writes its rows to
``reports/history/predictions/<campaign>--<stamp>--<key>.parquet`` when it is gated, beside the
results store and with the same rules (written whole and renamed; a campaign replaces only its
own file). ``harness history --predictions`` reads them back, oldest first, so a team sees
whether its simulations are getting closer to its boxes: per campaign, the median |log ratio|
of each metric's predictions and how many measured values fell inside a fitted interval.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.errors import RecordError
from harness.formats.records import read_parquet, write_parquet
from harness.history.store import history_dir

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

__all__ = ["PREDICTIONS_DIR", "append_predictions", "prediction_summary", "read_predictions"]

PREDICTIONS_DIR = "predictions"
COLUMNS = (
    "campaign", "stamp", "dir", "finished_at", "source", "cache_state", "metric", "cell",
    "predicted", "low", "high", "measured", "ratio", "within", "mismatches",
)  # fmt: skip


def append_predictions(analysis: CampaignAnalysis) -> Path | None:
    """Write the campaign's predicted-against-measured rows into the store (when it has one and
    the campaign had a prediction); returns the file."""
    predicted = analysis.seed_tables.predicted
    root = analysis.campaign.root
    folder = history_dir(root)
    if predicted is None or folder is None:
        return None
    finished = time.time()
    rows: list[dict[str, Any]] = [
        {
            "campaign": analysis.card.campaign,
            "stamp": root.name,
            "dir": str(root.resolve()),
            "finished_at": finished,
            "source": predicted.source,
            "cache_state": predicted.cache_state,
            "metric": r.metric,
            "cell": r.cell,
            "predicted": r.predicted,
            "low": r.low,
            "high": r.high,
            "measured": r.measured,
            "ratio": r.ratio,
            "within": r.within,
            "mismatches": len(predicted.mismatches),
        }
        for r in predicted.rows
    ]
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    path = folder / PREDICTIONS_DIR / f"{analysis.card.campaign}--{root.name}--{key}.parquet"
    write_parquet(pd.DataFrame(rows, columns=list(COLUMNS)), path)
    return path


def read_predictions(folder: Path) -> pd.DataFrame:
    """Every prediction row under ``folder`` (``reports/history``), oldest first."""
    where = folder / PREDICTIONS_DIR
    frames = []
    for path in sorted(where.glob("*.parquet")) if where.is_dir() else []:
        frame = read_parquet(path)
        lacking = [c for c in COLUMNS if c not in frame.columns]
        if lacking:
            raise RecordError(
                f"{path}: not a prediction-store file (no {', '.join(lacking[:4])}); move it out "
                "of the history folder"
            )
        if not frame.empty:
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["finished_at", "stamp"], kind="stable").reset_index(drop=True)


def prediction_summary(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per campaign (oldest first) and metric: the median |log(predicted ÷ measured)| as a
    percentage, the rows it rests on, and how many measured values lay inside an interval."""
    out: list[dict[str, Any]] = []
    for (stamp, campaign, metric), group in table.groupby(
        ["stamp", "campaign", "metric"], sort=False
    ):
        ratios = [float(r) for r in group["ratio"] if r is not None and _positive(r)]
        errors = sorted(abs(math.log(r)) for r in ratios)
        judged = [bool(w) for w in group["within"] if w is not None and not pd.isna(w)]
        out.append(
            {
                "campaign": str(campaign),
                "stamp": str(stamp),
                "metric": str(metric),
                "rows": len(ratios),
                "median_error_pct": (
                    100 * math.expm1(errors[len(errors) // 2]) if errors else None
                ),
                "inside": sum(judged),
                "with_interval": len(judged),
                "mismatches": int(group["mismatches"].max()),
            }
        )
    return out


def _positive(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0
