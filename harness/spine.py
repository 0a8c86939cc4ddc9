"""The back half, one path: a campaign directory → analysis → verdict → its records → the report.

Every verb that ends a campaign walks this module, and so does the library API, so a notebook
and the CLI produce the same directory from the same records:

- :func:`decide` — the analysis and the card's gates over it (reads only);
- :func:`record` — the analysis files, ``verdict.json``, JUnit, the results-store row and the
  campaign's trends (``analysis/history.json``);
- :func:`render` — ``report.html`` and ``record.md``;
- :func:`gate_campaign` (``harness gate``), :func:`report_campaign` (``harness report``),
  :func:`analyze_only` (``harness analyze``) and :func:`run_campaign` (``harness run``): the
  same steps under the campaign lock, taken once per call.

Nothing here prints but the progress ``run_campaign`` is given ``out`` for; the verbs print.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from harness.errors import EXIT_GATE_FAILED, EXIT_INFRASTRUCTURE, BadInput

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis
    from harness.execute.run import CampaignOutcome
    from harness.gate.evaluate import Verdict

__all__ = [
    "Concluded",
    "Decision",
    "RunResult",
    "analyze_only",
    "decide",
    "gate_campaign",
    "record",
    "render",
    "report_campaign",
    "run_campaign",
]


@dataclass(frozen=True)
class Decision:
    """A campaign directory read and judged: its analysis and the verdict of its card's gates."""

    analysis: CampaignAnalysis
    verdict: Verdict

    @property
    def root(self) -> Path:
        """The campaign directory."""
        return self.analysis.campaign.root


@dataclass(frozen=True)
class Concluded:
    """A decision recorded and rendered: what ``harness gate`` leaves behind."""

    decision: Decision
    report: Path

    @property
    def exit_code(self) -> int:
        """0 every gate passed, 1 a gate failed, 3 the runs are incomplete."""
        return self.decision.verdict.exit_code()


@dataclass(frozen=True)
class RunResult:
    """A campaign run, new or resumed: how its runs went and, unless it was interrupted, its
    conclusion. ``notes`` are what a resume found (extensions, repaired records)."""

    directory: Path
    outcome: CampaignOutcome
    concluded: Concluded | None
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The exit code of the whole job. Runs that could not complete make it 3, unless a
        gate failed on complete data: that is a verdict a retry cannot change, and a pipeline
        that retries on 3 must not hide it."""
        if self.concluded is None:
            return self.outcome.exit_code
        verdict = self.concluded.decision.verdict
        if self.outcome.failed:
            if any(not g.passed and not g.incomplete for g in verdict.gates):
                return EXIT_GATE_FAILED
            return EXIT_INFRASTRUCTURE
        return verdict.exit_code()


def decide(root: Path, *, journal_head: str | None = None) -> Decision:
    """Analyse ``root`` and evaluate its card's gates; writes nothing (the caller holds the
    lock where a run may be writing). ``journal_head``: a head of the journal the user kept
    (checked to lie on its chain)."""
    from harness.analyze.campaign import analyze_campaign
    from harness.gate.confirm import keep_link
    from harness.gate.evaluate import evaluate_gates
    from harness.report.terminal import note_unsealed

    analysis = analyze_campaign(root, journal_head=journal_head)
    note_unsealed(analysis)
    verdict = evaluate_gates(analysis)
    keep_link(verdict, analysis)  # a campaign of a confirmation pair stays linked
    return Decision(analysis, verdict)


def record(decision: Decision) -> Path:
    """Write what the decision leaves: the analysis files, ``verdict.json`` and JUnit, the
    results-store row and the journal's head beside it, its predictions' errors and the
    campaign's trends. Returns the analysis folder."""
    from harness.analyze.campaign import write_analysis
    from harness.formats.heads import record_head
    from harness.gate.evaluate import write_verdict
    from harness.history.predictions import append_predictions
    from harness.history.store import append_history
    from harness.history.trends import record_campaign_trends

    folder = write_analysis(decision.analysis)
    write_verdict(decision.verdict, decision.root)
    append_history(decision.analysis, bool(decision.verdict.passed))
    record_head(decision.root, "gate")
    append_predictions(decision.analysis)
    record_campaign_trends(decision.analysis)
    return folder


def render(decision: Decision, *, figures: bool = True) -> Path:
    """``report.html`` and ``record.md`` of the decision; returns the report's path."""
    from harness.report import render_report

    return render_report(decision.root, decision.analysis, decision.verdict, figures=figures)


@contextlib.contextmanager
def _held(root: Path, locked: bool) -> Iterator[None]:
    if locked:
        yield
        return
    from harness.formats.lock import locked_campaign

    with locked_campaign(root):
        yield


def gate_campaign(
    root: Path | str,
    *,
    figures: bool = True,
    locked: bool = False,
    allow_unsealed: bool = False,
    journal_head: str | None = None,
    confirms: Path | str | None = None,
) -> Concluded:
    """``harness gate DIR``: decide, record and render under the campaign lock (``locked``:
    the caller already holds it). ``journal_head``: a head of the journal kept from an earlier
    gate; the directory fails verification unless it lies on the journal's chain.
    ``confirms``: the first campaign whose unconfirmed failures this one, run on its card's
    ``confirm.box``, settles (harness.gate.confirm); its verdict.json and record.md are linked
    back under its own lock.

    A directory not sealed from its start is refused (exit 3, its verdict.json and JUnit
    rewritten as failing) unless ``allow_unsealed``: stripping the seal must not turn into a
    verdict. Allowed, every output of the verdict says it is unverified."""
    from harness.errors import VerificationError
    from harness.gate.confirm import confirm_pair, link_first

    root = Path(root)
    with _held(root, locked):
        try:
            decision = decide(root, journal_head=journal_head)
        except VerificationError as exc:
            # No old PASS left in place; nothing written where no verdict was before (a
            # mistyped path is no campaign).
            if (root / "verdict.json").is_file() and not (root / "verdict.json").is_symlink():
                _write_failing(root, root.parent.name, str(exc))
            raise
        if decision.verdict.unverified and not allow_unsealed:
            _refuse_unsealed(decision)
        answers: dict[str, str] = {}
        if confirms is not None:
            answers = confirm_pair(decision.verdict, decision.analysis, Path(confirms))
        record(decision)
        concluded = Concluded(decision, render(decision, figures=figures))
    if confirms is not None and answers:
        from harness.formats.lock import locked_campaign

        # After this campaign's lock is let go: two campaigns' locks are never held together.
        with locked_campaign(Path(confirms)):
            link_first(Path(confirms), root, answers)
    return concluded


def _write_failing(root: Path, campaign: str, text: str, unverified: str = "") -> None:
    """``verdict.json`` and JUnit of a directory that could not be gated: failing, with why."""
    from harness.gate.evaluate import GateResult, Verdict, write_verdict

    gate = GateResult("sealed", "records verified", False, text)
    write_verdict(Verdict(campaign, False, [gate], [], unverified=unverified), root)


def _refuse_unsealed(decision: Decision) -> None:
    from harness.errors import VerificationError

    text = (
        f"{decision.root}: {decision.verdict.unverified}; `harness gate --allow-unsealed "
        f"{decision.root}` reads it unverified and says so in every output"
    )
    _write_failing(decision.root, decision.verdict.campaign, text, decision.verdict.unverified)
    raise VerificationError(text)


def report_campaign(root: Path | str, *, figures: bool = True) -> Concluded:
    """``harness report DIR``: decide and render under the lock; the verdict and the results
    store are left as ``harness gate`` last wrote them."""
    root = Path(root)
    with _held(root, False):
        decision = decide(root)
        return Concluded(decision, render(decision, figures=figures))


def analyze_only(root: Path | str) -> tuple[CampaignAnalysis, Path]:
    """``harness analyze DIR``: the analysis files written under the lock, no gates."""
    from harness.analyze.campaign import analyze_campaign, write_analysis
    from harness.report.terminal import note_unsealed

    root = Path(root)
    with _held(root, False):
        analysis = analyze_campaign(root)
        note_unsealed(analysis)
        return analysis, write_analysis(analysis)


def run_campaign(
    card: Path | str | None = None,
    *,
    resume: Path | str | None = None,
    cycles: int | None = None,
    reports: Path | str = "reports",
    scale: float = 1.0,
    quiet: bool = True,
    out: TextIO | None = None,
    allow_unsealed: bool = False,
    card_folder: Path | None = None,
) -> RunResult:
    """``harness run``: a new campaign of ``card`` under ``reports`` (or the one at ``resume``,
    extended to ``cycles``), its runs not yet done executed and, unless interrupted, gated —
    all under one hold of the campaign lock. Progress lines go to ``out``. ``card_folder``:
    where the card's relative paths and names start, when not beside it (a bisect's step
    cards are written into the bisect's folder, but name the user's card's files)."""
    from harness.card import load_card, scale_workload
    from harness.card.inputs import Locator
    from harness.execute.campaign import execute_campaign, new_campaign_dir
    from harness.execute.engine_inputs import check_engine_inputs
    from harness.execute.reopen import finish_extension, reopen_campaign
    from harness.formats.lock import campaign_lock
    from harness.formats.records import open_campaign
    from harness.formats.verify import verify_campaign
    from harness.history.releases import check_named_releases
    from harness.plan.build import build_plan

    out = out if out is not None else io.StringIO()
    notes: list[str] = []
    # Held from before the first write of a resume to the last write of the verdict.
    with contextlib.ExitStack() as held:
        if resume is not None:
            root = Path(resume)
            open_campaign(root)  # not a campaign directory: said before a lock file is made in it
            held.enter_context(campaign_lock(root))
            # Nothing is booted for a directory that does not hold what its journal sealed:
            # its verdict would be refused after every run had been spent.
            repaired = finish_extension(root)
            if repaired is not None:
                notes.append(repaired)
            verify_campaign(root, resuming=True)
            reopened = reopen_campaign(root, cycles=cycles)
            campaign, loaded, plan = reopened.campaign, reopened.loaded, reopened.plan
            notes.extend(reopened.notes)
            if reopened.extended_from is not None:
                notes.append(
                    f"extended: {reopened.extended_from} → {plan.cycles} cycles "
                    f"({len(plan.runs)} runs planned)"
                )
            campaign.journal.append("campaign_resume")
        else:
            if card is None:
                raise BadInput("give a CARD to run, or --resume DIR")
            if cycles is not None:
                raise BadInput(
                    "--cycles extends a campaign: give it with --resume DIR "
                    "(for a new campaign, set design.cycles on the card)"
                )
            where = None if card_folder is None else Locator(card_folder.resolve())
            loaded = scale_workload(load_card(Path(card), where), scale)
            plan = build_plan(loaded, scale=scale)
            check_named_releases(loaded, Path(reports) / "history")
            # Before anything is made or booted; what it only warns of is said first.
            notes.extend(f"warning: {w}" for w in check_engine_inputs(loaded))
            campaign = new_campaign_dir(loaded, plan, Path(reports))
            held.enter_context(campaign_lock(campaign.root))
        for note in notes:
            out.write(note + "\n")
        out.write(f"campaign directory: {campaign.root}\n")
        out.flush()
        outcome = execute_campaign(loaded, plan, campaign, quiet=quiet, out=out)
        if outcome.interrupted:
            return RunResult(campaign.root, outcome, None, notes)
        out.write(f"runs: {len(outcome.done)} done, {len(outcome.failed)} failed\n")
        out.flush()
        concluded = gate_campaign(campaign.root, locked=True, allow_unsealed=allow_unsealed)
        return RunResult(campaign.root, outcome, concluded, notes)
