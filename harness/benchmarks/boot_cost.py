"""``harness bench boot-cost``: the time a verdict costs, booting every block against one boot
per cycle.

The seed's queue-rate ladder (``campaigns/queue-rate-ladder.yaml``) on the reference runtime,
each boot slowed by ``boot_delay_s`` (30 s, 2 s with ``--quick``) so the runtime costs what a
real one does to start, run twice with the same seed: ``design.boot: per-block`` (every run
boots) and ``per-cycle`` (a cycle's blocks on one boot, switched live). Each is a real
``harness run`` from start to verdict; the figure is the ratio of their wall times (target:
per-cycle at least 3x faster), and the two campaigns' labels must agree, comparison for
comparison, with the same verdict.

Beside them: whether the *decisions* agree (*better*, *worse* and *within noise* the same;
*inconclusive*, *confounded* and *carry-over* all count as no decision, and which of them an
undecided comparison gets depends on block timing, which the designs change); whether either
design contradicts the other (a different decision, or a decision whose estimate lies outside
the undecided design's interval: the tighter design deciding what the other could not is no
contradiction, two campaigns' noise near a boundary makes it common); and the seconds
saved per boot avoided (boots counted from the journals), beside the boot delay: a boot costs the
delay plus the runtime's own start and stop, and a shared boot pays live resets and washouts
instead, so a saving below the delay means those cost more than the runtime's own start.
The ratio itself moves with the machine: it is (boots + drive) / (fewer boots + the same
drive), so a slower drive lowers it, and on a shared 2-core box the same run's steps take from
8.9 to 13.9 s minutes apart. So a last figure holds the runtime's speed equal: each campaign's
wall time with its runtime's step time (the ring's, the same work in both) replaced by the
mean of the two. It has no target; it says how much of the raw ratio is the design and how much
the machine's speed while each campaign ran.

Full size: the card's cycles (3: the fewest from which a shared boot's timing labels can be
decided, see docs/design.md's crossover model), 1 repeat per block, every cell; quick: 1 cycle
of the control against B1 at a tenth of the workload, shift phases not run on until recovered,
and a 2 s boot delay, which shows the path works but is too small for the target.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.benchmarks import Figure
from harness.formats.records import Journal
from harness.stats.labels import Label

_CARD = Path(__file__).resolve().parents[2] / "campaigns" / "queue-rate-ladder.yaml"
TARGET = 3.0
_NO_DECISION = {Label.INCONCLUSIVE, Label.CONFOUNDED, Label.CARRY_OVER}


def _variant(
    folder: Path,
    boot: str,
    *,
    cycles: int,
    boot_delay_s: float,
    cells: list[str] | None = None,
    quick: bool = False,
) -> Path:
    """The ladder card with ``boot`` and the boot delay (and only ``cells``, the control
    first), its paths made absolute; ``quick``: shift phases end at their requests."""
    card: dict[str, Any] = yaml.safe_load(_CARD.read_text(encoding="utf-8"))
    if cells is not None:
        card["cells"] = {name: card["cells"][name] for name in cells}
    here = _CARD.parent
    card["prompts"]["pools"] = [str(here / p) for p in card["prompts"]["pools"]]
    for cell in card["cells"].values():
        cell["files"] = {k: str(here / v) for k, v in cell.get("files", {}).items()}
        cell.setdefault("knobs", {})["boot_delay_s"] = f"{boot_delay_s:g}"
    if quick:
        # Recovery is not what this compares: a shift phase run on until it recovers adds up
        # to 40 requests a run, the same in both designs, and swamps a quick look's boots.
        for phase in card["workload"]["phases"]:
            phase.pop("until_recovered", None)
    card["campaign"] = f"boot-cost-{boot}"
    card["design"].update(boot=boot, cycles=cycles, repeats=1)
    path = folder / f"{boot}.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
    return path


_Estimate = tuple[float | None, float | None, float | None]


@dataclass(frozen=True)
class _Campaign:
    """What one boot design's ``harness run`` took and concluded."""

    wall_s: float
    labels: dict[str, str]
    estimates: dict[str, _Estimate]  # ratio and its interval, per comparison
    failed: list[str]  # the gates that failed
    boots: int  # from the journal
    runs: int
    step_s: float  # the runtime's own step time, summed over the runs' rings


def _run(card: Path, reports: Path, scale: float) -> _Campaign:
    """Run ``harness run`` to its verdict and read its campaign directory."""
    argv = [sys.executable, "-m", "harness", "run", str(card), "--reports", str(reports)]
    start = time.perf_counter()
    done = subprocess.run(
        [*argv, "--quiet", "--scale", f"{scale:g}"], capture_output=True, text=True, check=False
    )
    wall_s = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: a gate failed, which is still a verdict
        raise RuntimeError(
            f"{card.name}: harness run exited {done.returncode}: {done.stderr[-800:]}"
        )
    [root] = [p.parent for p in reports.glob("*/*/verdict.json")]
    return _read(root, wall_s)


def _read(root: Path, wall_s: float) -> _Campaign:
    """A finished campaign directory's labels, gates, boots and rings."""
    summary = json.loads((root / "analysis" / "summary.json").read_text(encoding="utf-8"))
    labels, estimates = {}, {}
    for c in summary["comparisons"]:
        key = f"{c['cell']} vs {c['vs']} {c['cache_state']} {c['metric']}"
        labels[key] = str(c["label"])
        estimates[key] = (c.get("ratio"), c.get("ci_low"), c.get("ci_high"))
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    failed = [str(g["name"]) for g in verdict["gates"] if not g["passed"]]
    if not verdict["passed"] and not failed:
        failed = ["runs incomplete"]
    boots = sum(e["event"] == "boot" for e in Journal(root / "journal.jsonl").events())
    rings = sorted((root / "runs").glob("*/ring.parquet"))
    step_ns = sum(int(pd.read_parquet(r, columns=["dur_ns"])["dur_ns"].sum()) for r in rings)
    return _Campaign(wall_s, labels, estimates, failed, boots, len(rings), step_ns * 1e-9)


def _decision(label: str | None) -> str | None:
    return "no decision" if label in _NO_DECISION else label


def _contradicts(key: str, one: _Campaign, other: _Campaign) -> bool:
    """Whether ``one`` decided ``key`` in a way ``other`` rules out: a different decision, or,
    where ``other`` decided nothing, an estimate outside ``other``'s interval."""
    mine, theirs = _decision(one.labels.get(key)), _decision(other.labels.get(key))
    if mine in (None, "no decision"):
        return False
    if theirs != "no decision":
        return mine != theirs
    ratio = one.estimates[key][0]
    _, low, high = other.estimates.get(key, (None, None, None))
    if ratio is None or low is None or high is None:
        return False  # no interval: the other design rules nothing out
    return not low <= ratio <= high


def _agreement(name: str, agree: bool, baseline: str) -> Figure:
    return Figure(
        name=name,
        value=float(agree),
        unit="(1 = all agree)",
        baseline=baseline,
        target="1",
        passed=agree,
    )


def run_bench(quick: bool = False) -> list[Figure]:
    """Run the ladder per block and per cycle; their wall-time ratio and whether labels agree."""
    card_cycles = int(yaml.safe_load(_CARD.read_text(encoding="utf-8"))["design"]["cycles"])
    cycles, delay_s, scale = (1, 2.0, 0.1) if quick else (card_cycles, 30.0, 1.0)
    cells = ["b0-shipped", "b1-2x"] if quick else None
    results: dict[str, _Campaign] = {}
    root = Path(tempfile.mkdtemp(prefix="harness-boot-cost-"))
    for boot in ("per-block", "per-cycle"):
        card = _variant(root, boot, cycles=cycles, boot_delay_s=delay_s, cells=cells, quick=quick)
        results[boot] = _run(card, root / f"reports-{boot}", scale)
    block, cycle = results["per-block"], results["per-cycle"]
    block_s, block_labels, block_failed = block.wall_s, block.labels, block.failed
    cycle_s, cycle_labels, cycle_failed = cycle.wall_s, cycle.labels, cycle.failed
    block_pass, cycle_pass = not block_failed, not cycle_failed
    ratio = block_s / cycle_s
    differ = sorted(
        f"{k}: {block_labels[k]} / {cycle_labels.get(k)}"
        for k in block_labels
        if block_labels[k] != cycle_labels.get(k)
    )
    same_runs = block_labels.keys() == cycle_labels.keys() and block_pass == cycle_pass
    agree = not differ and same_runs
    decided_differ = [
        k for k in block_labels if _decision(block_labels[k]) != _decision(cycle_labels.get(k))
    ]
    decisions_agree = not decided_differ and same_runs
    contradicted = sorted(
        k for k in block_labels if _contradicts(k, block, cycle) or _contradicts(k, cycle, block)
    )
    avoided = block.boots - cycle.boots
    per_boot = (block_s - cycle_s) / avoided if avoided > 0 else float("nan")
    steps_s = (block.step_s + cycle.step_s) / 2
    equal_speed = (block_s - block.step_s + steps_s) / (cycle_s - cycle.step_s + steps_s)
    if agree:
        shutil.rmtree(root, ignore_errors=True)
    else:
        # Kept, so the disagreement can be read in both campaigns' reports.
        differ.append(f"failed gates: {block_failed or 'none'} / {cycle_failed or 'none'}")
        differ.append(f"both campaigns kept under {root}")
    size = f"{cycles} cycle(s), {delay_s:g} s boot delay, scale {scale:g}"
    if cells is not None:
        size += f", cells {' and '.join(cells)}"
    return [
        Figure(
            name="queue-rate ladder to its verdict: per-cycle boots over per-block",
            value=ratio,
            unit="x faster",
            baseline=f"per-block {block_s:.1f} s vs per-cycle {cycle_s:.1f} s ({size})",
            target="" if quick else f">= {TARGET:g}x",
            passed=None if quick else ratio >= TARGET,
        ),
        _agreement(
            "labels and verdict agree between the boot designs",
            agree,
            f"{len(block_labels)} comparisons; verdict "
            f"{'PASS' if block_pass else 'FAIL'} / {'PASS' if cycle_pass else 'FAIL'}"
            + (f"; differ (per-block / per-cycle): {'; '.join(differ)}" if differ else ""),
        ),
        _agreement(
            "decisions agree (undecided labels count alike)",
            decisions_agree,
            f"{len(block_labels) - len(decided_differ)} of {len(block_labels)} comparisons"
            + (f"; differ: {'; '.join(decided_differ)}" if decided_differ else ""),
        ),
        _agreement(
            "no contradictions (a decision the other design rules out)",
            not contradicted and same_runs,
            f"{len(block_labels) - len(contradicted)} of {len(block_labels)} comparisons"
            + (f"; contradicted: {'; '.join(contradicted)}" if contradicted else ""),
        ),
        Figure(
            name="wall time saved per boot avoided",
            value=per_boot,
            unit="s",
            baseline=f"a {delay_s:g} s boot delay; {block.boots} boots vs {cycle.boots}",
        ),
        Figure(
            name="the same ratio at equal runtime speed",
            value=equal_speed,
            unit="x faster",
            baseline=(
                f"runtime steps {block.step_s / max(block.runs, 1):.2f} s a run per-block vs "
                f"{cycle.step_s / max(cycle.runs, 1):.2f} s per-cycle, both set to their mean"
            ),
        ),
    ]
