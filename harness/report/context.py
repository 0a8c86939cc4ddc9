"""Everything the report template shows, computed from the analysis and the verdict.

Values are kept twice where a reviewer reads them: the raw number (``value``), so tests can check
the report against the analysis, and the text shown (``text``), formatted with its unit. The
template does no arithmetic; every decision about what applies is made here.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.campaign import CampaignAnalysis
from harness.card import Card, Cell
from harness.catalog import METRICS
from harness.errors import HarnessError
from harness.gate import Verdict
from harness.report import fmt

# Labels of the statistics, in the order a reviewer weighs them, with their CSS class.
LABEL_CLASS = {
    "better": "good",
    "worse": "bad",
    "within noise": "neutral",
    "inconclusive": "warn",
    "confounded": "warn",
}
# Raw files a run folder may hold, linked from the provenance section.
RUN_FILES = (
    "run.json",
    "requests.parquet",
    "chunks.parquet",
    "ring.parquet",
    "counters.json",
    "server.log",
)
CAMPAIGN_FILES = (
    "card.yaml",
    "plan.json",
    "journal.jsonl",
    "verdict.json",
    "verdict.junit.xml",
    "analysis/summary.json",
)
EXAMPLE_OUTPUTS = 3  # outputs shown per prompt and cell for an exact-output mismatch


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    if frame.empty:
        return []
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def _median(values: Iterable[Any]) -> float | None:
    clean = [v for v in (fmt.finite(x) for x in values) if v is not None]
    return float(np.median(clean)) if clean else None


def _keys(analysis: CampaignAnalysis) -> list[tuple[str, str]]:
    """(cell, cache state) pairs in card order."""
    card = analysis.card
    return [(cell, state) for cell in card.cells for state in card.design.cache_states]


def _key_name(analysis: CampaignAnalysis, cell: str, state: str) -> str:
    return cell if len(analysis.card.design.cache_states) == 1 else f"{cell} / {state}"


def _cell_value(analysis: CampaignAnalysis, cell: str, state: str, column: str) -> float | None:
    cells = analysis.cells
    if cells.empty or column not in cells.columns:
        return None
    hit = cells[(cells["cell"] == cell) & (cells["cache_state"] == state)]
    return None if hit.empty else fmt.finite(hit[column].iloc[0])


# ---- verdict ---------------------------------------------------------------------------------


def _evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """Short evidence lines: one per key, values abbreviated; long maps summarised."""
    lines: list[str] = []
    for key, value in evidence.items():
        if isinstance(value, dict) and len(value) > 6:
            numbers = [fmt.finite(v) for v in value.values()]
            shown = [n for n in numbers if n is not None]
            summary = f"{len(value)} entries"
            if shown:
                summary += f", min {fmt.num(min(shown))}, max {fmt.num(max(shown))}"
            lines.append(f"{key}: {summary}")
        else:
            lines.append(f"{key}: {json.dumps(value, default=str, sort_keys=True)[:400]}")
    return lines


def verdict_context(analysis: CampaignAnalysis, verdict: Verdict) -> dict[str, Any]:
    """The banner and the gate list."""
    runs = analysis.runs
    bad = runs[runs["status"] != "ok"] if not runs.empty else runs
    problem_runs = [
        {"run_id": str(r["run_id"]), "status": str(r["status"]), "reason": str(r["reason"] or "")}
        for r in _records(bad)
    ]
    gates = [
        {
            "name": g.name,
            "kind": g.kind,
            "passed": g.passed,
            "reason": g.reason,
            "evidence": _evidence_lines(g.evidence),
        }
        for g in verdict.gates
    ]
    soak_failed = [g["name"] for g in gates if g["kind"] == "soak" and not g["passed"]]
    return {
        "passed": verdict.passed,
        "word": "PASS" if verdict.passed else "FAIL",
        "gates": gates,
        "n_passed": sum(1 for g in gates if g["passed"]),
        "no_gates": not gates,
        "problem_runs": problem_runs,
        "incomplete_runs": list(verdict.incomplete_runs),
        "soak_failed": soak_failed,
    }


# ---- campaign --------------------------------------------------------------------------------


def _flatten_cell(cell: Cell) -> dict[str, str]:
    flat: dict[str, str] = {}
    for group in ("knobs", "env", "files", "live"):
        for key, value in getattr(cell, group).items():
            flat[f"{group}.{key}"] = str(value)
    if cell.args:
        flat["args"] = " ".join(cell.args)
    return flat


def cells_context(card: Card) -> list[dict[str, Any]]:
    """Each cell with its settings; treatments show only what differs from the control."""
    control = card.cells.get(card.control) if card.control else None
    base = _flatten_cell(control) if control is not None else {}
    out = []
    for name, cell in card.cells.items():
        flat = _flatten_cell(cell)
        is_control = name == card.control
        if is_control or control is None:
            settings = [{"key": k, "value": v, "was": None} for k, v in sorted(flat.items())]
        else:
            keys = sorted(set(flat) | set(base))
            settings = [
                {"key": k, "value": flat.get(k, "(unset)"), "was": base.get(k, "(unset)")}
                for k in keys
                if flat.get(k) != base.get(k)
            ]
        out.append(
            {
                "name": name,
                "description": cell.description,
                "control": is_control,
                "settings": settings,
            }
        )
    return out


def boxes_context(root: Path) -> list[dict[str, Any]]:
    """The environment capture of every box (``boxes/<box>.json``)."""
    out: list[dict[str, Any]] = []
    for path in sorted((root / "boxes").glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            out.append({"name": path.stem, "error": f"{path.name}: unreadable ({exc})"})
            continue
        runtime = data.get("runtime") or {}
        summary = [
            ("platform", data.get("platform")),
            ("kind", data.get("kind")),
            ("host", data.get("host")),
            ("OS", _os_name(str(data.get("os") or ""))),
            ("CPU", _cpu_model(str(data.get("cpu") or ""))),
            ("CPUs", data.get("cpus")),
            ("memory", data.get("memory")),
            ("GPU", data.get("gpu") or "none reported"),
            ("python", data.get("python")),
            ("harness", data.get("harness_version")),
            ("swap-out pages at start", data.get("swapout_pages_at_start")),
        ]
        out.append(
            {
                "name": str(data.get("box", path.stem)),
                "file": f"boxes/{path.name}",
                "summary": [(k, str(v)) for k, v in summary if v not in (None, "")],
                "runtime_profile": str(runtime.get("profile", "")),
                "runtime_version": str(runtime.get("version", "")),
                "runtime_binary": str(runtime.get("binary", "")),
                "runtime_sha256": str(runtime.get("binary_sha256", "")),
                "raw": json.dumps(data, indent=2, sort_keys=True, default=str),
                "error": "",
            }
        )
    return out


def _os_name(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return text.splitlines()[0] if text else ""


def _cpu_model(text: str) -> str:
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return text.splitlines()[0][:120] if text else ""


def design_context(analysis: CampaignAnalysis) -> dict[str, Any]:
    """The executed order as blocks (arm, cell, cache state, status), one strip per box."""
    card = analysis.card
    plan_runs = analysis.campaign.plan().get("runs", [])
    status = {}
    started: dict[str, float] = {}
    if not analysis.runs.empty:
        status = dict(zip(analysis.runs["run_id"], analysis.runs["status"], strict=True))
        if "started_at" in analysis.runs.columns:
            for run_id, t in zip(analysis.runs["run_id"], analysis.runs["started_at"], strict=True):
                value = fmt.finite(t)
                if value is not None:
                    started[str(run_id)] = value
    palette = _cell_palette(card)
    # Executed order: by start time where recorded; runs that never started keep plan order after.
    order = sorted(
        enumerate(plan_runs),
        key=lambda item: (started.get(item[1]["run_id"], math.inf), item[0]),
    )
    strips: dict[str, list[dict[str, Any]]] = {}
    for _, run in order:
        run_status = str(status.get(run["run_id"], "missing"))
        strips.setdefault(str(run.get("box", "")), []).append(
            {
                "run_id": run["run_id"],
                "arm": str(run.get("arm") or run["cell"][:1].upper()),
                "cell": run["cell"],
                "cycle": run.get("cycle"),
                "pattern": run.get("pattern", ""),
                "cache": str(run.get("cache_state", "")),
                "status": run_status,
                "ok": run_status == "ok",
                "color": palette.get(run["cell"], "#888"),
            }
        )
    cycles = sorted({(r.get("cycle"), r.get("pattern", "")) for r in plan_runs}, key=str)
    return {
        "order": card.design.order,
        "cycles": card.design.cycles,
        "repeats": card.design.repeats,
        "cache_states": list(card.design.cache_states),
        "boot": card.design.boot,
        "patterns": [p for _, p in cycles if p],
        "strips": [{"box": box, "blocks": blocks} for box, blocks in strips.items()],
        "legend": [{"cell": c, "color": palette[c]} for c in card.cells],
        "n_runs": len(plan_runs),
    }


CELL_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def _cell_palette(card: Card) -> dict[str, str]:
    """Control first in blue, treatments after, stable across every figure and table."""
    names = ([card.control] if card.control else []) + card.treatments
    return {name: CELL_COLORS[i % len(CELL_COLORS)] for i, name in enumerate(names)}


def pools_context(root: Path, analysis: CampaignAnalysis) -> dict[str, Any]:
    """Fit/held-out prompt counts per domain: from the pools when reachable, else the outputs."""
    card = analysis.card
    source_card = root / "card.path"
    pool_paths: list[Path] = []
    if source_card.is_file():
        card_dir = Path(source_card.read_text(encoding="utf-8").strip()).parent
        pool_paths = [(card_dir / p).resolve() for p in card.prompts.pools]
    if pool_paths and all(p.is_file() for p in pool_paths):
        from harness.prompts import load_pool

        try:
            prompts = [p for path in pool_paths for p in load_pool(path)]
        except HarnessError:
            prompts = []
        if prompts:
            fit = card.prompts.fit.split if card.prompts.fit else None
            held = card.prompts.heldout.split
            domains = sorted({p.domain for p in prompts})
            rows = [
                {
                    "domain": d,
                    "fit": sum(1 for p in prompts if p.domain == d and p.split == fit),
                    "heldout": sum(1 for p in prompts if p.domain == d and p.split == held),
                }
                for d in domains
            ]
            return {
                "source": "the prompt pools named on the card ("
                + ", ".join(str(p) for p in pool_paths)
                + ")",
                "rows": rows,
                "texts": {p.id: p.text for p in prompts},
                "fit_known": True,
            }
    outputs = analysis.outputs
    rows = []
    if not outputs.empty:
        scored = outputs[outputs["phase"] != "quality"]
        domain_of = _prompt_domains(analysis)
        ids = sorted(set(scored["prompt_id"].astype(str)))
        for domain in sorted({domain_of.get(i, "?") for i in ids}):
            rows.append(
                {
                    "domain": domain,
                    "fit": None,
                    "heldout": sum(1 for i in ids if domain_of.get(i, "?") == domain),
                }
            )
    return {
        "source": "the recorded outputs (the pool files were not reachable from this directory); "
        "fit-split sizes are unknown",
        "rows": rows,
        "texts": {},
        "fit_known": False,
    }


def _prompt_domains(analysis: CampaignAnalysis) -> dict[str, str]:
    """prompt id → domain, from the requests of the first completed run."""
    root = analysis.campaign.root
    for run_id in analysis.runs[analysis.runs["status"] == "ok"]["run_id"]:
        path = root / "runs" / str(run_id) / "requests.parquet"
        if path.is_file():
            frame = pd.read_parquet(path, columns=["prompt_id", "domain"])
            return dict(
                zip(frame["prompt_id"].astype(str), frame["domain"].astype(str), strict=True)
            )
    return {}


# ---- seed tables -----------------------------------------------------------------------------


def _general(note: str) -> str:
    """A recovery note without its per-run numbers, so equal notes group across runs."""
    return re.sub(r"^phase lasted [0-9.]+ s, under", "phase shorter than", note)


def _t90_median(values: list[Any]) -> tuple[float | None, int]:
    """Median T90 where "never" (None) counts as infinitely slow; and how many never recovered."""
    data = [fmt.finite(v) for v in values]
    never = sum(1 for v in data if v is None)
    if not data:
        return None, 0
    ordered = sorted(math.inf if v is None else v for v in data)
    median = float(np.median(ordered)) if never * 2 < len(data) else math.inf
    return median, never


def _t90_text(value: float | None) -> str:
    if value is None:
        return fmt.MISSING
    return "never" if math.isinf(value) else fmt.seconds(value)


def recovery_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Seed 000 §4: T90 per shift direction, ratio vs control, steady churn, converged C1."""
    shifts = analysis.shifts
    has_churn = "churn_per_min" in analysis.cells.columns and bool(
        analysis.cells["churn_per_min"].notna().any()
    )
    if shifts.empty and not has_churn:
        return None
    directions: list[tuple[str, str]] = []
    if not shifts.empty:
        for pair in zip(shifts["from_phase"], shifts["to_phase"], strict=True):
            key = (str(pair[0]), str(pair[1]))
            if key not in directions:
                directions.append(key)
    phases = list(dict.fromkeys(to for _, to in directions))
    control = analysis.card.control
    rows, notes = [], []
    medians: dict[tuple[str, str, tuple[str, str]], float | None] = {}
    for cell, state in _keys(analysis):
        mine = (
            shifts[(shifts["cell"] == cell) & (shifts["cache_state"] == state)]
            if not shifts.empty
            else shifts
        )
        for direction in directions:
            sel = mine[(mine["from_phase"] == direction[0]) & (mine["to_phase"] == direction[1])]
            medians[(cell, state, direction)] = _t90_median(list(sel["t90_s"]))[0]
    for cell, state in _keys(analysis):
        mine = (
            shifts[(shifts["cell"] == cell) & (shifts["cache_state"] == state)]
            if not shifts.empty
            else shifts
        )
        t90_cells, ratio_cells, c1_cells = [], [], []
        row_notes: list[str] = []
        for direction in directions:
            sel = mine[(mine["from_phase"] == direction[0]) & (mine["to_phase"] == direction[1])]
            median, never = _t90_median(list(sel["t90_s"]))
            text = _t90_text(median)
            if never and median is not None and not math.isinf(median):
                text += f" ({never}/{len(sel)} never)"
            t90_cells.append({"value": median, "text": text, "n": len(sel)})
            base = medians.get((control, state, direction)) if control else None
            if (
                median is not None
                and base is not None
                and not math.isinf(median)
                and not math.isinf(base)
                and base > 0
            ):
                ratio_cells.append(fmt.ratio(median / base))
            else:
                ratio_cells.append(fmt.MISSING)
            for note in sel.get("notes", []):
                for part in str(note).split("; "):
                    if part:
                        row_notes.append(f"{direction[0]}→{direction[1]}: {_general(part)}")
        for phase in phases:
            sel = mine[mine["to_phase"] == phase] if not mine.empty else mine
            value = _median(sel["converged_tok_s"]) if not sel.empty else None
            c1_cells.append({"value": value, "text": fmt.fixed(value, 1)})
        note_ids = []
        n_runs = max(1, len(set(mine["run_id"])) if not mine.empty else 1)
        for note, times in Counter(row_notes).items():
            text = f"{note} ({times} of {n_runs} runs)"
            if text not in notes:
                notes.append(text)
            note_ids.append(notes.index(text) + 1)
        churn = _cell_value(analysis, cell, state, "churn_per_min")
        c1 = _cell_value(analysis, cell, state, "c1_tok_s")
        if c1 is None:
            c1 = _cell_value(analysis, cell, state, "decode_tok_s")
        rows.append(
            {
                "name": _key_name(analysis, cell, state),
                "cell": cell,
                "state": state,
                "description": analysis.card.cells[cell].description,
                "control": cell == control,
                "t90": t90_cells,
                "ratio": " / ".join(ratio_cells) if cell != control else "1.00×",
                "churn": {"value": churn, "text": fmt.fixed(churn, 0, "/min")},
                "c1": c1_cells,
                "c1_all": {"value": c1, "text": fmt.fixed(c1, 1)},
                "note_ids": note_ids,
            }
        )
    return {
        "directions": [f"{a}→{b}" for a, b in directions],
        "phases": phases,
        "rows": rows,
        "notes": notes,
        "window_s": analysis.card.analysis.window_s,
        "hold_s": analysis.card.analysis.hold_s,
    }


def _comparison(
    analysis: CampaignAnalysis, cell: str, state: str, metric: str
) -> dict[str, Any] | None:
    for row in comparison_rows(analysis):
        if row["cell"] == cell and row["state"] == state and row["metric"] == metric:
            return row
    return None


def frozen_map_tables(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Seed 000 §5: aggregate C1, per-domain C1 and first request after boot, control vs cell."""
    card = analysis.card
    control = card.control
    if control is None or not card.treatments:
        return []
    domains = analysis.domains
    tables = []
    for cell in card.treatments:
        for state in card.design.cache_states:
            rows = []
            a = _cell_value(analysis, control, state, "decode_tok_s")
            b = _cell_value(analysis, cell, state, "decode_tok_s")
            stat = _comparison(analysis, cell, state, "decode_tok_s")
            rows.append(_frozen_row("aggregate C1 (decode tok/s, geomean)", a, b, stat))
            if not domains.empty:
                for domain in sorted(set(domains["domain"].astype(str))):
                    pick = domains[
                        (domains["domain"] == domain) & (domains["cache_state"] == state)
                    ]
                    a_d = _median(pick[pick["cell"] == control]["decode_tok_s"])
                    b_d = _median(pick[pick["cell"] == cell]["decode_tok_s"])
                    rows.append(_frozen_row(f"{domain} C1", a_d, b_d, None))
            a_f = _cell_value(analysis, control, state, "first_request_tok_s")
            b_f = _cell_value(analysis, cell, state, "first_request_tok_s")
            rows.append(_frozen_row("first request after boot", a_f, b_f, None))
            tables.append(
                {
                    "cell": cell,
                    "control": control,
                    "state": state,
                    "title": f"{control} vs {cell}"
                    + ("" if len(card.design.cache_states) == 1 else f" ({state})"),
                    "rows": rows,
                }
            )
    return tables


def _frozen_row(
    label: str, a: float | None, b: float | None, stat: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "label": label,
        "control": {"value": a, "text": fmt.fixed(a, 1)},
        "cell": {"value": b, "text": fmt.fixed(b, 1)},
        "delta": fmt.delta(a, b),
        "stat": stat,
    }


POLICY_TIMING = (("decode_tok_s", "decode t/s"),)
POLICY_DETERMINISTIC = (
    ("hit_rate", "hit rate"),
    ("expert_loads", "expert loads"),
    ("bytes_read", "bytes read"),
)


def policy_table(analysis: CampaignAnalysis) -> dict[str, Any] | None:
    """Seed 004: decode t/s, hit rate, loads, bytes read, p50/p95 TPOT, per cell."""
    cells = analysis.cells
    wanted = ("hit_rate", "expert_loads", "bytes_read")
    if cells.empty or not any(c in cells.columns and cells[c].notna().any() for c in wanted):
        return None
    rows = []
    for cell, state in _keys(analysis):

        def value(column: str, c: str = cell, s: str = state) -> float | None:
            return _cell_value(analysis, c, s, column)

        p50, p95 = value("tpot_p50_ms"), value("tpot_p95_ms")
        rows.append(
            {
                "name": _key_name(analysis, cell, state),
                "cell": cell,
                "state": state,
                "control": cell == analysis.card.control,
                "runs": f"{int(value('runs_ok') or 0)}/{int(value('runs_planned') or 0)}",
                "decode": {
                    "value": value("decode_tok_s"),
                    "text": fmt.fixed(value("decode_tok_s"), 2),
                },
                "tpot": {
                    "p50": p50,
                    "p95": p95,
                    "text": f"{fmt.fixed(p50, 2)} / {fmt.fixed(p95, 2)} ms",
                },
                "hit_rate": {"value": value("hit_rate"), "text": fmt.pct(value("hit_rate"))},
                "loads": {"value": value("expert_loads"), "text": fmt.count(value("expert_loads"))},
                "bytes": {"value": value("bytes_read"), "text": fmt.gib(value("bytes_read"))},
                "swapout": {
                    "value": value("new_swapout_pages"),
                    "text": fmt.count(value("new_swapout_pages")),
                },
            }
        )
    return {"rows": rows}


def comparison_rows(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Every comparison row, formatted, with its warnings attached to it."""
    out = []
    for row in _records(analysis.comparison_table()):
        metric = str(row["metric"])
        info = METRICS.get(metric)
        unit = info.unit if info else ""
        control_value = _cell_value(analysis, str(row["vs"]), str(row["cache_state"]), metric)
        cell_value = _cell_value(analysis, str(row["cell"]), str(row["cache_state"]), metric)
        lo, hi = fmt.finite(row.get("ci_low")), fmt.finite(row.get("ci_high"))
        label = str(row["label"])
        warnings = [w for w in str(row.get("warnings") or "").split(" | ") if w]
        notes = []
        if row.get("confounded"):
            notes.append(f"statistically {row['raw_label']}, but a drift flag confounds it")
        needed = fmt.finite(row.get("cycles_needed"))
        if label in ("inconclusive", "confounded") and needed:
            notes.append(f"about {int(needed)} cycles would be needed")
        if lo is None:
            notes.append("no interval (one cycle)")
        flags = [
            f
            for f in analysis.flags
            if f["cell"] == row["cell"]
            and f["cache_state"] == row["cache_state"]
            and f["metric"] == metric
        ]
        out.append(
            {
                "cell": str(row["cell"]),
                "vs": str(row["vs"]),
                "state": str(row["cache_state"]),
                "metric": metric,
                "unit": unit,
                "direction": "higher is better"
                if info and info.higher_is_better
                else "lower is better",
                "deterministic": bool(row.get("deterministic")),
                "control_text": fmt.metric(metric, control_value, unit),
                "cell_text": fmt.metric(metric, cell_value, unit),
                "ratio": fmt.finite(row.get("ratio")),
                "ratio_text": fmt.ratio3(row.get("ratio")),
                "ci_low": lo,
                "ci_high": hi,
                "ci_text": f"[{fmt.ratio3(lo)}, {fmt.ratio3(hi)}]" if lo is not None else "none",
                "label": label,
                "label_class": LABEL_CLASS.get(label, "warn"),
                "n_cycles": int(row["n_cycles"]),
                "p_adjusted": fmt.finite(row.get("p_adjusted")),
                "notes": notes,
                "warnings": warnings,
                "flags": flags,
                "flag_summary": _flag_summary(flags),
            }
        )
    return out


def _flag_summary(flags: list[dict[str, str]]) -> list[str]:
    """ "DRIFT in cycles 0, 1" per flag kind: the detail lines stay one click away."""
    by_kind: dict[str, list[str]] = {}
    for flag in flags:
        cycle = str(flag["detail"]).split(":", 1)[0].removeprefix("cycle ").strip()
        by_kind.setdefault(str(flag["kind"]), []).append(cycle)
    return [
        f"{kind} in cycle{'s' if len(cycles) > 1 else ''} {', '.join(cycles)}"
        for kind, cycles in by_kind.items()
    ]


# ---- outputs ---------------------------------------------------------------------------------


def mismatch_context(
    analysis: CampaignAnalysis, verdict: Verdict, texts: dict[str, str]
) -> list[dict[str, Any]]:
    """Per exact-output mismatch: the prompt and a few outputs of the reference and the cell."""
    outputs = analysis.outputs
    if outputs.empty:
        return []
    out = []
    for gate in verdict.gates:
        if gate.kind != "exact_outputs":
            continue
        reference = str(gate.evidence.get("reference", analysis.card.control or ""))
        for cell, info in (gate.evidence.get("cells") or {}).items():
            prompts = list(info.get("mismatched", [])) + list(info.get("allowed_mismatches", []))
            for prompt_id in prompts:
                examples = []
                for who in (reference, cell):
                    sel = outputs[(outputs["cell"] == who) & (outputs["prompt_id"] == prompt_id)]
                    for r in _records(sel.head(EXAMPLE_OUTPUTS)):
                        examples.append(
                            {
                                "cell": who,
                                "run_id": str(r["run_id"]),
                                "sha": str(r["output_sha256"])[:12],
                                "text": str(r["output_text"]),
                            }
                        )
                out.append(
                    {
                        "gate": gate.name,
                        "cell": str(cell),
                        "reference": reference,
                        "prompt_id": str(prompt_id),
                        "prompt": texts.get(str(prompt_id), ""),
                        "allowed": prompt_id in info.get("allowed_mismatches", []),
                        "examples": examples,
                    }
                )
    return out


def sample_outputs(analysis: CampaignAnalysis, texts: dict[str, str]) -> list[dict[str, Any]]:
    """One output per cell for the first few prompts, so a reviewer sees what was generated."""
    outputs = analysis.outputs
    if outputs.empty:
        return []
    out = []
    for prompt_id in list(dict.fromkeys(outputs["prompt_id"].astype(str)))[:4]:
        sel = outputs[outputs["prompt_id"] == prompt_id].drop_duplicates("cell")
        out.append(
            {
                "prompt_id": prompt_id,
                "prompt": texts.get(prompt_id, ""),
                "outputs": [
                    {"cell": str(r["cell"]), "text": str(r["output_text"])} for r in _records(sel)
                ],
            }
        )
    return out


# ---- provenance ------------------------------------------------------------------------------


def failed_runs(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Failed, interrupted or missing runs with their reason and log tail."""
    out = []
    runs = analysis.runs
    for row in _records(runs[runs["status"] != "ok"] if not runs.empty else runs):
        run_id = str(row["run_id"])
        record = analysis.campaign.run_record(run_id) or {}
        out.append(
            {
                "run_id": run_id,
                "cell": str(row["cell"]),
                "status": str(row["status"]),
                "reason": str(row.get("reason") or record.get("reason") or ""),
                "attempt": record.get("attempt"),
                "log_tail": str(record.get("log_tail") or ""),
                "has_record": bool(record),
            }
        )
    return out


def raw_links(analysis: CampaignAnalysis) -> dict[str, Any]:
    """Links (relative to the campaign directory) to the raw files that exist."""
    root = analysis.campaign.root
    campaign_files = [f for f in CAMPAIGN_FILES if (root / f).is_file()]
    runs = []
    plan_runs = analysis.campaign.plan().get("runs", [])
    for run in plan_runs:
        folder = root / "runs" / run["run_id"]
        files = [f for f in RUN_FILES if (folder / f).is_file()]
        runs.append(
            {"run_id": run["run_id"], "files": [f"runs/{run['run_id']}/{f}" for f in files]}
        )
    return {"campaign": campaign_files, "runs": runs}
