"""Results across campaigns: the append-only store under ``reports/history/`` and its trends.

``store`` writes one parquet file per finished campaign and reads them back as one table;
``changes`` finds change points in a metric's series with Apache Otava's E-Divisive means;
``commands`` is the ``harness history`` verb.
"""

from __future__ import annotations

from harness.history.store import HISTORY_DIR, append_history, history_rows, read_history

__all__ = ["HISTORY_DIR", "append_history", "history_rows", "read_history"]
