"""``harness bench predict``: simulate first, boot second — how wrong the desk was.

On the reference runtime, the way seed 000 meant it: run the demo (``campaigns/demo.yaml``) and
fit a host step's cost from its rings (``harness fit-cost``); then, for a second demo campaign
and for the queue-rate ladder (other maps, other knobs, other phases, other expert sizes),
collect one run's routing (``harness collect --as-run``), simulate the card with the fitted
cost (``harness simulate --cost``) *before* running it, run it, and read the predicted against
the measured from its analysis. Every step is a real command on a real runtime.

Figures, per campaign and cell: predicted ÷ measured ring decode speed and step p50, and the
client's decode tok/s and TPOT p50 (the fit's HTTP path added to each request's steps; target
within 10%), the cell's speed against the control predicted ÷ measured (what a decision reads;
it holds when the machine runs at another speed than when the cost was fitted, which absolute
speeds do not), T90 (within 25% or 2 s); for the ladder, the cell pairs whose speed order the
prediction got right, beside a reading of how many of those pairs the box itself could tell
apart (its speeds differ by more than the prediction's own error): a pair the box cannot
separate is a coin toss for any desk.

Full size: both cards at their own scale and cycles (about 15 minutes on two cores); quick:
the fit's demo at ``--scale 0.25`` and three cells of the ladder at 0.1 (the control, B2 and the
stale companion: enough for the pair figures) each run once in turn, shift phases run on at most 4
requests until recovered, the second demo left out (a few minutes: it shows the path works, at
sizes too small for the targets).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from harness.analyze.campaign import analyze_campaign
from harness.analyze.predicted import Prediction
from harness.benchmarks import Figure
from harness.sim.cost_fit import fit_cost, write_cost
from harness.sim.run_cost_fit import RunCostFit, fit_run_cost, predict_run_speed

_CARDS = Path(__file__).resolve().parents[2] / "campaigns"
SPEED_TARGET = 0.10
T90_TARGET, T90_SLACK_S = 0.25, 2.0
QUICK_LADDER = ["b0-shipped", "b2-4x", "stale-b0"]
QUICK_RECOVERY_CAP = 4  # requests a quick look's shift phase may run on


def _card(
    folder: Path, name: str, campaign: str, cycles: int | None, cells: list[str] | None = None
) -> Path:
    """A shipped card with its paths made absolute (and fewer cycles, and only ``cells``, the
    control first, for a quick look)."""
    source = _CARDS / f"{name}.yaml"
    card: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    if cells is not None:
        card["cells"] = {cell: card["cells"][cell] for cell in cells}
    card["prompts"]["pools"] = [str(_CARDS / p) for p in card["prompts"]["pools"]]
    for cell in card["cells"].values():
        cell["files"] = {k: str(_CARDS / v) for k, v in cell.get("files", {}).items()}
    card["campaign"] = campaign
    if cycles is not None:
        card["design"]["cycles"] = cycles
        card["design"].pop("max_cycles", None)
        card["design"]["sequential"] = False
        # A shift phase's extension does not shrink with --scale: uncapped, a quick look's
        # runs are mostly requests run on until recovered (a T90 it then may not measure).
        for phase in card["workload"]["phases"]:
            if phase.get("until_recovered"):
                phase["until_recovered"] = min(phase["until_recovered"], QUICK_RECOVERY_CAP)
        if cells is not None:
            # Each cell once, in turn: the figures read cell medians, not the ladder's pairs.
            card["design"]["order"] = "sequential"
    path = folder / f"{campaign}.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
    return path


def _harness(*argv: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, check=False
    )
    if done.returncode not in (0, 1):  # 1: a gate failed or undecided, still a campaign
        raise RuntimeError(f"harness {argv[0]} exited {done.returncode}: {done.stderr[-800:]}")


def _run(card: Path, reports: Path, scale: float) -> Path:
    _harness("run", str(card), "--reports", str(reports), "--quiet", "--scale", f"{scale:g}")
    campaign = str(yaml.safe_load(card.read_text(encoding="utf-8"))["campaign"])
    roots: list[Path] = [p.parent for p in (reports / campaign).glob("*/verdict.json")]
    return roots[0]


def _ratio_figure(campaign: str, row: Prediction, label: str) -> Figure:
    ratio = row.ratio if row.ratio is not None else math.nan
    if not math.isfinite(ratio):
        label += " not measured"
    ok = math.isfinite(ratio) and abs(ratio - 1.0) <= SPEED_TARGET
    inside = {True: "inside", False: "outside", None: "no interval"}[row.within]
    return Figure(
        f"{campaign} {row.cell}: {label}, predicted ÷ measured",
        ratio,
        "x",
        f"predicted {row.predicted:.4g} [{row.low or math.nan:.4g}, {row.high or math.nan:.4g}]"
        f", measured {row.measured:.4g} ({inside} the interval)"
        if row.predicted is not None and row.measured is not None
        else "a side is missing",
        f"within {SPEED_TARGET:.0%}",
        ok,
    )


def _relative_figure(campaign: str, row: Prediction) -> Figure:
    """The cell's speed against the control, predicted ÷ measured: what a decision reads, and
    what holds when the box runs at another speed than when the cost was fitted."""
    ratio = row.relative_ratio if row.relative_ratio is not None else math.nan
    return Figure(
        f"{campaign} {row.cell}: ring decode tok/s ÷ control, predicted ÷ measured",
        ratio,
        "x",
        f"predicted {row.predicted_vs_control:.4g}x the control, measured "
        f"{row.measured_vs_control:.4g}x",
        f"within {SPEED_TARGET:.0%}",
        math.isfinite(ratio) and abs(ratio - 1.0) <= SPEED_TARGET,
    )


def _t90_figure(campaign: str, row: Prediction) -> Figure:
    if row.predicted is None or row.measured is None:
        return Figure(f"{campaign} {row.cell}: T90 not measured", math.nan, "s",
                      "a side has no T90 (never, or no excess)", "", None)  # fmt: skip
    error = row.predicted - row.measured
    allowed = max(T90_TARGET * row.measured, T90_SLACK_S)
    band = "" if row.low is None else f" [{row.low:.3g}, {_open(row.high)}]"
    inside = {True: "inside", False: "outside", None: "no interval"}[row.within]
    return Figure(
        f"{campaign} {row.cell}: T90, predicted − measured",
        error,
        "s",
        f"predicted {row.predicted:.3g} s{band}, measured {row.measured:.3g} s ({inside})",
        f"within {T90_TARGET:.0%} or {T90_SLACK_S:g} s",
        abs(error) <= allowed,
    )


def _open(high: float | None) -> str:
    return "open" if high is None else f"{high:.3g}"


def _pairs(campaign: str, rows: list[Prediction]) -> list[Figure]:
    """Cell pairs whose speed order the prediction got right, and how many the box resolved."""
    speed = [r for r in rows if r.metric == "ring_decode_tok_s" and r.ratio is not None]
    errors = [abs(math.log(r.ratio)) for r in speed if r.ratio]
    noise = max(errors, default=0.0)
    held = total = resolved = resolved_held = 0
    for i, a in enumerate(speed):
        for b in speed[i + 1 :]:
            assert a.predicted is not None and b.predicted is not None
            assert a.measured is not None and b.measured is not None
            right = (a.predicted > b.predicted) == (a.measured > b.measured)
            total += 1
            held += right
            if abs(math.log(a.measured / b.measured)) > noise:
                resolved += 1
                resolved_held += right
    return [
        Figure(f"{campaign}: speed order, pairs held", float(held), f"of {total}", "", "", None),
        Figure(
            f"{campaign}: speed order, pairs held where the box's difference exceeds the "
            "prediction's largest error",
            float(resolved_held),
            f"of {resolved}",
            f"largest error {math.expm1(noise):.1%}",
            f"all {resolved}",
            resolved_held == resolved,
        ),
    ]


def _per_run_figures(
    campaign: str, fit: RunCostFit, simulated: Path, rows: list[Prediction]
) -> list[Figure]:
    """The per-run fit (what a ring-less runtime gets) priced on the simulated campaign's
    counters, against the measured client decode speed: predicted ÷ measured per cell."""
    (sibling,) = sorted(simulated.iterdir())[-1:]
    measured = {r.cell: r.measured for r in rows if r.metric == "decode_tok_s"}
    deltas: dict[str, dict[str, Any]] = {}
    for run in sorted(sibling.glob("runs/*/run.json")):
        cell = json.loads(run.read_text(encoding="utf-8"))["cell"]
        counters = json.loads((run.parent / "counters.json").read_text(encoding="utf-8"))
        deltas.setdefault(cell, counters["delta"])  # a simulation's runs of a cell are alike
    figures = []
    for cell, value in measured.items():
        delta = deltas.get(cell)
        if delta is None or value is None:
            continue
        band = predict_run_speed(fit, delta).get("decode_tok_s")
        if band is None:
            continue
        row = Prediction("decode_tok_s", cell, band["estimate"], value, band["low"], band["high"])
        figures.append(_ratio_figure(campaign, row, "client decode tok/s from the per-run fit"))
    return figures


def run_bench(quick: bool = False) -> list[Figure]:
    """Fit from the demo, predict a second demo and the ladder before running them."""
    # Quick: the ladder at a tenth, its runs still a few requests a phase.
    scale, predicted_scale = (0.25, 0.1) if quick else (1.0, 1.0)
    demo_cycles, ladder_cycles = (1, 1) if quick else (None, None)
    root = Path(tempfile.mkdtemp(prefix="harness-predict-"))
    figures: list[Figure] = []
    try:
        fitted = _run(_card(root, "demo", "fit-demo", demo_cycles), root / "fit", scale)
        fit = fit_cost(fitted)
        write_cost(fit, root / "cost.json")
        figures.append(Figure("fit: R²", fit.r2, "", f"{fit.steps:,} steps of {fit.runs} runs"))
        per_run = fit_run_cost(fitted)
        figures.append(Figure("per-run fit: R²", per_run.r2, "", f"{per_run.runs} runs"))
        predicted_cards: list[tuple[str, str, int | None, list[str] | None]] = [
            ("demo", "demo", demo_cycles, None),
            ("queue-rate-ladder", "queue-rate-ladder", ladder_cycles, None),
        ]
        if quick:
            predicted_cards = [("queue-rate-ladder", "queue-rate-ladder", 1, QUICK_LADDER)]
        for name, campaign, cycles, cells in predicted_cards:
            card = _card(root, name, campaign, cycles, cells)
            reports = root / "reports"
            trace = root / f"asrun-{campaign}"
            _harness("collect", str(card), "--as-run", "--scale", f"{predicted_scale:g}",
                     "-o", str(trace))  # fmt: skip
            _harness("simulate", str(card), "--traces", str(trace / "route-trace.jsonl"),
                     "--reports", str(reports), "--cost", str(root / "cost.json"))  # fmt: skip
            measured = _run(card, reports, predicted_scale)
            predicted = analyze_campaign(measured).seed_tables.predicted
            if predicted is None:
                raise RuntimeError(f"{campaign}: the analysis found no prediction beside it")
            rows = list(predicted.rows)
            for row in rows:
                if row.metric == "ring_decode_tok_s":
                    figures.append(_ratio_figure(campaign, row, "ring decode tok/s"))
                    if row.relative_ratio is not None and row.measured_vs_control != 1.0:
                        figures.append(_relative_figure(campaign, row))
                elif row.metric == "ring_itl_p50_ms":
                    figures.append(_ratio_figure(campaign, row, "step p50"))
                elif row.metric == "decode_tok_s":
                    figures.append(_ratio_figure(campaign, row, "client decode tok/s"))
                elif row.metric == "tpot_p50_ms":
                    figures.append(_ratio_figure(campaign, row, "client TPOT p50"))
                elif row.metric == "t90_s":
                    figures.append(_t90_figure(campaign, row))
            if len({r.cell for r in rows}) > 2:
                figures.extend(_pairs(campaign, rows))
            figures.extend(_per_run_figures(campaign, per_run, reports / f"{campaign}-sim", rows))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures
