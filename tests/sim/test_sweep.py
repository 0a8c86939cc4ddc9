"""harness simulate --sweep: the grid, the ladder, the wrong-map warning, --pick, processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from harness.card import load_card
from harness.formats.maps import write_rowmap
from harness.policy.residency import PolicyKnobs
from harness.sim.replay import replay_reference
from harness.sim.sweep.grid import run_sweep
from harness.sim.sweep.spec import grid_points, parse_axes, sample_points
from harness.sim.trace_files import load_trace
from tests.conftest import run_cli
from tests.sim.test_simulate import POOL, _domain_trace

CARD = """\
campaign: sweep-test
runtime: refbox
prompts:
  pools: [{pool}]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 8
  phases:
    - {{name: prose, domains: [en-prose], requests: 2}}
    - {{name: code, domains: [python], requests: 2, shift: true}}
cells:
  base:
    knobs: {{policy: adaptive, drain_every: 64, promote_threshold: 1}}
    files: {{rowmap: seed.json}}
  other:
    knobs: {{policy: adaptive, drain_every: 8, promote_threshold: 1}}
    files: {{rowmap: seed.json}}
control: base
design: {{order: abba, cycles: 1, repeats: 1, cache_states: [warm]}}
analysis: {{window_s: 0.5, converged_span_s: 1, hold_s: 0.2}}
gates:
  - {{kind: counter, counter: swaps, max: 100000}}
  - {{kind: better, metric: hit_rate}}
  - {{kind: better, metric: churn_per_min, cells: [other]}}
"""


def _setup(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A card beside its seed map, and two traces: each a prose then a code domain (tagged by
    position is not possible per file, so each trace is one domain; the sweep replays each)."""
    card = tmp_path / "card.yaml"
    card.write_text(CARD.format(pool=POOL))
    write_rowmap(tmp_path / "seed.json", [list(range(8))] * 4, 16)
    write_rowmap(tmp_path / "other-map.json", [list(range(8, 16))] * 4, 16)
    traces = [tmp_path / "prose.npy", tmp_path / "code.npy"]
    _domain_trace(traces[0], 0, 1)
    _domain_trace(traces[1], 8, 2)
    return card, traces


def test_grid_and_sample_points() -> None:
    axes = parse_axes(["drain_every=8,16,32", "swaps_per_layer=1,2"])
    points = grid_points(axes)
    assert [p.id for p in points][:2] == ["control", "p001"] and len(points) == 1 + 3 * 2
    assert dict(points[1].overrides) == {"drain_every": 8, "swaps_per_layer": 1}
    ranged = parse_axes(["drain_every=8:64", "hysteresis=0.1:0.5"])
    drawn = sample_points(ranged, 5, seed=3)
    assert len(drawn) == 6 and drawn == sample_points(ranged, 5, seed=3)
    for point in drawn[1:]:
        values = dict(point.overrides)
        assert isinstance(values["drain_every"], int) and 8 <= values["drain_every"] <= 64
        assert 0.1 <= float(values["hysteresis"]) <= 0.5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (["bogus=1,2"], "unknown knob 'bogus'"),
        (["drain_every=8:64"], "a LOW:HIGH range needs --sample N"),
        (["drain_every=8,x"], "'x' is not an integer"),
        (["rowmap=missing.json"], "missing.json: no such file"),
        (["drain_every"], "write KNOB=v1,v2"),
        (["drain_every=8,16", "--reference"], "drop --reference and --start"),
        (["drain_every=8,16", "--pick", "1"], "pick at least 2"),
        (["drain_every=8,16", "--pick", "2", "--pick-out", "/tmp/x.yaml"], "beside"),
    ],
)
def test_bad_sweeps_are_bad_input(tmp_path: Path, spec: list[str], message: str) -> None:
    card, traces = _setup(tmp_path)
    args = ["simulate", str(card), "--traces", str(traces[0]), "--out", str(tmp_path / "s")]
    for one in spec:
        flag = one.startswith(("--", "/")) or one.isdigit()
        args += [one] if flag else ["--sweep", one]
    done = run_cli(*args)
    assert done.code == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_each_point_is_the_replay_of_its_settings(tmp_path: Path) -> None:
    """A point's row is the plain step-by-step replay of the base cell with its overrides, and
    the ladder's Δ% is against the control row."""
    card, paths = _setup(tmp_path)
    loaded = load_card(card)
    traces = [load_trace(p) for p in paths]
    points = grid_points(parse_axes(["drain_every=16,64", "swaps_per_layer=1,2"]))
    sweep = run_sweep(loaded, traces, points)
    assert len(sweep.rows) == len(points) * 2
    for point in points:
        values = {"drain_every": 64, "swaps_per_layer": 2, **dict(point.overrides)}
        knobs = PolicyKnobs(policy="adaptive", promote_threshold=1.0, **values)  # type: ignore[arg-type]
        for index, trace in enumerate(traces):
            plain = replay_reference(trace, knobs, [list(range(8))] * 4)
            lookups = int(plain.lookups.sum())
            row = sweep.rows[(sweep.rows["point"] == point.id) & (sweep.rows["trace"] == index)]
            assert row["swaps"].item() == len(plain.swaps)
            assert row["hit_rate"].item() == pytest.approx(plain.hits / lookups, rel=1e-12)
    ladder = sweep.ladder.set_index("point")
    assert ladder.loc["control", "swaps"] == ladder.loc["p004", "swaps"]  # 64/2 is the control
    assert ladder.loc["control", "hit_rate Δ%"] == 0
    fast = ladder.loc["p001"]  # drain every 16, one swap: more swaps than the control
    expected = (fast["swaps"] - ladder.loc["control", "swaps"]) / ladder.loc["control", "swaps"]
    assert fast["swaps Δ%"] == pytest.approx(100 * expected)


def test_local_processes_equal_one_process(tmp_path: Path) -> None:
    card, paths = _setup(tmp_path)
    loaded = load_card(card)
    traces = [load_trace(p) for p in paths]
    points = grid_points(parse_axes(["drain_every=8,32", "hysteresis=0,0.5"]))
    one = run_sweep(loaded, traces, points, jobs=1)
    two = run_sweep(loaded, traces, points, jobs=2)
    pd.testing.assert_frame_equal(one.rows, two.rows)
    pd.testing.assert_frame_equal(one.ladder, two.ladder)


def test_pick_writes_a_card_that_validates(tmp_path: Path) -> None:
    card, traces = _setup(tmp_path)
    done = run_cli(
        "simulate", str(card), "--traces", *map(str, traces), "--reports", str(tmp_path / "r"),
        "--sweep", "drain_every=4,16,64", "--sweep", "swaps_per_layer=1,4", "--pick", "3",
        "--jobs", "1",
    )  # fmt: skip
    assert done.code == 0, done.stdout + done.stderr
    assert "WRONG MAP" not in done.stdout  # the sweep boots the cells' own map
    picked = tmp_path / "card-pick.yaml"
    loaded = load_card(picked)
    names = list(loaded.card.cells)
    assert loaded.card.campaign == "sweep-test-pick" and names[0] == "base"
    assert loaded.card.control == "base" and 2 <= len(names) <= 3
    text = picked.read_text()
    assert "# Objectives" in text and "hit_rate" in text and "vs control" in text
    # The gate that named a dropped cell applies to every cell again.
    raw = yaml.safe_load(text)
    assert all("cells" not in gate for gate in raw["gates"])
    (root,) = list((tmp_path / "r" / "sweep-test-sweep").iterdir())
    ladder = pd.read_parquet(root / "ladder.parquet").set_index("point")
    # No picked point is beaten on both objectives (hit rate up, churn down) by another point.
    for name in names[1:]:
        cell = loaded.card.cells[name]
        assert cell.description.startswith(f"sweep point {ladder.loc[name, 'label']}")
        hit, churn = ladder.loc[name, "hit_rate"], ladder.loc[name, "churn_per_min"]
        beaten = (ladder["hit_rate"] >= hit) & (ladder["churn_per_min"] <= churn)
        beaten &= (ladder["hit_rate"] > hit) | (ladder["churn_per_min"] < churn)
        assert not beaten.any(), name
    assert (root / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((root / "sweep.json").read_text())["warnings"] == []
    # The picked card's simulated campaign, where its measured run's report will look.
    (sim,) = list((tmp_path / "r" / "sweep-test-pick-sim").iterdir())
    assert (sim / "SIMULATED").is_file()


def test_a_sweep_from_another_map_warns_loudly(tmp_path: Path) -> None:
    card, traces = _setup(tmp_path)
    # The same map under another name is the same map: no warning for it.
    write_rowmap(tmp_path / "seed-copy.json", [list(range(8))] * 4, 16)
    done = run_cli(
        "simulate", str(card), "--traces", str(traces[0]), "--out", str(tmp_path / "s"),
        "--sweep", f"rowmap={tmp_path / 'seed-copy.json'},{tmp_path / 'other-map.json'}",
        "--sweep", "drain_every=8,64",
        "--pick", "2", "--reports", str(tmp_path / "r"), "--jobs", "1",
    )  # fmt: skip
    assert done.code == 0, done.stdout + done.stderr
    assert done.stdout.startswith("sweeping") and done.stdout.count("WRONG MAP") >= 2
    (warning,) = json.loads((tmp_path / "s" / "sweep.json").read_text())["warnings"]
    assert "rowmap other-map.json" in warning and "p003, p004" in warning
    assert "base (rowmap seed.json)" in warning
    assert (tmp_path / "s" / "sweep.md").read_text().startswith("WRONG MAP")
    assert "# WRONG MAP" in (tmp_path / "card-pick.yaml").read_text()
    quiet = run_cli(
        "simulate", str(card), "--traces", str(traces[0]), "--out", str(tmp_path / "q"),
        "--sweep", f"rowmap={tmp_path / 'seed-copy.json'}", "--jobs", "1",
    )  # fmt: skip
    assert quiet.code == 0 and "WRONG MAP" not in quiet.stdout


def test_a_trace_without_a_shift_has_no_t90(tmp_path: Path) -> None:
    card, paths = _setup(tmp_path)
    sweep = run_sweep(load_card(card), [load_trace(paths[0])], grid_points([]))
    assert np.isnan(sweep.ladder["t90_s"].iloc[0])  # one phase: nothing to recover from


@pytest.mark.slow
def test_sweep_bench_quick_runs_three_ways_alike() -> None:
    from harness.benchmarks import sweep as bench_sweep

    identical, speedup, threaded, wall, rate = bench_sweep.run_bench(quick=True)
    assert threaded.value > 0
    # Quick: 9 points (one hysteresis) on 2 traces.
    assert identical.passed is True and "18 tasks" in identical.name
    assert speedup.value > 0 and "load average" in speedup.baseline
    assert "9 points x 2 traces" in speedup.name
    assert wall.value > 0 and rate.value == pytest.approx(9 / wall.value)


def test_pareto_front_and_small_sweeps_in_process() -> None:
    from harness.sim.pick import pareto_front
    from harness.sim.sweep.command import SMALL_SWEEP_TOKENS, _default_jobs

    values = np.array([[1.0, 1.0], [2.0, 0.5], [0.5, 2.0], [0.9, 0.9], [2.0, 0.5]])
    assert pareto_front(values) == [0, 1, 2, 4]  # equal points do not dominate each other
    assert _default_jobs(SMALL_SWEEP_TOKENS - 1, 8) == 1
    assert _default_jobs(SMALL_SWEEP_TOKENS, 8) == 8
