"""``harness bench report``: render the report of a synthetic 100-run campaign.

The campaign is made by duplicating the runs of a real one (the newest ``reports/demo/*`` under
the current directory, else a tiny campaign run here with the reference runtime) into a temp
directory with a matching plan and a journal of its own, sealed as the runner seals one: runs
keep their real records, with request timings perturbed so the cycles differ. The figure is
render time with figures against the same page with figures disabled (the baseline), plus the
HTML size. Targets (issue 6): under 15 s and 10 MB for 100 runs.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.benchmarks import Figure
from harness.formats.records import CAMPAIGN_JOURNAL, Journal

TARGET_S = 15.0
TARGET_MB = 10.0
TINY_CARD = """\
campaign: bench-report
description: source runs for the report benchmark
box: local
runtime: refbox
prompts:
  pools: [pool.jsonl]
  fit: {split: fit}
  heldout: {split: heldout}
workload:
  max_tokens: 16
  warmup_requests: 0
  phases:
    - {name: prose, domains: [en-prose], requests: 4}
    - {name: code, domains: [python], requests: 4, shift: true}
cells:
  control: {knobs: {policy: frozen}}
  adaptive: {knobs: {policy: adaptive}}
control: control
design: {order: abba, cycles: 1, repeats: 1, cache_states: [warm], seed: 3}
analysis: {window_s: 0.5, converged_span_s: 1, hold_s: 0.5}
gates:
  - {kind: exact_outputs, min_match: all}
  - {kind: better, metric: decode_tok_s}
"""
TINY_POOL = [
    {
        "id": "en-held-1",
        "domain": "en-prose",
        "split": "heldout",
        "prompt": "She opened the ledger.",
    },
    {"id": "en-held-2", "domain": "en-prose", "split": "heldout", "prompt": "By noon the square."},
    {"id": "py-held-1", "domain": "python", "split": "heldout", "prompt": "import os\nfor p in"},
    {"id": "py-held-2", "domain": "python", "split": "heldout", "prompt": "def parse(line):\n"},
    {"id": "en-fit-1", "domain": "en-prose", "split": "fit", "prompt": "The river ran low."},
]


def source_campaign(work: Path) -> Path:
    """A real campaign directory to duplicate: the newest demo one, else a tiny fresh run."""
    demos = sorted(p for p in Path("reports/demo").glob("*") if (p / "plan.json").is_file())
    if demos:
        return demos[-1]
    from harness.card import load_card
    from harness.execute.campaign import new_campaign_dir
    from harness.execute.progress import make_progress
    from harness.execute.run import CampaignRunner
    from harness.plan.build import build_plan

    cards = work / "source-card"
    cards.mkdir(parents=True)
    (cards / "pool.jsonl").write_text("\n".join(json.dumps(p) for p in TINY_POOL) + "\n")
    (cards / "card.yaml").write_text(TINY_CARD)
    loaded = load_card(cards / "card.yaml")
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, work / "source")
    with make_progress(plan, quiet=True, out=io.StringIO()) as progress:
        CampaignRunner(loaded, plan, campaign, progress).execute()
    root: Path = campaign.root
    return root


def synthesise(source: Path, dest: Path, n_runs: int, seed: int = 0) -> Path:
    """A campaign of ``n_runs`` runs (ABBA/BAAB cycles) built from ``source``'s run records."""
    rng = np.random.default_rng(seed)
    plan = json.loads((source / "plan.json").read_text())
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for run in plan["runs"]:
        if (source / "runs" / run["run_id"] / "run.json").is_file():
            by_cell.setdefault(run["cell"], []).append(run)
    card_text = (source / "card.yaml").read_text()
    template = [r for r in plan["runs"] if r["cycle"] == 0]
    per_cycle = len(template)
    cycles = math.ceil(n_runs / per_cycle)
    root: Path = dest / "reports" / str(plan["campaign"]) / "20000101T000000Z"
    root.mkdir(parents=True)
    for name in ("card.yaml", "card.path"):
        if (source / name).is_file():
            shutil.copy2(source / name, root / name)
    (root / "card.yaml").write_text(_with_cycles(card_text, cycles))
    shutil.copytree(source / "boxes", root / "boxes", dirs_exist_ok=True)
    runs = []
    index = 0
    for cycle in range(cycles):
        mirror = cycle % 2 == 1  # BAAB after ABBA: the arms swap slots
        for base in template:
            slot = base["slot"]
            cell = base["cell"]
            if mirror:
                others = [r["cell"] for r in template if r["cell"] != cell]
                cell = others[0] if others else cell
            pattern = (
                base["pattern"]
                if not mirror
                else base["pattern"][::-1].translate(str.maketrans("AB", "BA"))
            )
            run_id = f"{index:04d}-{cell}-c{cycle}-{base['cache_state']}-s{slot}-r{base['repeat']}"
            run = {**base, "run_id": run_id, "cell": cell, "cycle": cycle, "pattern": pattern}
            run["arm"] = "A" if cell == plan["runs"][0]["cell"] else "B"
            source_run = by_cell[cell][index % len(by_cell[cell])]
            _copy_run(source / "runs" / source_run["run_id"], root / "runs" / run_id, run, rng)
            runs.append(run)
            index += 1
    (root / "plan.json").write_text(json.dumps({**plan, "runs": runs}, indent=2))
    # A journal of its own, sealed as the runner seals one: the source's names other runs.
    journal = Journal(root / CAMPAIGN_JOURNAL)
    journal.append("campaign_start", campaign=plan["campaign"], runs=len(runs))
    for box in sorted((root / "boxes").glob("*.json")):
        journal.seal_file(box)
    for run in runs:
        journal.append("run_done", run_id=run["run_id"])
    return root


def _with_cycles(card_text: str, cycles: int) -> str:
    """The card with a fixed design of ``cycles`` cycles: a sequential source (the demo is one)
    would otherwise claim a ``max_cycles`` below the synthetic campaign's cycles."""
    import yaml

    card = yaml.safe_load(card_text)
    design = card.setdefault("design", {})
    for key in ("sequential", "max_cycles", "look_every"):
        design.pop(key, None)
    design["cycles"] = cycles
    return str(yaml.safe_dump(card, sort_keys=False))


def _copy_run(src: Path, dst: Path, run: dict[str, Any], rng: np.random.Generator) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("route-trace.jsonl", "server.log"))
    record = json.loads((src / "run.json").read_text())
    record.update({k: run[k] for k in ("run_id", "cell", "cycle", "slot", "pattern")})
    (dst / "run.json").write_text(json.dumps(record, indent=2))
    requests = pd.read_parquet(src / "requests.parquet")
    scale = float(rng.lognormal(0.0, 0.05))  # a block-level speed change, as on a real box
    for column in ("ttft_s", "e2el_s"):
        requests[column] = requests[column] * scale
    requests["cell"] = run["cell"]
    requests.to_parquet(dst / "requests.parquet", index=False)


def run_bench(quick: bool) -> list[Figure]:
    """Render time and size of the report of a 100-run campaign (20 with ``quick``)."""
    from harness.analyze.campaign import analyze_campaign
    from harness.gate.evaluate import evaluate_gates
    from harness.report import render_report

    n_runs = 20 if quick else 100
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        work = Path(tmp)
        root = synthesise(source_campaign(work), work / "synthetic", n_runs)
        started = time.perf_counter()
        analysis = analyze_campaign(root)
        verdict = evaluate_gates(analysis)
        analyze_s = time.perf_counter() - started
        # Warm-up: imports (matplotlib, jinja2) and template compilation are paid once, untimed.
        render_report(root, analysis, verdict, figures=False)
        started = time.perf_counter()
        render_report(root, analysis, verdict, figures=False)
        baseline_s = time.perf_counter() - started
        baseline_bytes = (root / "report.html").stat().st_size
        started = time.perf_counter()
        path = render_report(root, analysis, verdict)
        render_s = time.perf_counter() - started
        size_mb = path.stat().st_size / 1e6
    scale = 1.0 if n_runs == 100 else None
    return [
        Figure(
            f"render_{n_runs}_runs",
            render_s,
            "s",
            baseline=f"{baseline_s:.2f} s without figures ({render_s / baseline_s:.1f}x)",
            target=f"< {TARGET_S:g} s at 100 runs" if scale else "",
            passed=render_s < TARGET_S if scale else None,
        ),
        Figure(
            "render_vs_no_figures",
            render_s / baseline_s,
            "x",
            baseline="the same template with figures disabled",
        ),
        Figure(
            f"html_size_{n_runs}_runs",
            size_mb,
            "MB",
            baseline=f"{baseline_bytes / 1e6:.2f} MB without figures",
            target=f"< {TARGET_MB:g} MB at 100 runs" if scale else "",
            passed=size_mb < TARGET_MB if scale else None,
        ),
        Figure(f"analyze_and_gate_{n_runs}_runs", analyze_s, "s", baseline="context, not rendered"),
    ]
