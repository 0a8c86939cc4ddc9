"""harness simulate CARD --traces: a campaign directory that analysis and gates read unchanged."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.analyze.campaign import analyze_campaign
from harness.card import load_card
from harness.formats.maps import write_rowmap
from harness.gate.evaluate import evaluate_gates
from harness.sim.commands import register
from harness.sim.replay import replay_fast
from harness.sim.simulate import _scored, _without_warmup, simulate_cells
from harness.sim.trace_files import load_trace
from harness.sim.traces import concat_traces
from tests.conftest import CliResult, run_cli

POOL = Path(__file__).resolve().parent.parent / "data" / "pools" / "small.jsonl"
CARD = """\
campaign: sim-test
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
  stale: {{knobs: {{policy: frozen, hot_slots: 8}}}}
  adaptive:
    knobs: {{policy: adaptive, hot_slots: 8}}
    env: {{REFBOX_DRAIN_EVERY: 8}}
    live: {{promote_threshold: 1}}
  seeded: {{knobs: {{policy: frozen}}, files: {{rowmap: seed.json}}}}
control: stale
design: {{order: abba, cycles: 2, repeats: 1, cache_states: [warm]}}
analysis: {{window_s: 0.5, converged_span_s: 1, hold_s: 0.2}}
gates:
  - {{kind: counter, counter: swaps, max: 100000}}
  - {{kind: lockstep}}
"""


def _domain_trace(path: Path, first: int, seed: int) -> None:
    """4 layers x 16 experts, top-2: each domain prefers 8 experts (Zipf-like)."""
    rng = np.random.default_rng(seed)
    prefer = (np.arange(16) + first) % 16
    weights = 1.0 / np.arange(1, 17) ** 1.5
    rows = [
        [prefer[rng.choice(16, size=2, replace=False, p=weights / weights.sum())] for _ in range(4)]
        for _ in range(2000)
    ]
    np.save(path, np.array(rows))


def simulate_domains(tmp_path: Path, extra_cells: str = "") -> CliResult:
    """`harness simulate` of the small card over two domains' traces into tmp_path/sim;
    ``extra_cells``: YAML lines (indented two spaces) of cells added after the card's own."""
    _domain_trace(tmp_path / "prose.npy", 0, 1)
    _domain_trace(tmp_path / "code.npy", 8, 2)
    write_rowmap(tmp_path / "seed.json", [list(range(8, 16))] * 4, 16)
    card = CARD.format(pool=POOL).replace("control: stale\n", f"{extra_cells}control: stale\n")
    (tmp_path / "card.yaml").write_text(card)
    return run_cli("simulate", str(tmp_path / "card.yaml"), "--traces",
                   str(tmp_path / "prose.npy"), str(tmp_path / "code.npy"),
                   "--out", str(tmp_path / "sim"))  # fmt: skip


def test_simulated_campaign_is_analysed_and_gated_unchanged(tmp_path: Path) -> None:
    """Every planned run ok, the SIMULATED flag seen, cold shares as replayed, gates evaluated."""
    _domain_trace(tmp_path / "prose.npy", 0, 1)
    _domain_trace(tmp_path / "code.npy", 8, 2)
    write_rowmap(tmp_path / "seed.json", [list(range(8, 16))] * 4, 16)
    (tmp_path / "card.yaml").write_text(CARD.format(pool=POOL))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out_dir = tmp_path / "sim"
    args = parser.parse_args(["simulate", str(tmp_path / "card.yaml"), "--traces",
                              str(tmp_path / "prose.npy"), str(tmp_path / "code.npy"),
                              "--out", str(out_dir)])  # fmt: skip
    out = io.StringIO()
    assert args.handler(args, out) == 0
    assert f"campaign directory: {out_dir}" in out.getvalue()
    assert (out_dir / "SIMULATED").is_file()
    analysis = analyze_campaign(out_dir)
    assert analysis.simulated
    runs = analysis.runs
    assert len(runs) == 16 and (runs["status"] == "ok").all()
    trace = concat_traces([load_trace(tmp_path / "prose.npy"), load_trace(tmp_path / "code.npy")])
    stale = runs[runs["cell"] == "stale"]["cold_share"].unique()
    assert len(stale) == 1 and 0.0 < stale[0] < 1.0
    adaptive = runs[runs["cell"] == "adaptive"]
    assert (adaptive["swaps"] > 0).all() and (adaptive["cold_share"] < stale[0]).all()
    from harness.policy.residency import PolicyKnobs

    expected = replay_fast(
        trace, PolicyKnobs(drain_every=8, promote_threshold=1.0), [list(range(8))] * 4
    )
    assert adaptive["swaps"].iloc[0] == len(expected.swaps)
    shifts = analysis.shifts
    assert set(shifts["to_phase"]) == {"code"}  # untagged traces: one phase per trace, in order
    verdict = evaluate_gates(analysis)
    by_kind = {g.kind: g for g in verdict.gates}
    assert by_kind["counter"].passed and not by_kind["lockstep"].passed


RUN_CARD = """\
campaign: predict
runtime: refbox
prompts:
  pools: [{pool}]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 12
  warmup_requests: 1
  phases:
    - {{name: prose, domains: [en-prose], requests: 2}}
    - {{name: code, domains: [python], requests: 2, shift: true}}
cells:
  adaptive:
    knobs: {{policy: adaptive, hot_slots: 8, drain_every: 4}}
    live: {{promote_threshold: 1}}
  cached: {{knobs: {{cache_records: 48, hotlist_priority: adaptive}}}}
control: adaptive
design: {{order: abba, cycles: 1, repeats: 1, cache_states: [warm, cold]}}
gates:
  - {{kind: exact_outputs, min_match: all}}
"""


def _deltas(root: Path) -> dict[tuple[str, str], dict[str, int]]:
    """The counters delta of each (cell, cache state)'s first run."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for run_dir in sorted((root / "runs").iterdir()):
        record = json.loads((run_dir / "run.json").read_text())
        delta = json.loads((run_dir / "counters.json").read_text())["delta"]
        out.setdefault((record["cell"], record["cache_state"]), delta)
    return out


@pytest.mark.slow
def test_a_trace_collected_as_a_run_predicts_that_run_exactly(tmp_path: Path) -> None:
    """Simulate first, boot second: with `collect --as-run` routing, the simulator's counters
    for every cell and cache state equal what the booted runs measured (a warm run counts after
    its warmup, a cold run has none)."""
    card = tmp_path / "card.yaml"
    card.write_text(RUN_CARD.format(pool=POOL))
    reports = tmp_path / "reports"
    ran = run_cli("run", str(card), "--quiet", "--reports", str(reports), timeout_s=600)
    assert ran.code == 0, ran.stdout + ran.stderr
    (box,) = list(reports.glob("predict/*/plan.json"))
    collected = run_cli("collect", str(card), "--as-run", "-o", str(tmp_path / "col"))
    assert collected.code == 0, collected.stdout + collected.stderr
    trace = load_trace(tmp_path / "col" / "route-trace.jsonl")
    assert (trace.phase == -1).any() and set(np.unique(trace.phase)) == {-1, 0, 1}
    simulated = run_cli(
        "simulate", str(card), "--traces", str(tmp_path / "col" / "route-trace.jsonl"),
        "--out", str(tmp_path / "sim"),
    )  # fmt: skip
    assert simulated.code == 0, simulated.stdout + simulated.stderr
    # The warm-up sits in the simulated ring under the phase the runtime booted with, as in
    # the box's ring, not as a shift of its own (-1 -> prose, never recovered, which hid
    # every cell's T90 from predicted vs measured).
    rings = list((tmp_path / "sim" / "runs").glob("*/ring.parquet"))
    assert rings and all(pd.read_parquet(r)["phase"].min() >= 0 for r in rings)
    shifts = analyze_campaign(tmp_path / "sim").shifts
    assert set(zip(shifts["from_phase"], shifts["to_phase"], strict=True)) == {("prose", "code")}
    measured, predicted = _deltas(box.parent), _deltas(tmp_path / "sim")
    keys = ("tokens", "lookups", "cold_lookups", "hits", "misses", "swaps", "expert_loads")
    assert set(measured) == set(predicted) and len(measured) == 4
    for arm, counted in measured.items():
        assert {k: predicted[arm][k] for k in keys} == {k: counted[k] for k in keys}, arm
    assert measured["adaptive", "warm"]["swaps"] > 0 and measured["cached", "cold"]["misses"] > 0
    # The warmup moved the cache: warm and cold runs differ, and each was predicted.
    assert measured["cached", "warm"]["misses"] != measured["cached", "cold"]["misses"]


def test_an_as_run_trace_runs_the_until_recovered_extension_as_the_run_does(
    tmp_path: Path,
) -> None:
    """A run extends its shift phase, unscored, until the ring shows recovery; an as-run trace
    without that extension missed the steady state the run served after its transient (the
    demo's stale map then predicted 0.64x its measured speed). The trace now carries it: more
    requests in the shift phase than its scored two, ended by the same reading of the ring."""
    text = RUN_CARD.format(pool=POOL).replace(
        "requests: 2, shift: true}", "requests: 2, shift: true, until_recovered: 40}"
    )
    card = tmp_path / "card.yaml"
    card.write_text(text + "analysis: {window_s: 0.2, converged_span_s: 0.5, hold_s: 0.2}\n")
    collected = run_cli("collect", str(card), "--as-run", "-o", str(tmp_path / "col"))
    assert collected.code == 0, collected.stdout + collected.stderr
    # The boot's scratch folder on this machine is gone once its trace is copied out (each
    # one left behind held a gigabyte; 147 of them filled the disk).
    journal = (tmp_path / "col" / "collect.journal.jsonl").read_text().splitlines()
    marks = [json.loads(line).get("mark") for line in journal if '"boot_starting"' in line]
    assert marks and all(mark and not Path(mark).exists() for mark in marks)
    trace = load_trace(tmp_path / "col" / "route-trace.jsonl")
    shift = trace.phase == 1
    requests = np.unique(trace.steps[shift & trace.prefill]).size
    assert 2 < requests <= 42, requests
    # The extension's host steps are noted beside the trace, so a simulation leaves them out
    # of the counters as the run does (its hit rate stays exact) and keeps them in the ring.
    assert trace.unscored and all(trace.steps[0] <= a < b for a, b in trace.unscored)
    extended = np.zeros(trace.rows, dtype=bool)
    for start, end in trace.unscored:
        extended |= (trace.steps >= start) & (trace.steps < end)
    assert extended.any() and (trace.phase[extended] == 1).all()
    # A simulation of it times only the requests a client scores: the extension's host steps
    # are left out of the steps that price the client's TPOT, and only they — also in the
    # replay of a cold run, which starts after the trace's warm-up (so its host-step numbers
    # are not positions, and the extension must survive dropping the warm-up).
    cold = _without_warmup(trace)
    assert cold.rows < trace.rows and cold.unscored == trace.unscored
    (result, *_) = (c.result for c in simulate_cells(load_card(card), cold))
    left_out = np.zeros(len(result.steps), dtype=bool)
    for start, end in trace.unscored:
        left_out |= (result.steps >= start) & (result.steps < end)
    scored = _scored(result)
    assert left_out.any() and not scored[left_out].any()
    assert scored[~left_out & (result.phase >= 0)].all()
