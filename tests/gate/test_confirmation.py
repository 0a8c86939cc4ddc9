"""Confirmation on a second box (issue 56): a card's ``confirm: {box: NAME}`` holds a failed
better gate as *unconfirmed* (exit 1) until ``harness gate DIR2 --confirms DIR1`` settles it.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated through the CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from harness.cli import main
from tests.gate.campaigns import Synth, build_campaign, card_text, faster

GATE = "  - {kind: better, metric: decode_tok_s}"
BOXES = "local: {kind: local, platform: linux-cpu}\nb: {kind: local, platform: linux-cpu}\n"


def _campaign(tmp: Path, name: str, box: str, ratio: float, confirm: str | None) -> Path:
    """A campaign of the one card on ``box``, the treatment at ``ratio`` of the control."""
    folder = tmp / name
    folder.mkdir()
    (folder / "boxes.yaml").write_text(BOXES, encoding="utf-8")
    text = card_text(GATE, cycles=2).replace("box: local\n", f"box: {box}\n")
    if confirm is not None:
        text += f"confirm: {{box: {confirm}}}\n"
    synth = Synth(speed=faster(ratio), box=lambda run: box)
    return build_campaign(folder, text, synth).root


def _gate(root: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``harness gate DIR``: its exit code, the verdict.json it left, what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["gate", str(root), *extra], out=out)
    path = root / "verdict.json"
    verdict = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return code, verdict, out.getvalue() + err.getvalue()


def _first_worse(tmp: Path) -> Path:
    root = _campaign(tmp, "one", "local", 0.7, confirm="b")
    code, verdict, printed = _gate(root)
    gate = verdict["gates"][0]
    # Worse on one box: blocking (exit 1), but said to await the second box, with the command.
    assert code == 1 and not verdict["passed"], printed
    assert (verdict["outcome"], verdict["confirm_box"]) == ("unconfirmed", "b")
    assert gate["confirmation"] == "unconfirmed" and ": worse" in gate["reason"]
    assert f"`harness gate DIR2 --confirms {root}`" in gate["reason"]
    assert "verdict: UNCONFIRMED" in printed
    junit = ET.parse(root / "verdict.junit.xml").getroot()
    failure = junit.find(".//failure")
    assert failure is not None and failure.get("type") == "unconfirmed"
    assert "UNCONFIRMED" in (root / "record.md").read_text(encoding="utf-8")
    return root


def test_a_worse_on_one_box_is_unconfirmed_and_a_second_box_confirms_it(tmp_path: Path) -> None:
    first = _first_worse(tmp_path)
    # The same card on box b (confirming back on `local`, as a card run there would name it).
    second = _campaign(tmp_path, "two", "b", 0.7, confirm="local")
    code, verdict, printed = _gate(second, "--confirms", str(first))
    gate = verdict["gates"][0]
    assert code == 1 and (verdict["outcome"], verdict["confirms"]) == ("fail", str(first))
    assert gate["confirmation"] == "confirmed" and gate["reason"].startswith("confirmed: box b")
    assert f"confirms {first}" in printed
    assert str(first) in (second / "record.md").read_text(encoding="utf-8")
    # The first campaign names the second, in verdict.json and record.md.
    linked = json.loads((first / "verdict.json").read_text(encoding="utf-8"))
    assert linked["confirmed_by"] == str(second) and linked["outcome"] == "fail"
    assert linked["gates"][0]["confirmation"] == "confirmed"
    record = (first / "record.md").read_text(encoding="utf-8")
    assert "## Confirmation" in record and str(second) in record


def test_a_failure_the_second_box_does_not_show_is_not_confirmed_and_the_pair_passes(
    tmp_path: Path,
) -> None:
    first = _first_worse(tmp_path)
    second = _campaign(tmp_path, "two", "b", 1.5, confirm=None)
    code, verdict, _ = _gate(second, "--confirms", str(first))
    gate = verdict["gates"][0]
    assert code == 0 and verdict["passed"] and verdict["outcome"] == "pass"
    assert gate["confirmation"] == "not confirmed" and str(first) in gate["reason"]
    linked = json.loads((first / "verdict.json").read_text(encoding="utf-8"))
    assert linked["confirmed_by"] == str(second)
    assert linked["gates"][0]["confirmation"] == "not confirmed"
    # Its own data still said worse: the first alone never passes, and gated again it keeps
    # the second box's answer and the link.
    code, again, _ = _gate(first)
    assert code == 1 and not again["passed"] and again["outcome"] == "unconfirmed"
    assert again["confirmed_by"] == str(second)
    assert again["gates"][0]["confirmation"] == "not confirmed"
    # So does the second, gated again alone.
    code, again, _ = _gate(second)
    assert code == 0 and again["confirms"] == str(first)
    assert again["gates"][0]["confirmation"] == "not confirmed"


def test_confirms_fails_closed_on_a_campaign_that_is_no_pair(tmp_path: Path) -> None:
    first = _first_worse(tmp_path)
    # Run on the first's own box: not the box its card asks for (exit 2, file and field named).
    same_box = _campaign(tmp_path, "same", "local", 0.7, confirm="b")
    code, _, printed = _gate(same_box, "--confirms", str(first))
    assert code == 2
    assert f"{same_box / 'card.yaml'}: box: ran on local, but {first} asks" in printed
    # Another experiment on box b (the treatment's cell changed): not the same card.
    other = tmp_path / "other"
    other.mkdir()
    (other / "boxes.yaml").write_text(BOXES, encoding="utf-8")
    text = card_text(GATE, cycles=2).replace("box: local\n", "box: b\n")
    text = text.replace("  treat: {}", "  treat: {env: {REFBOX_HOT_SLOTS: '8'}}")
    changed = build_campaign(other, text, Synth(speed=faster(0.7), box=lambda run: "b")).root
    code, _, printed = _gate(changed, "--confirms", str(first))
    assert code == 2 and f"{changed / 'card.yaml'}: cells: differs from" in printed
    # A directory without a verdict: named, with the fix.
    empty = tmp_path / "empty"
    empty.mkdir()
    second = _campaign(tmp_path, "two", "b", 0.7, confirm=None)
    code, _, printed = _gate(second, "--confirms", str(empty))
    assert code == 2 and f"{empty / 'verdict.json'}: not found" in printed
    assert not (second / "verdict.json").exists()  # bad input leaves no verdict
    (empty / "verdict.json").write_text('{"gates": ', encoding="utf-8")
    code, _, printed = _gate(second, "--confirms", str(empty))
    assert code == 2 and f"{empty / 'verdict.json'}: not a verdict" in printed
    # A first campaign with nothing awaiting confirmation: it passed.
    good = _campaign(tmp_path, "good", "local", 1.5, confirm="b")
    assert _gate(good)[0] == 0
    code, _, printed = _gate(second, "--confirms", str(good))
    assert code == 2
    assert f"{good / 'verdict.json'}: gates: no failure awaits confirmation" in printed


def test_a_card_without_confirm_fails_a_worse_at_once(tmp_path: Path) -> None:
    root = _campaign(tmp_path, "plain", "local", 0.7, confirm=None)
    code, verdict, _ = _gate(root)
    assert code == 1 and verdict["outcome"] == "fail" and verdict["confirm_box"] == ""
    assert verdict["gates"][0]["confirmation"] == ""
