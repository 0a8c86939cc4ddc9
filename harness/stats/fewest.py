"""The least size at which a monotone condition holds: how many prompts, how many cycles."""

from __future__ import annotations

from collections.abc import Callable


def fewest(holds: Callable[[int], bool], start: int = 1, most: int = 1_000_000) -> int | None:
    """The least n >= ``start`` for which ``holds(n)``, ``holds`` turning true for good as n
    grows and assumed false at ``start - 1``; None when not even ``most`` does. Doubling, then
    bisection: about 2 log2(n) calls, which matters where each one simulates campaigns."""
    if start > most:
        return None
    low, high = start - 1, start
    while not holds(high):
        if high >= most:
            return None
        low, high = high, min(most, high * 2)
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle
    return high


__all__ = ["fewest"]
