"""Number formatting for the report: sensible precision, units, and a dash for missing data."""

from __future__ import annotations

import math
from typing import Any

from harness.stats.cycles import UNBOUNDED
from harness.stats.cycles import finite as finite  # the analysis's rule, shared
from harness.stats.cycles import interval_text as interval_text  # every renderer's interval

MISSING = "—"
GIB = 1024.0**3


def num(value: Any, digits: int = 3) -> str:
    """A number with about ``digits`` significant figures, thousands separated."""
    number = finite(value)
    if number is None:
        return MISSING
    if number == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(number)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{number:,.{decimals}f}"


def fixed(value: Any, decimals: int, unit: str = "") -> str:
    """A number with a fixed number of decimals and an optional unit."""
    number = finite(value)
    if number is None:
        return MISSING
    text = f"{number:,.{decimals}f}"
    return f"{text} {unit}" if unit else text


def count(value: Any) -> str:
    """An integer count with thousands separators (8,231)."""
    number = finite(value)
    return MISSING if number is None else f"{round(number):,}"


def pct(fraction: Any, decimals: int = 2) -> str:
    """A fraction as a percentage (0.5015 → 50.15%)."""
    number = finite(fraction)
    return MISSING if number is None else f"{number * 100:.{decimals}f}%"


def gib(value_bytes: Any) -> str:
    """Bytes as GiB with two decimals (seed 004's routed reads)."""
    number = finite(value_bytes)
    return MISSING if number is None else f"{number / GIB:,.2f} GiB"


def seconds(value_s: Any) -> str:
    """A duration in seconds: one decimal below a minute, else minutes or hours."""
    number = finite(value_s)
    if number is None:
        return MISSING
    if abs(number) < 60:
        return f"{number:.1f} s"
    if abs(number) < 3600:
        return f"{number / 60:.1f} min"
    return f"{number / 3600:.2f} h"


def ratio(value: Any) -> str:
    """A ratio as 1.08×."""
    number = finite(value)
    return MISSING if number is None else f"{number:.2f}×"


def ratio3(value: Any) -> str:
    """A ratio with three decimals, for comparisons (1.126); "∞" past the largest float."""
    number = finite(value)
    if number is None:
        return UNBOUNDED if isinstance(value, float) and value == math.inf else MISSING
    return f"{number:.3f}"


def delta(ratio: Any) -> str:
    """Δ of a cell vs its control from their ratio: signed percent, or a multiple from 2× up
    (seed 000 §5)."""
    change = finite(ratio)
    if change is None:
        return MISSING
    if change >= 2.0:
        return f"{change:.1f}×"
    return f"{(change - 1) * 100:+.1f}%".replace("-", "−")


FRACTIONS = frozenset({"hit_rate", "cold_share", "ring_cold_share"})


def metric(name: str, value: Any, unit: str) -> str:
    """A metric value in its catalog unit, with the precision a reviewer expects."""
    if name in FRACTIONS:
        return pct(value)
    if unit == "B":
        return gib(value)
    if unit == "":
        return count(value)
    if unit == "s":
        return seconds(value)
    if unit == "ms":
        return fixed(value, 2, "ms")
    if unit == "tok/s":
        return fixed(value, 1, "tok/s")
    if unit == "swaps/min":
        return fixed(value, 0, "/min")
    return f"{num(value)} {unit}".strip()
