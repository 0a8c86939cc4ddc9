"""What the verbs print in a terminal: the plan, the comparisons, the verdict, two campaigns.

Tables are drawn by ``rich`` at a fixed width so the printed text is the same on any terminal
(the golden files in ``tests/golden/`` hold it). Every string that came from a card, a profile
or a runtime goes through :func:`~harness.formats.termtext.shown` first: data is shown, never
read as markup.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from harness.formats.termtext import inert, shown
from harness.report.labels import frozen_cells

if TYPE_CHECKING:
    from rich.console import Console

    from harness.analyze.campaign import CampaignAnalysis
    from harness.analyze.design_cost import PricedDesigns
    from harness.gate.evaluate import Verdict
    from harness.plan.build import Plan
    from harness.plan.measured import MeasuredRuns

__all__ = [
    "format_duration",
    "label_tally",
    "note_unsealed",
    "print_campaigns",
    "print_comparisons",
    "print_design_costs",
    "print_plan",
    "print_verdict",
    "runs_text",
]

FAIL = "[bold red]FAIL[/bold red]"
UNDECIDED = "[bold yellow]UNDECIDED[/bold yellow]"
UNCONFIRMED = "[bold yellow]UNCONFIRMED[/bold yellow]"


def format_duration(seconds: float) -> str:
    """``1h05m`` past an hour, else ``4m07s``."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _console(out: TextIO, width: int) -> Console:
    from rich.console import Console

    return Console(file=out, width=width, highlight=False)


def runs_text(plan: Plan) -> str:
    """Runs planned, and the most a sequential design may run (its last look)."""
    count = len(plan.runs)
    text = f"{count} run" if count == 1 else f"{count} runs"
    most = plan.max_runs()
    if most != count:
        text += f", up to {most} if the sequential design runs to its last look"
    return text + (f", at --scale {plan.scale:g}" if plan.scale != 1 else "")


def print_plan(
    plan: Plan,
    out: TextIO,
    *,
    warnings: Sequence[str] = (),
    measured: MeasuredRuns | None = None,
) -> None:
    """The ordered runs of a plan, what the whole campaign is estimated to take and on what
    assumptions (and what the card's last campaign here took, when there is one), and the
    card's warnings at this scale."""
    from rich.table import Table

    card = plan.card.card
    table = Table(title=f"{shown(card.campaign)}: {runs_text(plan)}", title_justify="left")
    for column in ("#", "run id", "cell", "cycle", "pattern", "slot", "arm", "cache", "box"):
        table.add_column(column)
    for run in plan.runs:
        table.add_row(
            str(run.index),
            shown(run.run_id),
            shown(run.cell),
            str(run.cycle),
            run.pattern,
            str(run.slot),
            run.arm,
            run.cache_state,
            shown(run.box),
        )
    console = _console(out, 120)
    console.print(table)
    most = plan.max_runs()
    upto = (
        f" (up to {format_duration(plan.estimated_run_s() * most)} for {most} runs)"
        if most != len(plan.runs)
        else ""
    )
    console.print(
        f"estimated: {format_duration(plan.estimated_run_s())} per run, "
        f"{format_duration(plan.estimated_total_s())} in all{upto}; "
        f"assumed: {shown(plan.estimate_basis())}"
    )
    if measured is not None:
        console.print(measured_text(plan, measured))
    console.print(shown(plan.washout_text()))
    for warning in warnings:
        console.print(f"warning: {shown(warning)}")


def measured_text(plan: Plan, measured: MeasuredRuns) -> str:
    """The plan priced from the card's last campaign on these boxes (its median run)."""
    busiest = max(Counter(run.box for run in plan.runs).values())
    most = plan.max_runs()
    rescaled = (
        f", its drive rescaled to --scale {plan.scale:g}" if measured.ran_at != plan.scale else ""
    )
    upto = (
        f" (up to {format_duration(measured.run_s * most * busiest / len(plan.runs))} for "
        f"{most} runs)"
        if most != len(plan.runs)
        else ""
    )
    return (
        f"measured: {format_duration(measured.run_s)} per run, "
        f"{format_duration(measured.run_s * busiest)} in all{upto}; the median of "
        f"{measured.runs} completed runs of {shown(str(measured.directory))} (--scale "
        f"{measured.ran_at:g}, boot {measured.boot_s:.1f} s){rescaled}"
    )


def print_boot_costs(plan: Plan, boot_s: float, out: TextIO) -> None:
    """For each boot design: the boots and the wall time of the plan, with a boot of
    ``boot_s`` seconds; a design the card cannot take (its cells differ in what is not live,
    or it has cold runs) is marked, not hidden."""
    from rich.table import Table

    from harness.plan.build import BOOT_DESIGNS

    card = plan.card.card
    table = Table(
        title=f"boot designs at {boot_s:g} s a boot (card: {card.design.boot})",
        title_justify="left",
    )
    for column in ("design", "boots", "wall time", "vs per-block", "note"):
        table.add_column(column)
    per_block = plan.estimated_total_s(boot="per-block", boot_s=boot_s)
    problems = plan.boot_design_problems()
    for design in BOOT_DESIGNS:
        total = plan.estimated_total_s(boot=design, boot_s=boot_s)
        boots = max(plan.boots(design).values(), default=0)
        table.add_row(
            design,
            str(boots),
            format_duration(total),
            f"{per_block / total:.1f}x faster" if total > 0 and design != "per-block" else "",
            # The reason, without the fix every such line repeats.
            problems[design].split(": cells sharing a boot")[0],
        )
    console = _console(out, 120)
    console.print(table)


def print_design_costs(priced: PricedDesigns, out: TextIO) -> None:
    """Each boot design × prompts per block at equal power: cycles, boots and wall time to a
    decision, with the soonest the card can take marked, and what the figures rest on."""
    from rich.table import Table

    costs = priced.costs
    best = priced.soonest
    console = _console(out, 120)
    console.print(
        f"from {shown(str(priced.source))} (design.boot {priced.measured_boot}): "
        f"{costs.blocks} blocks of {costs.block_s:.1f} s, boots of {costs.boot_s:.1f} s",
        highlight=False,
    )
    console.print(f"  a boot priced at {priced.boot_s:.1f} s", highlight=False)
    for need in priced.needs:
        console.print(
            f"  {shown(need.name)}: effect {math.expm1(need.mean) * 100:+.1f}%, "
            f"s_D {need.spread:.3g} (log), prompt share of a block's variance "
            f"{need.prompt_share * 100:.0f}%",
            highlight=False,
        )
    table = Table(
        title="designs to a decision at equal power (80%, the analysis's own rule)",
        title_justify="left",
    )
    for column in ("design", "prompts/block", "cycles", "boots", "wall time", "note"):
        table.add_column(column)
    for row in priced.rows:
        note = row.problem.split(": cells sharing a boot")[0]
        if row == best:
            note = "[bold green]soonest[/bold green]"
        table.add_row(
            row.boot,
            "as run" if row.prompt_factor == 1 else f"x{row.prompt_factor}",
            str(row.cycles),
            str(row.boots),
            format_duration(row.wall_s),
            note,
        )
    console.print(table)
    console.print(
        f"soonest: design.boot {best.boot}, "
        + (
            "the prompts as run"
            if best.prompt_factor == 1
            else f"{best.prompt_factor}x the prompts per block (workload.passes, or --scale)"
        )
        + f", {best.cycles} cycles ({format_duration(best.wall_s)}); limited by "
        f"{shown(best.limiting)}",
        highlight=False,
    )
    if priced.measured_boot == "per-block":
        console.print(
            "  block noise was measured with a boot per block; blocks sharing a boot lose that "
            "boot's own effect,\n  so shared-boot rows are upper bounds on the cycles (and "
            "are checked for carry-over when they run)",
            highlight=False,
        )


def print_verdict(verdict: Verdict, out: TextIO) -> None:
    """One row per gate: pass or FAIL and why; a campaign with missing runs says so last."""
    from rich.table import Table

    from harness.gate.confirm import confirmation_text
    from harness.gate.evaluate import incomplete_text

    title = f"verdict: {verdict.word}"
    if verdict.outcome == "undecided":
        title += " (inconclusive: neither better nor worse yet; exit 1, more cycles may settle it)"
    if verdict.outcome == "unconfirmed":
        title += f" (exit 1 until box {verdict.confirm_box} confirms it or not: see the reasons)"
    table = Table(title=title, title_justify="left")
    table.add_column("gate")
    table.add_column("result")
    table.add_column("reason", overflow="fold")
    for gate in verdict.gates:
        mark = "[green]pass[/green]" if gate.passed else UNDECIDED if gate.undecided else FAIL
        if not gate.passed and gate.confirmation in ("unconfirmed", "not confirmed"):
            mark = UNCONFIRMED
        table.add_row(shown(gate.name), mark, shown(gate.reason))
    if not verdict.gates:
        table.add_row("(none)", FAIL, "the card declares no gates")
    if verdict.incomplete_runs:
        table.add_row("(campaign) runs complete", FAIL, shown(incomplete_text(verdict)))
    console = _console(out, 140)
    console.print(table)
    if verdict.ungated_text:
        console.print(f"not decided here: {shown(verdict.ungated_text)}")
    if linked := confirmation_text(verdict):
        console.print(f"confirmation: {shown(linked)}")
    if verdict.unverified:
        console.print(f"UNVERIFIED: {shown(verdict.unverified)}")


_VOID = ("not engaged", "corrupt", "not equivalent")


def label_tally(labels: list[str], passed: bool) -> str:
    """The comparisons by label, as the report's headline counts them; "" with none."""
    if not labels:
        return ""
    counts = {k: labels.count(k) for k in ("better", "worse", "within noise", "inconclusive")}
    # Cells whose runs say nothing of speed: their change never showed, or broke the outputs.
    void = [f"{n} {k}" for k in _VOID if (n := labels.count(k))]
    other = len(labels) - sum(counts.values()) - sum(labels.count(k) for k in _VOID)
    # Every cell and metric, gated or not: worded apart from the verdict line above it, which
    # is the gates' alone ("undecided" there is a verdict; an inconclusive row here is not).
    text = (
        f"comparisons, gated or not: {counts['better']} better, {counts['worse']} worse, "
        f"{counts['within noise']} within noise, {counts['inconclusive']} inconclusive (more "
        "cycles would decide)" + (f", {other} flagged (confounded or carry-over)" if other else "")
    ) + "".join(f", {v}" for v in void)
    if passed and counts["inconclusive"] == len(labels):
        text += ": the gates passed, but no comparison was decided"
    return text


def _interval(row: Any) -> str:
    from harness.stats.cycles import interval_text

    return interval_text(row["ci_low"], row["ci_high"])


def print_conclusion(
    analysis: CampaignAnalysis,
    verdict: Verdict,
    report: Path,
    root: Path,
    out: TextIO,
    *,
    quiet: bool,
) -> None:
    """The verdict table and the labels' tally (unless ``quiet``), then the report's path,
    which kept head was checked, and the journal head to keep (``root``: the campaign
    directory)."""
    if not quiet:
        print_verdict(verdict, out)
        tally = label_tally([c.comparison.label for c in analysis.comparisons], verdict.passed)
        if tally:
            out.write(tally + "\n")
        unmeasured = unmeasured_shifts(analysis)
        if unmeasured:
            out.write(unmeasured + "\n")
        if analysis.box_load is not None and analysis.box_load.warning:
            out.write(f"warning: {inert(analysis.box_load.warning)}\n")
    out.write(f"report: {report}\n")
    if verdict.checked_against:
        # Plain text (no rich here); it may name the store's path, which is data.
        out.write(inert(verdict.checked_against).replace("\n", " ") + "\n")
    if verdict.journal_head:
        # Kept where an edit of the directory does not reach (a CI's log), the head catches a
        # rewrite of the journal that re-sealed every digest, and a line added after it.
        out.write(
            f"journal head: {verdict.journal_head} (keep it; `harness gate "
            f"{root} --journal-head {verdict.journal_head}` fails if any "
            "journal line up to it is rewritten or any is added after it)\n"
        )


def unmeasured_shifts(analysis: CampaignAnalysis) -> str:
    """What `run` and `gate` repeat of validate's warning, now measured: shift phases that ended
    before their recovery was (T90 "never", or a phase shorter than converged_span_s + hold_s);
    "" when every one was measured. A cell with adaptation frozen has no recovery to measure,
    so its runs are left out (no longer phase would give it one)."""
    shifts = analysis.shifts
    if shifts.empty or "notes" not in shifts.columns:
        return ""
    shifts = shifts[~shifts["cell"].isin(frozen_cells(analysis.card))]
    if shifts.empty:
        return ""
    notes = shifts["notes"].astype(str)
    short = notes.str.contains("under converged_span_s|T90: never recovered", regex=True)
    if not short.any():
        return ""
    runs = shifts.loc[short, "run_id"].nunique()
    return (
        f"warning: in {runs} of {shifts['run_id'].nunique()} runs a shift phase ended before its "
        "recovery was measured (T90 never, or the phase under converged_span_s + hold_s): give "
        "the shift phases until_recovered (or more requests) so T90 is measured at this speed"
    )


def print_comparisons(analysis: CampaignAnalysis, folder: Path, out: TextIO) -> None:
    """Every cell against the control, the analysis's flags and warnings, where tables went."""
    from rich.table import Table

    from harness.stats.cycles import interval_text

    console = _console(out, 140)
    table = Table(title="comparisons (cell / control)", title_justify="left")
    from harness.report.tables import interval_header

    for column in ("cell", "state", "metric", "ratio", interval_header(analysis), "label"):
        table.add_column(column)
    table.add_column("cycles")
    for item in analysis.comparisons:
        c = item.comparison
        interval = interval_text(c.ci_low, c.ci_high)
        table.add_row(
            shown(item.cell),
            item.cache_state,
            shown(c.metric),
            f"{c.ratio:.3f}" if math.isfinite(c.ratio) else "-",
            shown(interval),
            str(c.label),
            str(c.n_cycles),
        )
    console.print(table)
    for flag in analysis.flags:
        console.print(shown(f"{flag['kind']}: {flag['cell']} {flag['metric']}: {flag['detail']}"))
    for warning in analysis.warnings:
        console.print(f"warning: {shown(warning)}")
    console.print(f"tables written to {shown(folder)}")


def print_campaigns(
    a: CampaignAnalysis, b: CampaignAnalysis, rows: list[dict[str, Any]], out: TextIO
) -> None:
    """Two campaigns of one card side by side (``harness compare``): B against A per row."""
    from rich.table import Table

    table = Table(
        title=shown(f"{a.card.campaign}: {b.campaign.root.name} (B) vs {a.campaign.root.name} (A)"),
        title_justify="left",
    )
    for column in ("cell", "state", "metric", "A", "B", "B/A", "95% CI", "label", "in A", "in B"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            shown(row["cell"]), row["cache_state"], shown(row["metric"]),
            f"{row['a_value']:.4g}", f"{row['b_value']:.4g}",
            f"{row['ratio']:.3f}" if row["ratio"] is not None else "∞",  # null: past a float
            shown(_interval(row)), row["label"], str(row["a_label"] or "-"),
            str(row["b_label"] or "-"),
        )  # fmt: skip
    console = _console(out, 160)
    console.print(table)
    if rows and rows[0]["cross_box"]:
        console.print("warning: the campaigns ran on different boxes (--cross-box)")


def note_unsealed(analysis: CampaignAnalysis) -> None:
    """Say on stderr (stdout may be JSON) that an older directory's records were unverified."""
    if not analysis.sealed:
        with contextlib.suppress(OSError):
            sys.stderr.write(
                f"note: {analysis.campaign.root} is not sealed from its start (made before "
                "campaign directories were): what it held before was read unverified\n"
            )
