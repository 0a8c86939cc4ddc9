"""``fewest`` finds a monotone condition's threshold, for prompts and for cycles alike."""

from __future__ import annotations

from harness.stats.fewest import fewest


def test_fewest_finds_every_threshold_and_stops_at_most() -> None:
    for start in (1, 2, 5):
        for threshold in range(start, 300):
            calls: list[int] = []

            def holds(n: int, k: int = threshold, seen: list[int] = calls) -> bool:
                seen.append(n)
                return n >= k

            assert fewest(holds, start=start, most=1000) == threshold
            assert min(calls) >= start and len(calls) <= 2 * threshold.bit_length() + 2
    assert fewest(lambda n: n >= 2000, most=1000) is None
    assert fewest(lambda n: True, start=3, most=2) is None
