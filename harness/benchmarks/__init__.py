"""Named benchmarks for ``harness bench NAME``.

Each benchmark module exposes ``run_bench(quick: bool) -> list[Figure]``. Every figure is measured
side by side in the same run against a baseline, so the machine's noise cancels: report ratios,
with the absolute numbers only as context.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One measured figure: ``value`` in ``unit``, against ``target`` where an issue sets one."""

    name: str
    value: float
    unit: str
    baseline: str = ""
    target: str = ""
    passed: bool | None = None
