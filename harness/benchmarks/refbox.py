"""``harness bench refbox``: the reference runtime's decode speed and what a map is worth.

In-process (model only, no HTTP), default geometry (8 layers x 64 experts, top-4, 48 hot slots,
512 KiB slow-tier records), greedy decode of held-out halves of the built-in domain samples.
Arms are measured interleaved A/B/B/A so slow machine drift cancels; figures are ratios, with
the absolute speeds as context.
"""

from __future__ import annotations

import math
import tempfile
import time

from harness.benchmarks import Figure
from harness.formats.maps import fit_rowmap
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.model import DOMAIN_SAMPLES, ModelConfig

__all__ = ["run_bench"]


def _halves(name: str) -> tuple[bytes, bytes]:
    text = DOMAIN_SAMPLES[name]
    cut = len(text) // 2
    return text[:cut].encode(), text[cut:].encode()


def _decode_run(engine: Engine, prompt: bytes, tokens: int) -> tuple[float, float]:
    """Decode tok/s (first token to last, prefill excluded) and the decode cold share."""
    gen = engine.generate(prompt, tokens)
    next(gen)  # the prefill step yields the first token
    before = engine.counters()
    start = time.perf_counter()
    count = sum(1 for _ in gen)
    elapsed_s = time.perf_counter() - start
    after = engine.counters()
    lookups = after["lookups"] - before["lookups"]
    cold = after["cold_lookups"] - before["cold_lookups"]
    return count / elapsed_s, cold / max(lookups, 1)


def _abba(a: Engine, b: Engine, prompt: bytes, tokens: int, cycles: int) -> dict[str, float]:
    """Geomean decode tok/s and mean cold share of two engines, interleaved A B B A."""
    speeds: dict[str, list[float]] = {"a": [], "b": []}
    shares: dict[str, list[float]] = {"a": [], "b": []}
    for _ in range(cycles):
        for arm in ("a", "b", "b", "a"):
            tps, share = _decode_run(a if arm == "a" else b, prompt, tokens)
            speeds[arm].append(tps)
            shares[arm].append(share)
    out = {}
    for arm in ("a", "b"):
        out[f"{arm}_tps"] = math.exp(sum(math.log(v) for v in speeds[arm]) / len(speeds[arm]))
        out[f"{arm}_cold"] = sum(shares[arm]) / len(shares[arm])
    return out


def run_bench(quick: bool = False) -> list[Figure]:
    """All-hot speed, the cost of a stale map's cold share, and a fitted map's gain."""
    cfg = ModelConfig()
    tokens = 150 if quick else 400
    cycles = 1 if quick else 3
    hot_slots = 48
    fit_prompt, held_out = _halves("python")
    with tempfile.TemporaryDirectory(prefix="refbox-bench-") as cold_dir:

        def engine(**opts: object) -> Engine:
            return Engine(cfg, EngineOptions(cold_dir=cold_dir, **opts))  # type: ignore[arg-type]

        all_hot = engine(hot_slots=cfg.experts)
        stale = engine(hot_slots=hot_slots)  # first 48 ids of each layer
        cold_cost = _abba(all_hot, stale, held_out, tokens, cycles)
        # Fit on the other half of the domain (and never on the prompt it is scored on).
        before = all_hot.route_count_dump(cumulative=True)
        list(all_hot.generate(fit_prompt, tokens))
        fit_counts = all_hot.route_count_dump(cumulative=True) - before
        fitted_map = fit_rowmap(fit_counts, hot_slots)
        fitted = engine(hot_slots=hot_slots, rowmap=fitted_map)
        map_gain = _abba(stale, fitted, held_out, tokens, cycles)
        del all_hot, stale, fitted
    slowdown = cold_cost["a_tps"] / cold_cost["b_tps"]
    gain = map_gain["b_tps"] / map_gain["a_tps"]
    return [
        Figure(
            name="all-hot decode speed (C1, in-process)",
            value=round(cold_cost["a_tps"], 1),
            unit="tok/s",
            target=">= 200",
            passed=cold_cost["a_tps"] >= 200.0,
        ),
        Figure(
            name=f"stale map slowdown at {cold_cost['b_cold']:.1%} cold share "
            f"({cold_cost['b_tps']:.0f} tok/s)",
            value=round(slowdown, 3),
            unit="x slower",
            baseline="all experts hot",
            target="> 1.1",
            passed=slowdown > 1.1,
        ),
        Figure(
            name=f"fitted map speed-up on held-out python "
            f"(cold share {map_gain['a_cold']:.1%} -> {map_gain['b_cold']:.1%}, "
            f"{map_gain['b_tps']:.0f} tok/s)",
            value=round(gain, 3),
            unit="x faster",
            baseline="stale map (first 48 ids per layer)",
            target="> 1.1",
            passed=gain > 1.1,
        ),
    ]
