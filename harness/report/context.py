"""The report's sections around the tables: verdict, cells, boxes, order, pools, outputs, files.

Read from the analysis, the verdict and the campaign directory; the tables themselves are in
:mod:`harness.report.tables`. The template does no arithmetic; every decision about what applies
is made here or there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.card import Card, Cell
from harness.card.frozen import frozen_paths
from harness.errors import HarnessError
from harness.gate.confirm import confirmation_text
from harness.gate.evaluate import Verdict
from harness.plan.build import cohort_key
from harness.report import fmt
from harness.report.tables import frame_records

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis
    from harness.analyze.canaries import CanaryCheck
    from harness.analyze.engagement import Engagement
    from harness.analyze.equivalence import EquivalenceRow

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
    "inputs/manifest.json",
    "verdict.json",
    "verdict.junit.xml",
    "analysis/summary.json",
)
EXAMPLE_OUTPUTS = 3  # outputs shown per prompt and cell for an exact-output mismatch


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
        for r in frame_records(bad)
    ]
    gates = [
        {
            "name": g.name,
            "kind": g.kind,
            "passed": g.passed,
            "undecided": g.undecided,
            "result": "pass"
            if g.passed
            else "UNDECIDED"
            if g.undecided
            else "UNCONFIRMED"
            if g.confirmation in ("unconfirmed", "not confirmed")
            else "FAIL",
            "reason": g.reason,
            "evidence": _evidence_lines(g.evidence),
        }
        for g in verdict.gates
    ]
    soak_failed = [g["name"] for g in gates if g["kind"] == "soak" and not g["passed"]]
    return {
        "passed": verdict.passed,
        "word": verdict.word,
        "outcome": verdict.outcome,
        "css": {"pass": "pass", "undecided": "undecided"}.get(verdict.outcome, "fail"),
        "gates": gates,
        "n_passed": sum(1 for g in gates if g["passed"]),
        "no_gates": not gates,
        "problem_runs": problem_runs,
        "incomplete_runs": list(verdict.incomplete_runs),
        "soak_failed": soak_failed,
        "ungated": verdict.ungated_text,
        "confirmation": confirmation_text(verdict),
        "unverified": verdict.unverified,
        "checked_against": verdict.checked_against,
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


def cells_context(
    card: Card,
    engagement: Engagement | None = None,
    canaries: CanaryCheck | None = None,
    equivalence: Sequence[EquivalenceRow] = (),
) -> list[dict[str, Any]]:
    """Each cell with its settings; treatments show only what differs from the control,
    whether the change took effect on its boots (``engagement``: ``{"bad": bool, "text"}``,
    None where nothing was checked), and what its outputs showed (``outputs``: ``{"pill",
    "bad", "text"}``: its canaries, or a lossy cell's equivalence endpoint)."""
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
                "engagement": None if is_control else _engagement(engagement, name),
                "outputs": None if is_control else _outputs(canaries, equivalence, name),
            }
        )
    return out


def _engagement(engagement: Engagement | None, cell: str) -> dict[str, Any] | None:
    """The cell's engagement in one line: not engaged, not verified, or what showed it."""
    if engagement is None:
        return None
    failed = engagement.not_engaged_text(cell)
    shown = sorted({f"{r.knob}: {r.signature}" for r in engagement.rows if r.cell == cell})
    loose = engagement.unverified_text(cell)
    parts = [failed] if failed else [f"engaged on every boot ({'; '.join(shown)})"] if shown else []
    parts += [loose] if loose else []
    return {"bad": failed is not None, "text": "; ".join(parts)} if parts else None


def _outputs(
    canaries: CanaryCheck | None, equivalence: Sequence[EquivalenceRow], cell: str
) -> dict[str, Any] | None:
    """The cell's outputs in one line: corrupt, its equivalence endpoint, or its canaries."""
    row = next((r for r in equivalence if r.cell == cell), None)
    if row is not None:
        pill = {"equivalent": "equivalent", "not equivalent": "not equivalent"}
        return {
            "pill": pill.get(row.verdict, "equivalence not shown"),
            "bad": row.verdict != "equivalent",
            "text": f"outputs against the control's: {row.words()}",
        }
    if canaries is None:
        return None
    corrupt = canaries.corrupt_text(cell)
    if corrupt is not None:
        return {"pill": "corrupt", "bad": True, "text": corrupt}
    clean = canaries.clean_text(cell)
    return {"pill": "canaries", "bad": False, "text": clean} if clean else None


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
            ("driver", _driver_text(data)),
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


def _driver_text(data: dict[str, Any]) -> str | None:
    """Where an SSH box's driver ran and the tunnel's round trip (None for a local box)."""
    drive = data.get("drive")
    if drive is None:
        return None
    rtt = data.get("tunnel_rtt") or {}
    if "tunnel" in rtt:
        measured = (
            f"tunnel round trip {rtt['tunnel']['median_ms']:.2f} ms median "
            f"(SSH channel {rtt['ssh_channel']['median_ms']:.2f} ms)"
        )
    else:
        measured = f"tunnel round trip not measured: {rtt.get('error', 'no capture')}"
    where = "on the box" if drive == "on-box" else "here, through an SSH tunnel"
    return f"{where}; {measured}"


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


def tail_method(analysis: CampaignAnalysis, rows: list[dict[str, Any]]) -> str:
    """The method sentence for tail metrics a gate judges ("" when none), each such row's
    bounds added to its notes (harness.analyze.tails)."""
    if not analysis.tail_method:
        return ""
    for row in rows:
        tail = analysis.tail(row["cell"], row["state"], row["metric"])
        if tail is not None:
            row["notes"].append(tail.words())
    return analysis.tail_method


# The methods line, from design.boot: what a block's runtime shared with the blocks around it.
BOOT_WORDS = {
    "per-block": "each run its own boot",
    "per-cycle": "the four blocks of a cycle on one boot, switched by live knobs",
    "per-campaign": "every run of a box on one boot, switched by live knobs",
}


def wash_words(analysis: CampaignAnalysis) -> str:
    """What cleared a block of the one before it, in words: the methods line's second half."""
    design = analysis.card.design
    runs = analysis.runs

    # What the runs sent, not what the card says now: a record run before washouts has none.
    def column(name: str) -> list[float]:
        values: Any = runs[name] if name in runs.columns else []
        return [v for v in (fmt.finite(x) for x in values) if v is not None]

    share = 0.0
    if any(v > 0 for v in column("washout")):
        shares = sorted(column("washout_share"))
        share = shares[len(shares) // 2] if shares else design.washout
    whole = "a whole block" if share == 1 else f"{share:g} of a block"
    sent = f"{whole} of its own traffic" if share > 0 else "no washout traffic"
    if design.washed_by == "boot":
        probes: set[str] = set()
        if "box_state" in runs.columns:
            for readings in runs["box_state"]:
                if isinstance(readings, dict):
                    probes.update(str(name) for name in readings)
        read = ", ".join(sorted(probes)) or "none (no block read: decided as unwashed)"
        return (
            f"washed by boot: each block on a boot of its own, then {sent}; what the box keeps "
            f"across boots read by the probes {read}, and a label waits for them to settle; "
            "state no probe reads is assumed to carry nothing"
        )
    if share >= 1:
        return f"a washout of {sent} before each block (the cycle mean is the deployed effect)"
    if share > 0:
        return (
            f"{sent} before each block, part of a block: decided as unwashed (the crossover "
            "model's deployed effect)"
        )
    return "no washout: decided on the crossover model's deployed effect"


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
    palette = cell_palette(card)
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
        "boot": card.design.boot,
        "boot_words": BOOT_WORDS[card.design.boot],
        "wash_words": wash_words(analysis),
        "boots": _boot_groups(analysis, strips) if card.design.boot != "per-block" else [],
        # What was planned, which an extended campaign (--resume --cycles) raised past the card.
        "cycles": analysis.campaign.plan().get("cycles", card.design.cycles),
        "repeats": card.design.repeats,
        "cache_states": list(card.design.cache_states),
        "patterns": [p for _, p in cycles if p],
        "strips": [{"box": box, "blocks": blocks} for box, blocks in strips.items()],
        "legend": [{"cell": c, "color": palette[c]} for c in card.cells],
        "n_runs": len(plan_runs),
    }


def _boot_groups(
    analysis: CampaignAnalysis, strips: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Per box, its blocks in executed order cut where the boot changes (each run's
    ``boot_id``), so the strip shows which blocks shared a runtime; a run that never ran is a
    group of its own."""
    out = []
    for box, blocks in strips.items():
        groups: list[dict[str, Any]] = []
        for block in blocks:
            record = analysis.campaign.run_record(block["run_id"]) or {}
            boot = str(record.get("boot_id") or f"none:{block['run_id']}")
            if not groups or groups[-1]["boot_id"] != boot:
                groups.append({"boot_id": boot, "n": len(groups) + 1, "blocks": []})
            groups[-1]["blocks"].append(block)
        out.append({"box": box, "groups": groups})
    return out


CELL_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def cell_palette(card: Card) -> dict[str, str]:
    """Control first in blue, treatments after, stable across every figure and table."""
    names = ([card.control] if card.control else []) + card.treatments
    return {name: CELL_COLORS[i % len(CELL_COLORS)] for i, name in enumerate(names)}


def _shown_path(path: Path, root: Path) -> str:
    """A path inside the campaign directory relative to it (the report is the same wherever
    the directory is copied); others in full."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def pools_context(root: Path, analysis: CampaignAnalysis) -> dict[str, Any]:
    """Fit/held-out prompt counts per domain: from the pools when reachable, else the outputs."""
    card = analysis.card
    source_card = root / "card.path"
    # The campaign's own copies first; a directory made before they were kept has card.path.
    pool_paths = frozen_paths(root, "pool") or []
    if not pool_paths and source_card.is_file():
        card_dir = Path(source_card.read_text(encoding="utf-8").strip()).parent
        pool_paths = [(card_dir / p).resolve() for p in card.prompts.pools]
    if pool_paths and all(p.is_file() for p in pool_paths):
        from harness.formats.prompts import load_pool

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
                + ", ".join(_shown_path(p, root) for p in pool_paths)
                + ")",
                "rows": rows,
                "texts": {p.id: p.text for p in prompts},
                "fit_known": True,
            }
    outputs = analysis.outputs
    rows = []
    if not outputs.empty:
        scored = outputs[outputs["phase"] != "quality"]
        domain_of = analysis.prompt_domains
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
                    for r in frame_records(sel.head(EXAMPLE_OUTPUTS)):
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
                    {"cell": str(r["cell"]), "text": str(r["output_text"])}
                    for r in frame_records(sel)
                ],
            }
        )
    return out


# ---- provenance ------------------------------------------------------------------------------


def failed_runs(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Failed, interrupted or missing runs with their reason and log tail."""
    out = []
    runs = analysis.runs
    for row in frame_records(runs[runs["status"] != "ok"] if not runs.empty else runs):
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


def invalid_cohorts(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Cohorts a guard invalidated: their runs and why (from the runs table)."""
    runs = analysis.runs
    if runs.empty or "status" not in runs.columns:
        return []
    out: dict[str, dict[str, Any]] = {}
    for row in frame_records(runs[runs["status"] == "invalid"]):
        key = cohort_key(str(row["comparison"]), str(row["cache_state"]), int(row["cycle"]))
        entry = out.setdefault(key, {"cohort": key, "runs": 0, "why": ""})
        entry["runs"] += 1
        entry["why"] = str(row.get("reason") or "").split(" invalid: ", 1)[-1]
    return list(out.values())


def logit_hashes(analysis: CampaignAnalysis) -> list[dict[str, Any]]:
    """Per cell, the frontier-logit SHA-256 values its runs recorded (one when they agree)."""
    runs = analysis.runs
    if runs.empty or "logit_sha256" not in runs.columns:
        return []
    out = []
    for cell, group in runs[runs["logit_sha256"].notna()].groupby("cell", sort=False):
        shas = sorted({str(s) for s in group["logit_sha256"]})
        out.append({"cell": str(cell), "runs": len(group), "sha": ", ".join(shas)})
    return out
