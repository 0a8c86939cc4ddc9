"""Confirmation on a second, independent box (the card's ``confirm: {box: NAME}``).

One box's false *worse* blocks a release, and over hundreds of gates its false alarms add up;
perf CI confirms a failure on an independent box before it blocks. A failed ``better``,
``survives`` or ``regression`` gate of a card that asks for it is *unconfirmed*: still exit 1
(nothing is promoted on one box's word either way), with the command that settles it. The
second campaign (the same card run on ``confirm.box``), gated with ``harness gate DIR2
--confirms DIR1``, decides the pair: a failure it shows too is *confirmed* and fails; one it
does not show is *not confirmed*, and the gate is what the second box says. Both verdicts name
the other's directory. No new decision math: each box's gate decides as it always does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.card import CONFIRMABLE_KINDS, Card, read_card_schema
from harness.errors import BadInput, HarnessError
from harness.formats.records import write_json_atomic, write_text_atomic
from harness.gate.result import GateResult, gate_name

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

__all__ = [
    "CONFIRMED",
    "NOT_CONFIRMED",
    "UNCONFIRMED",
    "confirm_pair",
    "confirmation_text",
    "keep_link",
    "link_first",
    "mark_unconfirmed",
]

UNCONFIRMED, CONFIRMED, NOT_CONFIRMED = "unconfirmed", "confirmed", "not confirmed"


class Verdict(Protocol):
    """What confirmation reads and sets of :class:`harness.gate.evaluate.Verdict` (which
    imports this module: no circle)."""

    gates: list[GateResult]
    confirm_box: str
    confirms: str
    confirmed_by: str


def _confirmable(result: GateResult) -> bool:
    """A failure on this box's complete data that chance could have made: not one for runs
    missing (a resume settles it) nor an inconclusive one (more cycles do)."""
    return (
        result.kind in CONFIRMABLE_KINDS
        and not result.passed
        and not result.incomplete
        and not result.undecided
    )


def mark_unconfirmed(results: list[GateResult], analysis: CampaignAnalysis) -> str:
    """Mark the card's confirmable failures unconfirmed, each reason ending with the command
    that confirms it; returns ``confirm.box`` ("" when the card asks for no confirmation)."""
    confirm = analysis.card.confirm
    if confirm is None:
        return ""
    root = analysis.campaign.root
    for result in results:
        if _confirmable(result):
            result.confirmation = UNCONFIRMED
            result.reason += (
                f"; unconfirmed: it blocks (exit 1) until box {confirm.box} shows it too: run "
                f"this card with `box: {confirm.box}`, then `harness gate DIR2 --confirms "
                f"{root}` (DIR2: that campaign's directory)"
            )
    return confirm.box


def box_names(card: Card) -> list[str]:
    """The boxes a campaign's card ran on, by name (an inline box by its name or host)."""
    entries = card.boxes if card.boxes is not None else [card.box]
    return [e if isinstance(e, str) else (e.name or e.host or "inline") for e in entries]


def _first_verdict(first: Path) -> dict[str, Any]:
    path = first / "verdict.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(
            f"{path}: not found: --confirms takes the directory of a gated campaign "
            "(`harness gate DIR1` first)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: not a verdict: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("gates"), list):
        raise BadInput(f"{path}: gates: not a verdict (no list of gates)")
    return data


def _check_pair(data: dict[str, Any], analysis: CampaignAnalysis, first: Path) -> list[str]:
    """Why the two campaigns are no pair: every problem at once, each naming file and field."""
    path, card = first / "verdict.json", analysis.card
    own_card = analysis.campaign.root / "card.yaml"
    problems: list[str] = []
    if first.resolve() == analysis.campaign.root.resolve():
        problems.append(f"{path}: --confirms: a campaign cannot confirm itself")
    if data.get("campaign") != card.campaign:
        problems.append(
            f"{path}: campaign: {data.get('campaign')!r} is not {card.campaign!r}: a failure "
            "is confirmed by a campaign of the same card"
        )
    box = data.get("confirm_box")
    if not isinstance(box, str) or not box:
        problems.append(
            f"{path}: confirm_box: its card asks for no confirmation (`confirm: {{box: NAME}}`)"
        )
    elif box not in box_names(card):
        problems.append(
            f"{own_card}: box: ran on {', '.join(box_names(card))}, but {first} asks for "
            f"confirmation on box {box!r}"
        )
    pending = [
        g for g in data["gates"] if isinstance(g, dict) and g.get("confirmation") == UNCONFIRMED
    ]
    if not pending:
        problems.append(f"{path}: gates: no failure awaits confirmation")
    problems += _same_card(card, first, own_card)
    names = {gate_name(g) for g in card.gates}
    missing = [str(g.get("name")) for g in pending if g.get("name") not in names]
    if missing:
        problems.append(
            f"{own_card}: gates: no gate {', '.join(missing)} to confirm {first}'s with: run "
            "the same card"
        )
    return problems


# What makes two campaigns the same experiment: all of the card but where it ran and which box
# confirms it (a card run on the second box names the first there, or nothing).
_SAME = ("runtime", "prompts", "workload", "cells", "control", "design", "analysis", "gates")


def _same_card(card: Card, first: Path, own_card: Path) -> list[str]:
    """The fields where the two campaigns' frozen cards differ: a failure is confirmed by the
    same experiment on another box, not by another experiment."""
    try:
        theirs = read_card_schema(first / "card.yaml")
    except HarnessError as exc:
        return [f"{first / 'card.yaml'}: cannot be read: {exc}"]
    return [
        f"{own_card}: {name}: differs from {first / 'card.yaml'}: confirm with the same card, "
        "changing only `box` (and `confirm`)"
        for name in _SAME
        if getattr(card, name) != getattr(theirs, name)
    ]


def confirm_pair(verdict: Verdict, analysis: CampaignAnalysis, first: Path) -> dict[str, str]:
    """Settle ``first``'s unconfirmed failures with this (the confirming) campaign's verdict,
    in place: confirmed where this box fails the gate too on complete data; not confirmed where
    it does not (the gate is what this box says). Returns gate name → answer. Raises BadInput
    (exit 2) when the two are no pair."""
    data = _first_verdict(first)
    problems = _check_pair(data, analysis, first)
    if problems:
        raise BadInput(f"{first}: cannot be confirmed by {analysis.campaign.root}", problems)
    box = str(data["confirm_box"])
    names = [
        str(g["name"])
        for g in data["gates"]
        if isinstance(g, dict) and g.get("confirmation") == UNCONFIRMED
    ]
    return _settle(verdict, names, first, box)


def _settle(verdict: Verdict, names: list[str], first: Path, box: str) -> dict[str, str]:
    """Each named gate of this (the confirming) verdict answers ``first``'s failure of it:
    confirmed where it fails too on complete data, not confirmed where it does not; runs
    missing answer nothing yet."""
    own = {g.name: g for g in verdict.gates}
    answers: dict[str, str] = {}
    for name in names:
        mine = own.get(name)
        if mine is None:
            continue
        if mine.incomplete:
            mine.reason += f"; confirms nothing of {first} until these runs complete"
            continue
        if not mine.passed and not mine.undecided:
            mine.confirmation = CONFIRMED
            mine.reason = f"confirmed: box {box} fails it too, as {first} did: {mine.reason}"
        else:
            mine.confirmation = NOT_CONFIRMED
            mine.reason = (
                f"not confirmed: {first} failed it, box {box} does not, so the pair's gate is "
                f"this box's: {mine.reason}"
            )
        answers[name] = mine.confirmation
    verdict.confirms = str(first)
    return answers


def link_first(first: Path, second: Path, answers: dict[str, str]) -> None:
    """Write the second box's answers into the first campaign's ``verdict.json`` and
    ``record.md``: its own ``passed`` and ``outcome`` stay what its data said; the pair's
    verdict is the confirming campaign's. Call under the first campaign's lock."""
    data = _first_verdict(first)
    data["confirmed_by"] = str(second)
    for gate in data["gates"]:
        answer = answers.get(str(gate.get("name")))
        if answer is not None and gate.get("confirmation") == UNCONFIRMED:
            gate["confirmation"] = answer
            gate["reason"] = f"{answer} by {second}: {gate.get('reason', '')}"
    if CONFIRMED in answers.values():
        data["outcome"] = "fail"  # as `harness gate` of it now says: a failure two boxes show
    write_json_atomic(first / "verdict.json", data)
    record = first / "record.md"
    if record.is_file():
        lines = [f"- {name}: {answer} by {second}" for name, answer in answers.items()]
        text = record.read_text(encoding="utf-8").rstrip("\n")
        section = "\n\n## Confirmation\n\n" + "\n".join(lines) + "\n"
        write_text_atomic(record, text + section)


def keep_link(verdict: Verdict, analysis: CampaignAnalysis) -> None:
    """A campaign of a pair gated (or reported) again keeps its link, which its last
    ``verdict.json`` holds: a first campaign the second box's answers for the gates that
    still fail unconfirmed (the answer was about the same runs), a confirming one its answers
    as its gates now give them."""
    root = analysis.campaign.root
    try:
        old = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    if not isinstance(old, dict) or not isinstance(old.get("gates"), list):
        return
    answers = {
        str(g.get("name")): str(g.get("confirmation"))
        for g in old["gates"]
        if isinstance(g, dict) and g.get("confirmation") in (CONFIRMED, NOT_CONFIRMED)
    }
    first, second = old.get("confirms"), old.get("confirmed_by")
    if isinstance(first, str) and first:
        _settle(verdict, list(answers), Path(first), ", ".join(box_names(analysis.card)))
    if isinstance(second, str) and second:
        for gate in verdict.gates:
            answer = answers.get(gate.name)
            if answer is not None and gate.confirmation == UNCONFIRMED:
                gate.confirmation = answer
                gate.reason = f"{answer} by {second}: {gate.reason}"
        verdict.confirmed_by = second


def confirmation_text(verdict: Verdict) -> str:
    """The verdict's link to the other campaign of its pair, for the terminal and record.md;
    "" when it has none."""
    if verdict.confirms:
        answers = [
            f"{g.name}: {g.confirmation}"
            for g in verdict.gates
            if g.confirmation in (CONFIRMED, NOT_CONFIRMED)
        ]
        return f"confirms {verdict.confirms} ({'; '.join(answers) or 'nothing settled'})"
    if verdict.confirmed_by:
        return f"confirmed by {verdict.confirmed_by}"
    if any(g.confirmation == UNCONFIRMED for g in verdict.gates):
        return f"a failure here awaits confirmation on box {verdict.confirm_box}"
    return ""
