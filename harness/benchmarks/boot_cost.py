"""``harness bench boot-cost``: the time a verdict costs, booting every block against one boot
per cycle.

The seed's queue-rate ladder (``campaigns/queue-rate-ladder.yaml``) on the reference runtime,
each boot slowed by ``--boot-delay-s`` (30 s, 1 s with ``--quick``) so the runtime costs what a
real one does to start, run twice with the same seed: ``design.boot: per-block`` (every run
boots) and ``per-cycle`` (a cycle's blocks on one boot, switched live). Each is a real
``harness run`` from start to verdict; the figure is the ratio of their wall times (target:
per-cycle at least 3x faster), and the two campaigns' labels must agree, comparison for
comparison, with the same verdict. Full size: 2 cycles, 1 repeat per block, every cell; quick:
1 cycle of the control against B1 at a tenth of the workload and a 2 s boot delay, which shows
the path works but is too small for the target (a run's drive is then as long as its boot).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from harness.benchmarks import Figure

_CARD = Path(__file__).resolve().parents[2] / "campaigns" / "queue-rate-ladder.yaml"
TARGET = 3.0


def _variant(
    folder: Path, boot: str, *, cycles: int, boot_delay_s: float, cells: list[str] | None = None
) -> Path:
    """The ladder card with ``boot`` and the boot delay (and only ``cells``, the control
    first), its paths made absolute."""
    card: dict[str, Any] = yaml.safe_load(_CARD.read_text(encoding="utf-8"))
    if cells is not None:
        card["cells"] = {name: card["cells"][name] for name in cells}
    here = _CARD.parent
    card["prompts"]["pools"] = [str(here / p) for p in card["prompts"]["pools"]]
    for cell in card["cells"].values():
        cell["files"] = {k: str(here / v) for k, v in cell.get("files", {}).items()}
        cell.setdefault("knobs", {})["boot_delay_s"] = f"{boot_delay_s:g}"
    card["campaign"] = f"boot-cost-{boot}"
    card["design"].update(boot=boot, cycles=cycles, repeats=1)
    path = folder / f"{boot}.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
    return path


def _run(card: Path, reports: Path, scale: float) -> tuple[float, dict[str, Any], list[str]]:
    """Wall seconds of ``harness run`` to its verdict, the labels, and the gates that failed."""
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
    summary = json.loads((root / "analysis" / "summary.json").read_text(encoding="utf-8"))
    labels = {
        f"{c['cell']} vs {c['vs']} {c['cache_state']} {c['metric']}": c["label"]
        for c in summary["comparisons"]
    }
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    failed = [str(g["name"]) for g in verdict["gates"] if not g["passed"]]
    if not verdict["passed"] and not failed:
        failed = ["runs incomplete"]
    return wall_s, labels, failed


def run_bench(quick: bool = False) -> list[Figure]:
    """Run the ladder per block and per cycle; their wall-time ratio and whether labels agree."""
    cycles, delay_s, scale = (1, 2.0, 0.1) if quick else (2, 30.0, 1.0)
    cells = ["b0-shipped", "b1-2x"] if quick else None
    results = {}
    root = Path(tempfile.mkdtemp(prefix="harness-boot-cost-"))
    for boot in ("per-block", "per-cycle"):
        card = _variant(root, boot, cycles=cycles, boot_delay_s=delay_s, cells=cells)
        results[boot] = _run(card, root / f"reports-{boot}", scale)
    (block_s, block_labels, block_failed), (cycle_s, cycle_labels, cycle_failed) = (
        results["per-block"],
        results["per-cycle"],
    )
    block_pass, cycle_pass = not block_failed, not cycle_failed
    ratio = block_s / cycle_s
    differ = sorted(
        f"{k}: {block_labels[k]} / {cycle_labels.get(k)}"
        for k in block_labels
        if block_labels[k] != cycle_labels.get(k)
    )
    agree = not differ and block_labels.keys() == cycle_labels.keys() and block_pass == cycle_pass
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
        Figure(
            name="labels and verdict agree between the boot designs",
            value=float(agree),
            unit="(1 = all agree)",
            baseline=(
                f"{len(block_labels)} comparisons; verdict "
                f"{'PASS' if block_pass else 'FAIL'} / {'PASS' if cycle_pass else 'FAIL'}"
                + (f"; differ (per-block / per-cycle): {'; '.join(differ)}" if differ else "")
            ),
            target="1",
            passed=agree,
        ),
    ]
