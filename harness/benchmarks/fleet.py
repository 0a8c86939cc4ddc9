"""``harness bench fleet``: one 16-run campaign on one box and on a fleet of two, side by side.

The card is a light reference-runtime A/B (a 2-layer, 8-expert model, 4 prompts of 16 tokens
a run, 4 mirrored cycles: 16 runs; ``--quick``: 2 cycles, 8 runs). It runs on the local box,
then on two local "boxes" (the local box twice, each with its own folder and ports), through
:class:`FleetRunner` as ``harness run`` does; the full benchmark repeats the pair in the
mirrored order (one, two, two, one) so drift in the machine's load cancels. The figure is the
wall-time ratio one box ÷ two boxes (target ≥ 1.7× on two cores), with the load average before
and after: a busy machine lowers it. Each campaign's records are checked complete.

Where ``sinfo`` answers (a Slurm cluster this user submits to, ``SLURM_CONF`` honoured), it also
measures the scheduling overhead per cohort: four trivial jobs as one array, the way cohorts
are submitted, from sbatch to each job's first log line and to the harness starting on the node.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness.benchmarks import Figure
from harness.benchmarks.report import TINY_POOL

TARGET = 1.7
CARD = """\
campaign: bench-fleet
description: a light A/B for the fleet benchmark
{boxes}
runtime: refbox
prompts:
  pools: [pool.jsonl]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 16
  warmup_requests: 0
  phases:
    - {{name: prose, domains: [en-prose], requests: 2}}
    - {{name: code, domains: [python], requests: 2, shift: true}}
cells:
  control:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8", REFBOX_HOT_SLOTS: "4",
          REFBOX_EXPERT_BYTES: "4096"}}
  wide:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8", REFBOX_HOT_SLOTS: "8",
          REFBOX_EXPERT_BYTES: "4096"}}
control: control
design: {{order: abba, cycles: {cycles}, repeats: 1, cache_states: [warm], seed: 3, retries: 0}}
analysis: {{window_s: 0.5, converged_span_s: 1, hold_s: 0}}
"""


def _campaign_s(work: Path, boxes: str, tag: str, cycles: int) -> float:
    """Seconds to run the card on ``boxes`` (a card line), checked complete."""
    from harness.card import load_card
    from harness.execute.campaign import new_campaign_dir
    from harness.execute.fleet import FleetRunner
    from harness.execute.progress import make_progress
    from harness.plan.build import build_plan

    folder = work / tag
    folder.mkdir()
    (folder / "pool.jsonl").write_text("\n".join(json.dumps(p) for p in TINY_POOL) + "\n")
    (folder / "card.yaml").write_text(CARD.format(boxes=boxes, cycles=cycles))
    loaded = load_card(folder / "card.yaml")
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, folder / "reports")
    start = time.perf_counter()
    with make_progress(plan, quiet=True, out=io.StringIO()) as progress:
        outcome = FleetRunner(loaded, plan, campaign, progress).execute()
    elapsed = time.perf_counter() - start
    if outcome.failed or len(outcome.done) != len(plan.runs):
        raise AssertionError(f"bench fleet: {tag}: runs failed: {outcome.failed}")
    shutil.rmtree(campaign.root / "box", ignore_errors=True)
    return elapsed


def run_bench(quick: bool = False) -> list[Figure]:
    """Time the campaign on one box and on two; quick: one pair of 8-run campaigns, else a
    mirrored pair of pairs of 16-run campaigns."""
    order = ["one", "two"] if quick else ["one", "two", "two", "one"]
    cycles = 2 if quick else 4
    lines = {"one": "box: local", "two": "boxes: [{name: left}, {name: right}]"}
    totals = {"one": 0.0, "two": 0.0}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for index, which in enumerate(order):
            totals[which] += _campaign_s(Path(tmp), lines[which], f"{index}-{which}", cycles)
    load_after = os.getloadavg()
    ratio = totals["one"] / totals["two"]
    repeats = order.count("one")
    busy = (
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after, "
        f"on {os.cpu_count()} CPUs"
    )
    figures: list[Figure] = [
        Figure(
            name=f"{cycles * 4}-run campaign: wall time on one box / on two boxes",
            value=ratio,
            unit="x",
            baseline=f"one box {totals['one'] / repeats:.1f} s, two boxes "
            f"{totals['two'] / repeats:.1f} s (mean of {repeats}); {busy}",
            target=f">= {TARGET}x on two cores",
            passed=ratio >= TARGET,
        ),
        Figure(name="two-box campaign wall time", value=totals["two"] / repeats, unit="s"),
    ]
    figures.extend(_slurm_figures())
    return figures


def _slurm_figures() -> list[Figure]:
    """Submit to first log line per cohort, on the cluster ``sinfo`` answers for (if any)."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return [_not_measured("no sinfo/sbatch on this machine")]
    import subprocess

    from harness.errors import HarnessError
    from harness.execute.slurm.latency import measure_overhead
    from harness.profiles.box import BoxSpec

    try:
        answer = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return [_not_measured(f"sinfo: {exc}")]
    if answer.returncode != 0:
        first = (answer.stderr.strip().splitlines() or ["no output"])[0][:120]
        return [_not_measured(f"no cluster answers sinfo ({first}); set SLURM_CONF")]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-slurm-") as shared:
        spec = BoxSpec(kind="slurm", shared_dir=shared, python=sys.executable, setup=[
            f"export PYTHONPATH={Path(__file__).resolve().parents[2]}"
        ])  # fmt: skip
        try:
            overhead = measure_overhead("bench", spec, jobs=4)
        except HarnessError as exc:
            return [_not_measured(str(exc)[:200])]
    spread = ", ".join(f"{s:.2f}" for s in overhead.first_line_s)
    return [
        Figure(
            name="slurm: submit to the job's first log line per cohort (median of 4, one array)",
            value=overhead.median_first_line_s,
            unit="s",
            baseline=f"each job {spread} s; the default partition",
        ),
        Figure(
            name="slurm: submit to the harness starting on the node (median)",
            value=overhead.median_harness_s,
            unit="s",
        ),
    ]


def _not_measured(why: str) -> Figure:
    return Figure(
        name=f"slurm: submit to first log line per cohort (not measured: {why})",
        value=float("nan"),
        unit="s",
    )
