"""The HTML report reviewers read: one self-contained file per campaign directory.

``render_report(root, analysis, verdict)`` writes ``root/report.html`` and ``root/record.md`` (the
dated markdown record, :mod:`.record`, from the same context) (and, for a campaign under
``reports/<campaign>/<stamp>``, a copy at ``reports/<campaign>-<stamp>.html``) and returns the
path of the first. The page is jinja2 with autoescape on for everything (prompt and output text is
untrusted), inline CSS, figures as base64 PNG, no script and no external request.

The page's template is the project's top-level ``templates/report.html.j2`` (packaged into the
wheel as ``harness/templates``); a ``templates/report.html.j2`` in the directory harness runs
from replaces it, and can extend it as ``harness/report.html.j2``, filling its blocks
(``head``, ``header``, ``content``, ``footer``). The ``harness report DIR`` verb is
:mod:`.commands`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.formats.safe_write import write_text_atomic
from harness.version import PACKAGE_DIR, __version__

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis
    from harness.gate.evaluate import Verdict

OVERRIDES = Path("templates")  # relative to where harness runs: a team's own report templates


def shipped_templates() -> Path:
    """The project's templates: packaged into the wheel as ``harness/templates``, or the
    repository's top-level ``templates/`` in a source checkout."""
    packaged = PACKAGE_DIR / "templates"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "templates"


TEMPLATE = "report.html.j2"
REPORT_NAME = "report.html"


# Metrics whose per-cycle block values are drawn (the throughput claims drift can confound).
def render_report(
    root: Path, analysis: CampaignAnalysis, verdict: Verdict, *, figures: bool = True
) -> Path:
    """Write ``root/report.html`` (and the copy under ``reports/``) and ``root/record.md``;
    return the first path.

    ``figures=False`` renders the same page without drawing any figure (the benchmark baseline).
    """
    from harness.report.record import RECORD_NAME, render_record

    context = build_context(root, analysis, verdict, figures=figures)
    html = _render(context, link_prefix="")
    path = root / REPORT_NAME
    write_text_atomic(path, html)
    # The markdown record from the same context: the same numbers as the page.
    write_text_atomic(root / RECORD_NAME, render_record(context))
    copy = copy_path(root, analysis.card.campaign)
    if copy is not None:
        write_text_atomic(copy, _render(context, link_prefix=f"{root.parent.name}/{root.name}/"))
    return path


def copy_path(root: Path, campaign: str) -> Path | None:
    """``reports/<campaign>-<stamp>.html`` when ``root`` lies in ``reports/<campaign>/``."""
    resolved = root.resolve()
    if resolved.parent.parent.name != "reports":
        return None
    return resolved.parent.parent / f"{campaign}-{resolved.name}.html"


def _render(context: dict[str, Any], *, link_prefix: str) -> str:
    import jinja2

    shipped = str(shipped_templates())
    # A team's ./templates/ first (whole files replace the shipped ones); the shipped ones are
    # also reachable as "harness/<name>", so an override can extend rather than copy them.
    loader = jinja2.ChoiceLoader(
        [
            jinja2.FileSystemLoader(str(OVERRIDES.resolve())),
            jinja2.PrefixLoader({"harness": jinja2.FileSystemLoader(shipped)}),
            jinja2.FileSystemLoader(shipped),
        ]
    )
    environment = jinja2.Environment(
        loader=loader,
        autoescape=True,  # every value, whatever the template's extension
        finalize=_inert,  # and no control or bidi override reaches the page
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.get_template(TEMPLATE).render(**context, link_prefix=link_prefix)


def build_context(
    root: Path, analysis: CampaignAnalysis, verdict: Verdict, *, figures: bool = True
) -> dict[str, Any]:
    """Every value the template shows, computed once (both HTML files share it)."""
    import matplotlib

    matplotlib.use("Agg")  # off-screen: no display on CI boxes
    from harness.report import context as ctx
    from harness.report import figures as fig
    from harness.report import tables
    from harness.report.box_load import box_load_context
    from harness.report.fleet import fleet_context
    from harness.report.labels import section_title
    from harness.report.runtime import runtime_context
    from harness.report.timing import run_timing

    card = analysis.card
    palette = ctx.cell_palette(card)
    pools = ctx.pools_context(root, analysis)
    comparisons = tables.comparison_rows(analysis)
    tail_method = ctx.tail_method(analysis, comparisons)
    images: dict[str, Any] = {
        "cold_share": None, "cycles": [], "tpot": None, "swap": None, "history": None,
    }  # fmt: skip
    predicted = tables.predicted_table(analysis)
    if figures:
        images["cold_share"] = fig.cold_share_figure(analysis, palette)
        for metric in analysis.series.metrics:
            image = fig.cycles_figure(analysis, palette, metric)
            if image:
                images["cycles"].append({"metric": metric, "png": image})
        images["tpot"] = fig.tpot_cdf_figure(analysis, palette)
        images["swap"] = fig.swap_cost_figure(analysis, palette)
        if predicted is not None:
            predicted["png"] = fig.predicted_figure(predicted["rows"])
    history = _history(root)
    if figures and history:
        images["history"] = fig.history_figure(history, palette)
    return {
        "title": f"{card.campaign}: {'PASS' if verdict.passed else 'FAIL'}",
        "campaign": card.campaign,
        "stamp": root.name,
        "description": card.description,
        "recorded_at": _recorded_at(analysis),
        "harness_version": __version__,
        "simulated": analysis.simulated,
        "verdict": ctx.verdict_context(analysis, verdict),
        "cells": ctx.cells_context(
            card, analysis.engagement, analysis.canaries, analysis.equivalence
        ),
        "control": card.control,
        "boxes": ctx.boxes_context(root),
        "runtime_name": card.runtime if isinstance(card.runtime, str) else card.runtime.name,
        "design": ctx.design_context(analysis),
        "timing": run_timing(analysis),
        "box_load": box_load_context(analysis),
        "pools": pools,
        "workload": card.workload.model_dump(mode="json"),
        "analysis_spec": card.analysis.model_dump(mode="json"),
        "recovery": tables.recovery_table(analysis),
        "swap_cost": tables.swap_cost_table(analysis),
        "titles": {
            "recovery": section_title("Recovery after domain shifts", card),
            "frozen": section_title("Map comparison, held-out prompts", card),
            "policy": section_title("Per-cell evidence", card),
            "swap": section_title("Swap cost", card),
        },
        "frozen": tables.frozen_map_tables(analysis, comparisons),
        "policy": tables.policy_table(analysis),
        "tiers": tables.tiers_table(analysis),
        "runtime_tables": runtime_context(analysis),
        "fleet": fleet_context(analysis),
        "looks": tables.looks_table(analysis),
        "ci_header": tables.interval_header(analysis),
        "tail_method": tail_method,  # "" unless a gate judges a tail metric
        "timing_rows": [r for r in comparisons if not r["deterministic"]],
        "deterministic_rows": [r for r in comparisons if r["deterministic"]],
        # A timed phase serves as many requests as the speed allows: counter totals move with it.
        "deterministic_title": (
            "Counters (a timed phase: totals move with the requests served; rates do not)"
            if any(p.duration_s is not None for p in card.workload.phases or [])
            else "Deterministic evidence (drift cannot move it)"
        ),
        "campaign_warnings": list(analysis.warnings),
        "mismatches": ctx.mismatch_context(analysis, verdict, pools["texts"]),
        "samples": ctx.sample_outputs(analysis, pools["texts"]),
        "images": images,
        "figures_enabled": figures,
        "predicted": predicted,
        "oracle": tables.oracle_rows(analysis),
        "oracle_definition": tables.ORACLE_DEFINITION,
        "history": history,
        "card_text": _read_text(root / "card.yaml"),
        "failed_runs": ctx.failed_runs(analysis),
        "invalid_cohorts": ctx.invalid_cohorts(analysis),
        "logit_hashes": ctx.logit_hashes(analysis),
        "links": ctx.raw_links(analysis),
        "palette": palette,
    }


def _inert(value: Any) -> Any:
    """A value printed into the page, its controls and bidi overrides shown as U+FFFD (escaping
    stops markup, not an ESC sequence in a pre block or a right-to-left override)."""
    import markupsafe

    from harness.formats.termtext import inert

    if isinstance(value, markupsafe.Markup):
        return markupsafe.Markup(inert(str(value)))
    return inert(value) if isinstance(value, str) else value


def _recorded_at(analysis: CampaignAnalysis) -> str:
    """When the last run's records were written (UTC): the report is a function of the records,
    so rendering it again on the same records gives the same bytes."""
    runs = analysis.runs
    column: list[Any] = list(runs["ended_at"].dropna()) if "ended_at" in runs.columns else []
    ended = [float(t) for t in column if float(t) > 0]
    if not ended:
        return "no run recorded"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(max(ended)))


def _history(root: Path) -> list[dict[str, Any]]:
    """The campaign's trends as its gate recorded them (``analysis/history.json``); none for a
    campaign never gated, or gated before the file existed."""
    from harness.formats.records import read_json

    path = root / "analysis" / "history.json"
    if not path.is_file():
        return []
    payload = read_json(path)
    if payload.get("error"):
        return [{"error": str(payload["error"])}]
    return list(payload.get("trends") or [])


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        return f"({path.name} unreadable: {exc})"


# ---- the CLI verb ----------------------------------------------------------------------------


__all__ = ["build_context", "copy_path", "render_report"]
