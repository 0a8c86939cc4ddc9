"""A simulated campaign's predictions beside the box's measurements, metric by metric.

``harness simulate`` writes a campaign directory marked ``SIMULATED``; the analysis of the
measured campaign reads the newest such sibling and pairs its cell table with its own here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from harness.analyze.cell_values import cell_value
from harness.card import Card

# Runtime-side metrics a simulator predicts, shown predicted against measured.
PREDICTED_METRICS = ("t90_s", "t2x_s", "churn_per_min", "ring_cold_share", "hit_rate")


@dataclass(frozen=True)
class Prediction:
    """A simulated campaign's prediction of one metric of one cell, and the box's value."""

    metric: str
    cell: str
    predicted: float | None
    measured: float | None

    @property
    def error(self) -> float | None:
        """predicted − measured, in the metric's unit."""
        if self.predicted is None or self.measured is None:
            return None
        return self.predicted - self.measured

    @property
    def relative_error(self) -> float | None:
        """(predicted − measured) ÷ measured."""
        error = self.error
        if error is None or not self.measured:
            return None
        return error / self.measured

    def to_json(self) -> dict[str, Any]:
        """JSON form, with both errors."""
        return {
            **asdict(self),
            "error": self.error,
            "relative_error": self.relative_error,
        }


@dataclass(frozen=True)
class PredictedVsMeasured:
    """Predictions of the newest simulated sibling campaign beside this campaign's values."""

    source: str  # the simulated campaign's directory, relative to the reports folder
    cache_state: str
    rows: tuple[Prediction, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "source": self.source,
            "cache_state": self.cache_state,
            "rows": [r.to_json() for r in self.rows],
        }

    def frame(self) -> pd.DataFrame:
        """One row per (metric, cell) for ``analysis/predicted.parquet``."""
        return pd.DataFrame([{"source": self.source, **r.to_json()} for r in self.rows])


def predicted_vs_measured(
    card: Card, measured: pd.DataFrame, predicted: pd.DataFrame, source: str
) -> PredictedVsMeasured | None:
    """Rows for every predicted metric either side has; None when neither has any."""
    state = card.design.cache_states[0]
    rows = []
    for metric in PREDICTED_METRICS:
        for cell in card.cells:
            value = cell_value(measured, cell, state, metric)
            guess = cell_value(predicted, cell, state, metric)
            if value is None and guess is None:
                continue
            rows.append(Prediction(metric, cell, guess, value))
    return PredictedVsMeasured(source, state, tuple(rows)) if rows else None
