"""The sequential design's loop: run the planned cycles, look, and grow the campaign until decided.

docs/design.md#sequential-designs. After the runs planned so far, the campaign is analysed at
the nominal level of its look; the look is journalled (``look``: which look, cycles,
information, nominal α, what each gated comparison said, the decision). The campaign stops when
every gated metric is decided or at ``max_cycles``, and otherwise grows to the next look with
:func:`harness.execute.reopen.extend_campaign` and runs the new cycles. A run that fails or a
signal ends the loop: a campaign with missing data is never grown, and a resume picks the loop
up where it stopped (a look already journalled for the current cycles is not taken twice).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TextIO

from harness.analyze.campaign import CampaignAnalysis, analyze_campaign, gated_metrics
from harness.analyze.looks import LOOK_EVENT
from harness.card import LoadedCard
from harness.execute.fleet import FleetRunner
from harness.execute.reopen import extend_campaign
from harness.execute.run import CampaignOutcome
from harness.execute.scope import ProgressCallback
from harness.formats.records import CampaignDir
from harness.plan.build import Plan
from harness.stats.cycles import finite

ProgressFactory = Callable[[Plan], AbstractContextManager[ProgressCallback]]


def record_look(campaign: CampaignDir, analysis: CampaignAnalysis) -> tuple[bool, str]:
    """Journal the look ``analysis`` stands at; return (stop, why)."""
    look = analysis.look
    assert look is not None, "record_look needs a sequential campaign"
    undecided = analysis.undecided()
    if not undecided:
        stop, why = True, "every gated metric is decided"
    elif look.final:
        stop, why = (
            True,
            f"max_cycles ({look.max_cycles}) reached; undecided: {', '.join(undecided)}",
        )
    else:
        stop, why = (
            False,
            f"undecided: {', '.join(undecided)}; next look at {look.next_look} cycles",
        )
    previous = [e for e in campaign.journal.events() if e.get("event") == LOOK_EVENT]
    if previous and int(previous[-1].get("cycles", -1)) == look.cycles:
        return stop, why  # a resumed campaign already took this look
    gated = set(gated_metrics(analysis.card))
    comparisons = [
        {
            "cell": item.cell,
            "cache_state": item.cache_state,
            "metric": item.comparison.metric,
            # The journal is JSON: a bound past the largest float (a first look's interval at
            # one df) is null there, and "∞" where the looks are shown.
            "ratio": finite(item.comparison.ratio),
            "ci_low": finite(item.comparison.ci_low),
            "ci_high": finite(item.comparison.ci_high),
            "p_value": item.comparison.p_value,
            "label": item.comparison.label,
        }
        for item in analysis.comparisons
        if item.comparison.metric in gated
    ]
    campaign.journal.append(
        LOOK_EVENT,
        look=look.look,
        cycles=look.cycles,
        information=look.information,
        nominal_alpha=look.nominal_alpha,
        alpha_spent=look.alpha_spent,
        decision="stop" if stop else "continue",
        why=why,
        comparisons=comparisons,
    )
    return stop, why


def run_sequential(
    loaded: LoadedCard,
    plan: Plan,
    campaign: CampaignDir,
    progress_for: ProgressFactory,
    out: TextIO,
    runner_options: dict[str, Any] | None = None,
) -> CampaignOutcome:
    """Run, look and grow until the sequential design stops; the outcome of every run."""
    total = CampaignOutcome(campaign.root)
    while True:
        with progress_for(plan) as progress:
            outcome = FleetRunner(
                loaded, plan, campaign, progress, **(runner_options or {})
            ).execute()
        total.done = sorted(set(total.done) | set(outcome.done))
        total.failed = sorted(set(outcome.failed))
        if outcome.interrupted:
            total.interrupted = True
            total.interrupted_by, total.exit_code = outcome.interrupted_by, outcome.exit_code
            return total
        if outcome.failed:
            out.write(
                f"look skipped: {len(outcome.failed)} runs failed, so the campaign is not grown\n"
            )
            return total
        analysis = analyze_campaign(campaign.root, predictions=False)
        look = analysis.look
        assert look is not None
        stop, why = record_look(campaign, analysis)
        out.write(
            f"look {look.look} at {look.cycles} cycles (nominal α {look.nominal_alpha:.3g}): "
            f"{'stop' if stop else 'continue'}: {why}\n"
        )
        out.flush()
        if stop or look.next_look is None:
            return total
        plan = extend_campaign(campaign, plan, look.next_look)


__all__ = ["record_look", "run_sequential"]
