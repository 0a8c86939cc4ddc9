"""Where a campaign stands in its sequential design: this look, its level, and the looks so far.

docs/design.md#sequential-designs. The analysis of a sequential campaign decides at the
nominal level of the look it is at (:class:`harness.stats.sequential.SequentialPlan`); the
looks already taken are read from the journal, where the sequential loop records each one with
the statistics it saw, so the report can show them and the spending follows the looks really
made. A fixed design extended after a look is flagged: its labels do not account for the look.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.card import Card
from harness.errors import VerificationError
from harness.stats.power import needed_words
from harness.stats.sequential import SequentialPlan, spent

LOOK_EVENT = "look"
EXTENDED_EVENT = "campaign_extended"
DECIDED_LABELS = frozenset({"better", "worse", "within noise"})


@dataclass(frozen=True)
class LookState:
    """The look a sequential campaign's analysis is at."""

    look: int  # 1-based
    cycles: int
    max_cycles: int
    information: float
    nominal_alpha: float
    alpha_spent: float
    taken: tuple[int, ...]  # cycle counts of the looks before this one
    next_look: int | None  # cycle count of the next scheduled look; None at the last

    @property
    def final(self) -> bool:
        """True at max_cycles: no look follows."""
        return self.next_look is None

    def remedy(self) -> str:
        """What an inconclusive label at this look should say to do."""
        if self.next_look is not None:
            return f"the sequential design looks again at {self.next_look} cycles"
        return (
            f"max_cycles ({self.max_cycles}) reached: a new campaign with a larger max_cycles "
            "can decide it; extending this one would spend α the design does not have"
        )

    def more_cycles(self, needed: int, span: tuple[int, int] | None = None) -> str:
        """Advice for ``needed`` cycles in all that this design allows: never an extension past
        max_cycles, which the design forbids (α is spent there)."""
        words = needed_words(needed, span)
        if needed <= self.max_cycles:
            return words
        return (
            f"{words}, past this design's max_cycles "
            f"{self.max_cycles}: start a new campaign with max_cycles >= {needed}"
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "look": self.look,
            "cycles": self.cycles,
            "max_cycles": self.max_cycles,
            "information": self.information,
            "nominal_alpha": self.nominal_alpha,
            "alpha_spent": self.alpha_spent,
            "looks_before": list(self.taken),
            "next_look": self.next_look,
        }


def planned_cycles(plan: dict[str, Any]) -> int:
    """Mirrored cycles in a plan (its highest cycle index + 1)."""
    runs = plan.get("runs") or []
    return 1 + max((int(r["cycle"]) for r in runs), default=-1)


def design_plan(card: Card) -> SequentialPlan | None:
    """The card's sequential design, or None for a fixed one."""
    design = card.design
    if not design.sequential or design.max_cycles is None:
        return None
    return SequentialPlan(design.cycles, design.max_cycles, design.look_every, card.analysis.alpha)


def look_state(card: Card, cycles: int, events: Sequence[dict[str, Any]]) -> LookState | None:
    """The look at ``cycles`` cycles of a sequential card; None for a fixed design."""
    design = design_plan(card)
    if design is None:
        return None
    cycles = min(cycles, design.max_cycles)
    recorded = sorted({_count(e, "cycles") for e in events if e.get("event") == LOOK_EVENT})
    before = [m for m in recorded if m < cycles] or [m for m in design.scheduled() if m < cycles]
    alpha = design.nominal_alpha(cycles, [*before, cycles])
    information = cycles / design.max_cycles
    return LookState(
        look=len(before) + 1,
        cycles=cycles,
        max_cycles=design.max_cycles,
        information=information,
        nominal_alpha=alpha,
        alpha_spent=spent(information, design.alpha),
        taken=tuple(before),
        next_look=design.next_look(cycles),
    )


def extension_warnings(card: Card, events: Sequence[dict[str, Any]]) -> list[str]:
    """A fixed design extended after the campaign was looked at: its labels overclaim."""
    if card.design.sequential:
        return []
    extended = [e for e in events if e.get("event") == EXTENDED_EVENT]
    if not extended:
        return []
    last = extended[-1]
    return [
        f"the campaign was extended to {last.get('to', '?')} cycles after it ran "
        f"{extended[0].get('from', '?')}: if the extension followed a look at the results, the "
        "labels do not account for it and overstate the evidence; declare design.sequential "
        "with max_cycles to add cycles after looking"
    ]


def looks_frame(events: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per recorded look and gated comparison: what each look saw and decided."""
    rows = []
    for event in events:
        if event.get("event") != LOOK_EVENT:
            continue
        base = {
            "look": _count(event, "look"),
            "cycles": _count(event, "cycles"),
            "information": event.get("information"),
            "nominal_alpha": event.get("nominal_alpha"),
            "decision": str(event.get("decision", "")),
        }
        for item in event.get("comparisons") or [{}]:
            rows.append({**base, **item})
    return pd.DataFrame(rows)


def _count(event: dict[str, Any], field: str) -> int:
    """A look event's ``look`` or ``cycles``: a whole number no harness writes below 1. Anything
    else is an edited journal, and the looks' levels would rest on it: refused (exit 3)."""
    value = event.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise VerificationError(
            f"journal.jsonl: a look event's {field} is {value!r}, not a whole number of "
            f"{'looks' if field == 'look' else 'cycles'} from 1: the journal was edited or "
            "damaged, and the sequential levels cannot be read from it"
        )
    return value


_SETTLED_OTHERWISE = {"not engaged", "corrupt", "not equivalent"}


def undecided(comparisons: Sequence[dict[str, Any]], gated: Sequence[str]) -> list[str]:
    """``cell/state metric label`` for every gated comparison the look has not decided."""
    return [
        f"{c['cell']}/{c['cache_state']} {c['metric']} {c['label']}"
        for c in comparisons
        # More cycles cannot make a change that never took effect take effect, mend a boot's
        # weights, or bring outputs that disagree within the margin.
        if c["metric"] in gated and c["label"] not in DECIDED_LABELS | _SETTLED_OTHERWISE
    ]


__all__ = [
    "LOOK_EVENT",
    "LookState",
    "design_plan",
    "extension_warnings",
    "look_state",
    "looks_frame",
    "planned_cycles",
    "undecided",
]
