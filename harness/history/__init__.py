"""Results across campaigns: the append-only store under ``reports/history/`` and its trends.

``store`` writes one parquet file per finished campaign and reads them back as one table;
``changes`` finds change points in a metric's series with Apache Otava's E-Divisive means;
``releases`` marks promoted campaigns as releases, the anchors of ``regression`` gates;
``commands`` is the ``harness history`` verb.

Nothing is imported here: the CLI registers ``history`` without loading pandas, so import what
you use from its module (``harness.history.store``, ...).
"""
