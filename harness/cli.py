"""The ``harness`` command: a thin layer that parses arguments and calls the stages.

Expected failures (:class:`HarnessError`) are printed without a traceback and mapped to exit codes:
0 pass, 1 a gate failed, 2 bad input or usage, 3 infrastructure. ``--debug`` shows tracebacks.
Stopped by a signal, a command exits 128 + its number: 130 Ctrl-C (SIGINT), 143 SIGTERM,
129 SIGHUP (:mod:`harness.execute.interrupts`), after stopping any runtime it booted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import io
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from harness import __version__
from harness.benchmarks.commands import register as register_bench
from harness.errors import (
    EXIT_GATE_FAILED,
    EXIT_INFRASTRUCTURE,
    EXIT_OK,
    BadInput,
    HarnessError,
)
from harness.execute.commands import register as register_execute
from harness.execute.interrupts import describe, exit_code, stop_signals
from harness.history.commands import register as register_history
from harness.importers.commands import register as register_import
from harness.llamacpp.commands import register as register_llamacpp
from harness.lock import campaign_lock
from harness.report import register as register_report
from harness.sim.commands import register as register_sim
from harness.termtext import shown
from harness.vllm.commands import register as register_vllm

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis
    from harness.card import LoadedCard
    from harness.gate import Verdict
    from harness.plan import Plan
    from harness.records import CampaignDir

Handler = Callable[[argparse.Namespace, TextIO], int]


def _cmd_validate(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_boxes_file, load_card, scale_workload
    from harness.card.phase_length import shift_phase_warnings
    from harness.card.resolve import load_runtime_profile
    from harness.plan import build_plan

    failed: list[HarnessError] = []
    for path in args.cards:
        if Path(path).name == "boxes.yaml":
            try:
                boxes = load_boxes_file(Path(path))
            except HarnessError as problem:
                failed.append(problem)
                continue
            out.write(f"ok: {path} ({len(boxes)} boxes)\n")
            continue
        if Path(path).parent.name == "runtimes":
            try:
                profile = load_runtime_profile(Path(path))
            except HarnessError as problem:
                failed.append(problem)
                continue
            driver = "command driver" if profile.driver is not None else "HTTP"
            counters = sum(len(c.counters()) for c in profile.telemetry.log_counters)
            out.write(
                f"ok: {path} (runtime {profile.name}, {driver}, {len(profile.knobs)} knobs, "
                f"{counters} log counters)\n"
            )
            continue
        try:
            loaded = scale_workload(load_card(Path(path)), args.scale)
        except HarnessError as problem:
            failed.append(problem)
            continue
        plan = build_plan(loaded, scale=args.scale)
        cells = len(loaded.card.cells)
        out.write(f"ok: {path} ({cells} cells, {_runs_text(plan)})\n")
        for warning in shift_phase_warnings(loaded, scale=args.scale):
            out.write(f"warning: {shown(warning)}\n")
    if failed:
        for earlier in failed[:-1]:
            _print_error(earlier)
        raise failed[-1]
    return EXIT_OK


def _format_duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _runs_text(plan: Plan) -> str:
    """Runs planned, and the most a sequential design may run (its last look)."""
    text = f"{len(plan.runs)} runs"
    most = plan.max_runs()
    if most != len(plan.runs):
        text += f", up to {most} if the sequential design runs to its last look"
    return text + (f", at --scale {plan.scale:g}" if plan.scale != 1 else "")


def _cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_card, scale_workload
    from harness.card.phase_length import shift_phase_warnings
    from harness.plan import build_plan, plan_json_text

    loaded = scale_workload(load_card(Path(args.card)), args.scale)
    plan = build_plan(loaded, scale=args.scale)
    if args.json:
        out.write(plan_json_text(plan) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    card = plan.card.card
    table = Table(title=f"{shown(card.campaign)}: {_runs_text(plan)}", title_justify="left")
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
    console = Console(file=out, width=120, highlight=False)
    console.print(table)
    most = plan.max_runs()
    upto = (
        f" (up to {_format_duration(plan.estimated_run_s() * most)} for {most} runs)"
        if most != len(plan.runs)
        else ""
    )
    console.print(
        f"estimated: {_format_duration(plan.estimated_run_s())} per run, "
        f"{_format_duration(plan.estimated_total_s())} in all{upto}; "
        f"assumed: {shown(plan.estimate_basis())}"
    )
    for warning in shift_phase_warnings(loaded, scale=args.scale):
        console.print(f"warning: {shown(warning)}")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_card, scale_workload
    from harness.execute.reopen import reopen_campaign
    from harness.execute.run import new_campaign_dir
    from harness.plan import build_plan
    from harness.records import open_campaign

    # Held from before the first write of a resume to the last write of the run's records.
    with contextlib.ExitStack() as held:
        if args.resume:
            root = Path(args.resume)
            open_campaign(root)  # not a campaign directory: said before a lock file is made in it
            held.enter_context(campaign_lock(root))
            reopened = reopen_campaign(root, cycles=args.cycles)
            campaign, loaded, plan = reopened.campaign, reopened.loaded, reopened.plan
            for note in reopened.notes:
                out.write(note + "\n")
            if reopened.extended_from is not None:
                out.write(
                    f"extended: {reopened.extended_from} → {plan.cycles} cycles "
                    f"({len(plan.runs)} runs planned)\n"
                )
            campaign.journal.append("campaign_resume")
        else:
            if args.card is None:
                raise BadInput("give a CARD to run, or --resume DIR")
            if args.cycles is not None:
                raise BadInput(
                    "--cycles extends a campaign: give it with --resume DIR "
                    "(for a new campaign, set design.cycles on the card)"
                )
            loaded = scale_workload(load_card(Path(args.card)), args.scale)
            plan = build_plan(loaded, scale=args.scale)
            campaign = new_campaign_dir(loaded, plan, Path(args.reports))
            held.enter_context(campaign_lock(campaign.root))
        return _execute(args, campaign, loaded, plan, out)


def _execute(
    args: argparse.Namespace, campaign: CampaignDir, loaded: LoadedCard, plan: Plan, out: TextIO
) -> int:
    """Run a campaign's runs not yet done (under its lock), then analyse and gate it."""
    from harness.execute.box_cache import release_cache
    from harness.execute.fleet import FleetRunner
    from harness.execute.progress import make_progress
    from harness.execute.sequential import run_sequential

    design = loaded.card.design
    out.write(f"campaign directory: {campaign.root}\n")
    out.flush()
    if design.sequential:
        outcome = run_sequential(
            loaded, plan, campaign, lambda p: make_progress(p, quiet=args.quiet, out=out), out
        )
    else:
        with make_progress(plan, quiet=args.quiet, out=out) as progress:
            outcome = FleetRunner(loaded, plan, campaign, progress).execute()
    if not outcome.interrupted:
        release_cache(loaded, campaign.root)
    if outcome.interrupted:
        out.write(
            f"interrupted ({outcome.interrupted_by}); "
            f"resume with: harness run --resume {campaign.root}\n"
        )
        return outcome.exit_code
    out.write(f"runs: {len(outcome.done)} done, {len(outcome.failed)} failed\n")
    return _after_run(args, campaign.root, outcome.failed, out)


def _after_run(args: argparse.Namespace, root: Path, failed: list[str], out: TextIO) -> int:
    """Analysis, gates and the report after a campaign; the exit code of the whole job.

    Runs that could not complete make it 3, unless a gate failed on complete data: that is a
    verdict a retry cannot change, and a pipeline that retries on 3 must not hide it.
    """
    verdict = _analyze_and_gate(root, out, quiet=False)
    if failed:
        out.write(
            f"{len(failed)} runs could not be completed (see their run.json for reasons); "
            f"retry them with: harness run --resume {root}\n"
        )
        if any(not g.passed and not g.incomplete for g in verdict.gates):
            return EXIT_GATE_FAILED
        return EXIT_INFRASTRUCTURE
    return verdict.exit_code()


def _analyze_and_gate(root: Path, out: TextIO, *, quiet: bool) -> Verdict:
    from harness.analyze.campaign import analyze_campaign, write_analysis
    from harness.gate import evaluate_gates, write_verdict

    analysis = analyze_campaign(root)
    note_unsealed(analysis)
    write_analysis(analysis)
    verdict = evaluate_gates(analysis)
    write_verdict(verdict, root)
    from harness.history.store import append_history

    append_history(analysis, verdict)
    if not quiet:
        _print_verdict(verdict, out)
        tally = _label_tally([c.comparison.label for c in analysis.comparisons], verdict.passed)
        if tally:
            out.write(tally + "\n")
    report = _render_report_if_available(root, analysis, verdict)
    if report is not None:
        out.write(f"report: {report}\n")
    return verdict


def _label_tally(labels: list[str], passed: bool) -> str:
    """The comparisons by label, as the report's headline counts them; "" with none."""
    if not labels:
        return ""
    counts = {k: labels.count(k) for k in ("better", "worse", "within noise", "inconclusive")}
    other = len(labels) - sum(counts.values())
    text = (
        f"comparisons: {counts['better']} better, {counts['worse']} worse, "
        f"{counts['within noise']} within noise, {counts['inconclusive']} inconclusive (undecided)"
        + (f", {other} flagged (confounded or carry-over)" if other else "")
    )
    if passed and counts["inconclusive"] == len(labels):
        text += ": the gates passed, but no comparison was decided"
    return text


def note_unsealed(analysis: CampaignAnalysis) -> None:
    """Say on stderr (stdout may be JSON) that an older directory's records were unverified."""
    if not analysis.sealed:
        _stderr(
            f"note: {analysis.campaign.root} is not sealed from its start (made before campaign "
            "directories were): what it held before was read unverified\n"
        )


def _render_report_if_available(root: Path, analysis: object, verdict: object) -> Path | None:
    try:
        report_module = importlib.import_module("harness.report")
    except ModuleNotFoundError:
        return None
    path: Path = report_module.render_report(root, analysis, verdict)
    return path


def _print_verdict(verdict: Verdict, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"verdict: {verdict.word}"
    if verdict.outcome == "undecided":
        title += " (inconclusive: neither better nor worse yet; exit 1, more cycles may settle it)"
    table = Table(title=title, title_justify="left")
    table.add_column("gate")
    table.add_column("result")
    table.add_column("reason", overflow="fold")
    for gate in verdict.gates:
        mark = (
            "[green]pass[/green]"
            if gate.passed
            else "[bold yellow]UNDECIDED[/bold yellow]"
            if gate.undecided
            else "[bold red]FAIL[/bold red]"
        )
        table.add_row(shown(gate.name), mark, shown(gate.reason))
    if not verdict.gates:
        table.add_row("(none)", "[bold red]FAIL[/bold red]", "the card declares no gates")
    if verdict.incomplete_runs:
        from harness.gate import incomplete_text

        table.add_row(
            "(campaign) runs complete", "[bold red]FAIL[/bold red]", shown(incomplete_text(verdict))
        )
    Console(file=out, width=140, highlight=False).print(table)


def _cmd_analyze(args: argparse.Namespace, out: TextIO) -> int:
    from harness.analyze.campaign import analyze_campaign, summary_text, write_analysis

    with locked_campaign(Path(args.dir)):
        analysis = analyze_campaign(Path(args.dir))
        note_unsealed(analysis)
        folder = write_analysis(analysis)
    if args.json:
        out.write(summary_text(analysis) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=140, highlight=False)
    table = Table(title="comparisons (cell / control)", title_justify="left")
    for column in ("cell", "state", "metric", "ratio", "95% CI", "label", "cycles"):
        table.add_column(column)
    for row in analysis.comparison_table().to_dict("records"):
        ci = (
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
            if row["ci_low"] is not None and row["ci_high"] is not None
            else "no interval"
        )
        table.add_row(
            shown(row["cell"]),
            str(row["cache_state"]),
            shown(row["metric"]),
            f"{row['ratio']:.3f}" if row["ratio"] is not None else "-",
            shown(ci),
            str(row["label"]),
            str(row["n_cycles"]),
        )
    console.print(table)
    for flag in analysis.flags:
        console.print(shown(f"{flag['kind']}: {flag['cell']} {flag['metric']}: {flag['detail']}"))
    for warning in analysis.warnings:
        console.print(f"warning: {shown(warning)}")
    console.print(f"tables written to {shown(folder)}")
    return EXIT_OK


def _cmd_gate(args: argparse.Namespace, out: TextIO) -> int:
    with locked_campaign(Path(args.dir)):
        return _analyze_and_gate(Path(args.dir), out, quiet=args.quiet).exit_code()


@contextlib.contextmanager
def locked_campaign(root: Path) -> Iterator[None]:
    """A campaign directory held for a command that writes into it (analysis, verdict, report):
    refused while another harness runs or reads it, so no one reads half of what one writes."""
    from harness.records import open_campaign

    open_campaign(root)
    with campaign_lock(root):
        yield


def _cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    from harness.analyze.across import compare_campaigns
    from harness.analyze.campaign import analyze_campaign

    a, b = analyze_campaign(Path(args.dir_a)), analyze_campaign(Path(args.dir_b))
    rows = compare_campaigns(a, b, cross_box=args.cross_box)
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=shown(f"{a.card.campaign}: {b.campaign.root.name} (B) vs {a.campaign.root.name} (A)"),
        title_justify="left",
    )
    for column in ("cell", "state", "metric", "A", "B", "B/A", "95% CI", "label", "in A", "in B"):
        table.add_column(column)
    for row in rows:
        ci = (
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
            if row["ci_low"] is not None
            else "no interval"
        )
        table.add_row(
            shown(row["cell"]), row["cache_state"], shown(row["metric"]),
            f"{row['a_value']:.4g}", f"{row['b_value']:.4g}", f"{row['ratio']:.3f}", shown(ci),
            row["label"], str(row["a_label"] or "-"), str(row["b_label"] or "-"),
        )  # fmt: skip
    console = Console(file=out, width=160, highlight=False)
    console.print(table)
    if rows and rows[0]["cross_box"]:
        console.print("warning: the campaigns ran on different boxes (--cross-box)")
    return EXIT_OK


def _cmd_ring_show(args: argparse.Namespace, out: TextIO) -> int:
    from harness.telemetry_read import describe_ring

    out.write(describe_ring(Path(args.file)) + "\n")
    return EXIT_OK


def _cmd_refbox(args: argparse.Namespace, out: TextIO) -> int:
    from harness.refbox.server import serve_main

    code: int = serve_main(list(args.rest))
    return code


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark and A/B campaigns for two-tier mixture-of-experts runtimes.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    validate = verbs.add_parser(
        "validate", help="check cards (or runtimes/*.yaml, boxes.yaml) without touching a box"
    )
    validate.add_argument("cards", nargs="+", metavar="CARD")
    validate.add_argument(
        "--scale", type=float, default=1.0, metavar="F", help="check the cards as run at --scale F"
    )
    validate.set_defaults(handler=_cmd_validate)

    plan = verbs.add_parser("plan", help="print the ordered runs of a card")
    plan.add_argument("card", metavar="CARD")
    plan.add_argument("--json", action="store_true", help="machine-readable plan")
    plan.add_argument(
        "--scale", type=float, default=1.0, metavar="F", help="plan the card as run at --scale F"
    )
    plan.set_defaults(handler=_cmd_plan)

    run = verbs.add_parser("run", help="execute a campaign (or resume one)")
    run.add_argument("card", nargs="?", metavar="CARD")
    run.add_argument("--resume", metavar="DIR", help="continue the campaign in DIR")
    run.add_argument(
        "--cycles",
        type=int,
        metavar="N",
        help="with --resume: extend the campaign to N mirrored cycles in all (never fewer)",
    )
    run.add_argument("--reports", default="reports", help="where campaign folders go")
    run.add_argument("--quiet", action="store_true", help="no progress bar (for CI logs)")
    run.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="F",
        help="scale every phase's requests and duration by F (0.25 for a quick look)",
    )
    run.set_defaults(handler=_cmd_run)

    analyze = verbs.add_parser("analyze", help="compute the tables of a campaign directory")
    analyze.add_argument("dir", metavar="DIR")
    analyze.add_argument("--json", action="store_true", help="print the summary as JSON")
    analyze.set_defaults(handler=_cmd_analyze)

    gate = verbs.add_parser(
        "gate", help="evaluate the card's gates (exit 0 pass, 1 fail, 3 runs incomplete)"
    )
    gate.add_argument("dir", metavar="DIR")
    gate.add_argument("--quiet", action="store_true", help="no verdict table")
    gate.set_defaults(handler=_cmd_gate)

    compare = verbs.add_parser(
        "compare", help="two campaigns of the same card side by side (two builds)"
    )
    compare.add_argument("dir_a", metavar="DIR_A", help="the baseline campaign")
    compare.add_argument("dir_b", metavar="DIR_B", help="the candidate campaign")
    compare.add_argument(
        "--cross-box", action="store_true", help="compare campaigns from different boxes anyway"
    )
    compare.add_argument("--json", action="store_true", help="machine-readable rows")
    compare.set_defaults(handler=_cmd_compare)

    register_execute(verbs)
    register_bench(verbs)
    register_sim(verbs)
    register_llamacpp(verbs)
    register_vllm(verbs)
    register_report(verbs)
    register_import(verbs)
    register_history(verbs)

    ring = verbs.add_parser("ring", help="telemetry ring files")
    ring_verbs = ring.add_subparsers(dest="ring_verb", metavar="VERB", required=True)
    show = ring_verbs.add_parser("show", help="print a ring's header and a summary")
    show.add_argument("file", metavar="FILE")
    show.set_defaults(handler=_cmd_ring_show)

    refbox = verbs.add_parser(
        "refbox", help="the bundled reference runtime", add_help=False, prefix_chars="\0"
    )
    refbox.add_argument("rest", nargs=argparse.REMAINDER)
    refbox.set_defaults(handler=_cmd_refbox)
    return parser


def _print_error(exc: HarnessError) -> None:
    for line in exc.lines():
        _stderr(f"{line}\n")


class _Courtesy(io.TextIOBase):
    """What a command prints, given up once the reader is gone: a hung-up terminal (SIGHUP) or
    a closed pipe must not turn into a traceback, or change the exit code, of a command whose
    records on disk are the truth."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self._target: TextIO | None = target
        self._encoding = getattr(target, "encoding", None) or "utf-8"

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only on io.TextIOBase
        return self._encoding

    def write(self, text: str) -> int:
        if self._target is not None:
            try:
                self._target.write(text)
            except OSError:
                self._target = None
        return len(text)

    def flush(self) -> None:
        if self._target is not None:
            try:
                self._target.flush()
            except OSError:
                self._target = None

    def isatty(self) -> bool:
        return self._target is not None and self._target.isatty()

    def fileno(self) -> int:
        if self._target is None:
            raise OSError("output closed")
        return self._target.fileno()


def os_error_text(exc: OSError) -> str:
    """``PATH: what the errno means``, and what to do; every path the error names."""
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    meaning = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    if exc.errno == errno.EEXIST:
        meaning += " (and is not a folder)"  # what a mkdir over a file says
    where = " → ".join(paths) if paths else "a file the harness writes"
    return (
        f"{where}: {meaning}; nothing already written was lost (records are replaced whole): "
        "fix it (free space, a writable folder, a folder where a folder belongs) and run the "
        "command again (a campaign: harness run --resume DIR)"
    )


def _stderr(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting, so tests can call it."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    handler: Handler = args.handler
    # The reference runtime handles its own signals in its event loop.
    signals = stop_signals() if args.verb != "refbox" else contextlib.nullcontext()
    try:
        with signals:
            return handler(args, cast(TextIO, _Courtesy(out or sys.stdout)))
    except HarnessError as exc:
        if args.debug:
            traceback.print_exc()
        _print_error(exc)
        return exc.exit_code
    except OSError as exc:
        # What our readers and writers did not turn into a HarnessError is the machine's: a
        # full disk, a read-only file system, a file where a folder goes. Exit 3, not 1 (a
        # release gate reads 1 as "the candidate failed"); atomic writes kept what was there.
        if args.debug:
            traceback.print_exc()
        _stderr(os_error_text(exc) + "\n")
        return EXIT_INFRASTRUCTURE
    except KeyboardInterrupt as exc:
        _stderr(f"interrupted ({describe(exc)})\n")
        return exit_code(exc)


def entry() -> None:
    """Console-script entry point."""
    code = main()
    try:
        sys.stdout.flush()
    except OSError:
        # The reader is gone; Python would fail the flush at exit again and exit 120.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)


if __name__ == "__main__":
    entry()
