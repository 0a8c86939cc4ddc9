"""Replay: fast == reference, lockstep against live refbox traces, cache mode vs the runtime."""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import TraceError
from harness.formats.maps import write_rowmap
from harness.formats.ring_read import read_ring
from harness.formats.route_trace import slice_after_last_reset
from harness.policy.residency import PolicyKnobs
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.model import DOMAIN_SAMPLES, ModelConfig
from harness.sim import replay as replay_module
from harness.sim.commands import register
from harness.sim.decisions import lockstep, lockstep_text
from harness.sim.replay import replay_cache, replay_fast, replay_reference
from harness.sim.results import ReplayResult
from harness.sim.trace_files import load_trace
from harness.sim.traces import KnobChange, Trace, trace_from_arrays

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = ["--layers", "4", "--experts", "16", "--top-k", "2", "--d-model", "16",
            "--d-ff", "16", "--hot-slots", "8", "--expert-bytes", "0", "--drain-every", "8",
            "--promote-threshold", "1"]  # fmt: skip


def assert_same(a: ReplayResult, b: ReplayResult) -> None:
    """Every decision and every count identical."""
    assert a.swaps.tolist() == b.swaps.tolist()
    assert a.drain_steps.tolist() == b.drain_steps.tolist()
    assert a.saturated.tolist() == b.saturated.tolist()
    assert a.final_hot == b.final_hot
    assert a.cold_lookups.tolist() == b.cold_lookups.tolist()
    assert a.step_swaps.tolist() == b.step_swaps.tolist()


@st.composite
def replays(draw: st.DrawFn) -> tuple[Trace, PolicyKnobs, list[list[int]], list[KnobChange]]:
    layers = draw(st.integers(1, 3))
    experts = draw(st.integers(2, 10))
    top_k = draw(st.integers(1, min(3, experts)))
    rows = draw(st.integers(1, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    skew = rng.random(experts) ** 3  # a few popular experts, so promotions happen
    chosen = np.argsort(rng.random((rows, layers, experts)) * skew, axis=2)[..., :top_k]
    if draw(st.booleans()):  # duplicates inside one row are counted twice by add.at
        dup = rng.random(rows) < 0.1
        chosen[dup, :, -1] = chosen[dup, :, 0]
    steps = np.cumsum(rng.integers(0, 3, rows))  # repeats: several tokens in one step
    prefill = rng.random(rows) < 0.2
    trace = trace_from_arrays(chosen, prefill=prefill, steps=steps, experts_count=experts)

    def knobs() -> PolicyKnobs:
        return PolicyKnobs(
            policy=draw(st.sampled_from(["adaptive", "adaptive", "frozen"])),
            decay_half_life_steps=draw(st.sampled_from([0.3, 2.0, 40.0, math.inf])),
            promote_threshold=draw(st.sampled_from([0.0, 0.5, 2.0])),
            hysteresis=draw(st.sampled_from([0.0, 0.25, 1.0])),
            drain_every=draw(st.integers(1, 9)),
            swaps_per_layer=draw(st.integers(0, 3)),
        )

    hot_slots = draw(st.integers(0, experts))
    hot = [sorted(rng.permutation(experts)[:hot_slots].tolist()) for _ in range(layers)]
    change_steps = sorted(draw(st.lists(st.integers(0, int(steps[-1]) + 2), max_size=3)))
    changes = [KnobChange(s, knobs(), 0) for s in change_steps]
    return trace, knobs(), hot, changes


@settings(max_examples=150, deadline=None)
@given(replays())
def test_fast_replay_makes_identical_decisions(
    case: tuple[Trace, PolicyKnobs, list[list[int]], list[KnobChange]],
) -> None:
    """Random traces, knobs (a 0.3-step half-life flushes idle counts to zero), maps, live knob
    changes, multi-token and mixed prefill/decode steps: the fast path decides exactly as the
    reference, on one thread or several, and in blocks cut by steps or by swap slots."""
    trace, knobs, hot, changes = case
    reference = replay_reference(trace, knobs, hot, changes=changes)
    for threads in (1, 2, 3):
        assert_same(reference, replay_fast(trace, knobs, hot, changes=changes, threads=threads))
    with (
        mock.patch.object(replay_module, "_BLOCK_STEPS", 7),
        mock.patch.object(replay_module, "_BLOCK_SLOTS", 5),
    ):
        assert_same(reference, replay_fast(trace, knobs, hot, changes=changes, threads=2))


def _post(port: int, path: str, body: dict[str, object]) -> object:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def record_live(
    tmp: Path, name: str, *flags: str, shift: bool = False, reset: Path | None = None
) -> Path:
    """Boot the refbox with a route trace, drive several domains, change knobs live, SIGTERM;
    with ``reset`` (a map), a second run on the same boot after a reset onto that map."""
    trace = tmp / f"{name}.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.refbox", "serve", "--port", "0",
         "--route-trace", str(trace), "--ring", str(tmp / f"{name}.ring"), *GEOMETRY, *flags],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = 0
        for line in proc.stderr:
            if "listening on http://" in line:
                port = int(line.rsplit(":", 1)[1])
                break
        assert port, "the refbox never became ready"
        for domain in ("english", "python"):
            _post(
                port, "/v1/completions", {"prompt": DOMAIN_SAMPLES[domain][:80], "max_tokens": 48}
            )
        _post(port, "/admin/knobs", {"hysteresis": 0.1, "swaps_per_layer": 3})
        if shift:
            _post(port, "/admin/knobs", {"phase": 1})
        for domain in ("japanese", "json", "math"):
            _post(
                port, "/v1/completions", {"prompt": DOMAIN_SAMPLES[domain][:80], "max_tokens": 48}
            )
        if reset is not None:  # the next cell on a shared boot, as `harness run` switches it
            _post(port, "/admin/reset", {"rowmap": str(reset), "drain_every": 4})
            for domain in ("python", "english", "json"):
                _post(
                    port,
                    "/v1/completions",
                    {"prompt": DOMAIN_SAMPLES[domain][:80], "max_tokens": 48},
                )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        proc.stderr.close()
    return trace


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Route traces recorded live: adaptive, frozen, and adaptive across a domain shift."""
    tmp = tmp_path_factory.mktemp("live")
    yield {
        "adaptive": record_live(tmp, "adaptive"),
        "frozen": record_live(tmp, "frozen", "--policy", "frozen"),
        "shift": record_live(tmp, "shift", "--drain-every", "4", shift=True),
    }


@pytest.mark.parametrize("name", ["adaptive", "frozen", "shift"])
def test_lockstep_on_live_traces_has_no_divergence(live: dict[str, Path], name: str) -> None:
    """Replaying what the runtime saw, with its knobs and live changes, decides what it did."""
    trace = load_trace(live[name])
    assert trace.knob_changes, "the live knob change must be in the trace"
    for fast in (True, False):
        result = lockstep(trace, fast=fast)
        assert result.divergent == 0 and result.first is None
        assert result.replayed_swaps == result.recorded_swaps
        if name == "frozen":
            assert result.decisions == 0 and result.recorded_swaps == 0
        else:
            assert result.decisions > 0 and result.recorded_swaps > 0
    assert_same(replay_reference(trace), replay_fast(trace))


def test_a_shared_boots_run_replays_from_its_reset(tmp_path: Path) -> None:
    """A shared boot's trace holds its runs one after another: the whole file is refused with
    the fix, and a run's own part (what `harness run` keeps) replays in lockstep from the reset's
    map and knobs, as a boot of its own would."""
    other_map = tmp_path / "map.json"
    write_rowmap(other_map, [[8, 9, 10, 11, 12, 13, 14, 15]] * 4, experts=16)
    whole = record_live(tmp_path, "shared", reset=other_map)
    with pytest.raises(TraceError, match=r"a reset: this is a whole shared boot's trace"):
        load_trace(whole)
    run = tmp_path / "run.jsonl"
    shutil.copy(whole, run)
    step = slice_after_last_reset(run)
    assert step is not None and step > 0
    trace = load_trace(run)
    assert trace.hot == [[8, 9, 10, 11, 12, 13, 14, 15]] * 4
    assert trace.knobs.drain_every == 8  # the boot's; the cell's 4 comes as a live change
    assert [c.knobs.drain_every for c in trace.knob_changes] == [4]
    result = lockstep(trace)
    assert result.divergent == 0 and result.recorded_swaps > 0
    assert result.replayed_swaps == result.recorded_swaps
    assert slice_after_last_reset(run) is None  # a run's part has no reset left to cut at


def test_replay_reproduces_the_runtime_ring(live: dict[str, Path]) -> None:
    """Per host step, the simulated cold lookups and swaps equal the runtime's own ring."""
    path = live["shift"]
    ring = read_ring(path.with_suffix(".ring")).frame
    result = replay_fast(load_trace(path))
    assert result.cold_lookups.tolist() == ring["cold_lookups"].tolist()
    assert result.step_swaps.tolist() == ring["swaps"].tolist()
    assert result.tokens.tolist() == ring["tokens"].tolist()
    assert result.phase.tolist() == ring["phase"].tolist()


def test_a_changed_knob_diverges_and_names_the_first(live: dict[str, Path], tmp_path: Path) -> None:
    """hysteresis=0.9 over the recorded 0.25: divergences, the first with step, layer, knobs;
    the CLI prints it, exits 1 and writes lockstep.json."""
    trace = load_trace(live["adaptive"])
    result = lockstep(trace, {"hysteresis": 0.9})
    assert result.divergent > 0 and result.first is not None
    assert result.first["recorded_knobs"]["hysteresis"] == 0.25
    assert result.first["replayed_knobs"]["hysteresis"] == 0.9
    assert result.first["recorded"] != result.first["replayed"]
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = io.StringIO()
    args = parser.parse_args(["simulate", "--lockstep", str(live["adaptive"]),
                              "--override", "hysteresis=0.9", "--out", str(tmp_path)])  # fmt: skip
    assert args.handler(args, out) == 1
    text = out.getvalue()
    assert f"{result.decisions:,} decisions, {result.divergent:,} divergent" in text
    assert f"first divergence: step {result.first['step']} (" in text
    saved = json.loads((tmp_path / "lockstep.json").read_text())
    assert (
        saved["divergent"] == result.divergent and saved["first"]["layer"] == result.first["layer"]
    )
    args = parser.parse_args(["simulate", "--lockstep", str(live["adaptive"])])
    assert args.handler(args, io.StringIO()) == 0


def test_a_changed_drain_interval_diverges_on_the_drain_points(live: dict[str, Path]) -> None:
    """Recorded drains are decisions too: replaying with another drain_every names a step where
    one side drained and the other did not."""
    result = lockstep(load_trace(live["adaptive"]), {"drain_every": 5})
    assert result.divergent > 0 and result.first is not None
    assert result.first["recorded_drain"] != result.first["replayed_drain"]
    assert "no drain at this step" in lockstep_text(result)


def test_cache_replay_matches_the_runtime_cache_mode(tmp_path: Path) -> None:
    """Seed 004's cache: hits, misses and per-step misses equal the runtime's counters."""
    cfg = ModelConfig(layers=3, experts=16, top_k=2, d_model=16, d_ff=16, seed=3)
    hotlist = [(layer, expert) for expert in range(12) for layer in range(3)]
    for priority in ("legacy", "adaptive"):
        path = tmp_path / f"{priority}.jsonl"
        engine = Engine(
            cfg,
            EngineOptions(expert_bytes=0, cold_dir=str(tmp_path), cache_records=20,
                          hotlist=hotlist, hotlist_priority=priority,
                          route_trace_path=str(path), ring_path=str(path.with_suffix(".ring"))),
        )  # fmt: skip
        for domain in ("english", "python", "json"):
            list(engine.generate(DOMAIN_SAMPLES[domain][:40].encode(), 24))
        counters = engine.counters()
        engine.close()
        trace = load_trace(path)
        assert trace.mode == "cache"
        result = replay_cache(trace, 20, hotlist, priority)
        assert (result.hits, result.misses) == (counters["hits"], counters["misses"])
        ring = read_ring(path.with_suffix(".ring")).frame
        assert result.cold_lookups.tolist() == ring["cold_lookups"].tolist()
