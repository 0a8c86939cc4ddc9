"""``harness simulate --sweep moe_cache_mib=…`` on a llama.cpp card: the predicted hit rate of
llama.cpp's expert cache per size, before a boot (the shipped llama-cpp-moe-offload card)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from harness.card import load_card
from harness.sim.replay import replay_lru
from harness.sim.simulate import cell_settings
from harness.sim.sweep.grid import run_sweep
from harness.sim.sweep.spec import grid_points, parse_axes
from harness.sim.trace_files import load_trace
from tests.conftest import REPO, run_cli

CARD = REPO / "campaigns" / "llama-cpp-moe-offload.yaml"
EXPERT_BYTES = 128 * 1024  # eight experts per MiB of cache


def _trace(path: Path) -> Path:
    """4 layers x 16 experts, top-2, Zipf-like choices."""
    rng = np.random.default_rng(3)
    weights = 1.0 / np.arange(1, 17) ** 1.3
    rows = [
        [rng.choice(16, size=2, replace=False, p=weights / weights.sum()) for _ in range(4)]
        for _ in range(400)
    ]
    np.save(path, np.array(rows))
    return path


def test_sweep_predicts_the_replayed_hit_rate_per_cache_size(tmp_path: Path) -> None:
    loaded = load_card(CARD)
    trace = load_trace(_trace(tmp_path / "t.npy"))
    sizes = (1, 2, 4, 9)
    points = grid_points(parse_axes(["moe_cache_mib=0,1,2,4,9"]))
    sweep = run_sweep(loaded, [trace], points, expert_bytes=EXPERT_BYTES)
    ladder = sweep.ladder.set_index("label")
    rates = [float(ladder.loc[f"moe_cache_mib={m}", "hit_rate"]) for m in sizes]
    # The figures are the cache's own replay: 1 MiB is 8 slots, one of them upstream's spare,
    # so it holds 7 of the 64 (layer, expert) pairs.
    for mib, rate in zip(sizes, rates, strict=True):
        replayed = replay_lru(trace, mib * 2**20, EXPERT_BYTES)
        assert rate == pytest.approx(replayed.hits / int(replayed.lookups.sum()))
    assert all(a < b for a, b in itertools.pairwise(rates))
    # 9 MiB holds all 64: only each pair's first use misses.
    assert rates[-1] == pytest.approx(1 - 64 / (400 * 4 * 2))
    # No cache (0 MiB, or the control: every expert in host memory) looks nothing up, as the
    # engine prints no cache line: no hit rate, not 0.
    assert np.isnan(float(ladder.loc["moe_cache_mib=0", "hit_rate"]))
    assert np.isnan(float(ladder.loc["control", "hit_rate"]))
    settings = cell_settings(loaded, "cache", trace, expert_bytes=EXPERT_BYTES)
    assert settings.mode == "lru" and settings.cache_bytes == 8192 << 20
    assert settings.cached_layers is None  # cpu_moe: every layer


def test_n_cpu_moe_limits_the_cached_layers(tmp_path: Path) -> None:
    loaded = load_card(CARD)
    trace = load_trace(_trace(tmp_path / "t.npy"))
    base = loaded.card.cells["cache"]
    cell = base.model_copy(update={"knobs": {**base.knobs, "cpu_moe": 0, "n_cpu_moe": 2}})
    settings = cell_settings(loaded, "cache", trace, cell=cell, expert_bytes=EXPERT_BYTES)
    assert settings.cached_layers == (0, 1)
    assert "first 2 layers" in settings.start


def test_without_the_expert_size_the_command_says_how_to_give_it(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.npy")
    done = run_cli("simulate", str(CARD), "--traces", str(trace), "--sweep",
                   "moe_cache_mib=1,2", "--out", str(tmp_path / "sweep"))  # fmt: skip
    assert done.code == 2, done
    assert "needs the size of one expert in bytes" in done.stderr
    assert "give --expert-bytes N" in done.stderr and "Traceback" not in done.stderr


def test_a_simulated_campaign_counts_what_the_caches_exit_line_would(tmp_path: Path) -> None:
    from harness.sim.simulate import simulate_card

    loaded = load_card(CARD)
    trace = load_trace(_trace(tmp_path / "t.npy"))
    root, cells = simulate_card(loaded, [trace], out=tmp_path / "sim", expert_bytes=EXPERT_BYTES)
    by_name = {c.name: c for c in cells}
    assert by_name["cache"].settings.describe()["cached_layers"] == "all"
    run = next(p for p in (root / "runs").iterdir() if "-cache-" in p.name)
    delta = json.loads((run / "counters.json").read_text())["delta"]
    # 8 GiB holds all 64 (layer, expert) pairs: only first uses miss, each one upload.
    assert (delta["hits"], delta["misses"]) == (400 * 4 * 2 - 64, 64)
    assert delta["bytes_read"] == 64 * EXPERT_BYTES
