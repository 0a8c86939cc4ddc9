"""The verdict as a whole: verdict.json, JUnit, incomplete runs, and `harness gate`'s exit codes.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated without booting anything.
"""

from __future__ import annotations

import io
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from harness.formats.records import (
    RUN_OK,
)
from harness.gate.evaluate import evaluate_gates, write_verdict
from tests.conftest import DATA, run_cli
from tests.gate.campaigns import (
    Run,
    Synth,
    build_campaign,
    card_text,
    faster,
    only,
    verdict_of,
)

MIXED = (
    "  - {kind: exact_outputs}\n"
    "  - {kind: counter, counter: swaps, max: 0}\n"
    "  - {kind: better, metric: decode_tok_s}\n"
    "  - {kind: lockstep}"
)


def test_verdict_json_and_junit(tmp_path: Path) -> None:
    campaign = build_campaign(tmp_path, card_text(MIXED, cycles=2), Synth(speed=faster(1.5)))
    verdict = evaluate_gates(analyze_campaign(campaign.root))
    write_verdict(verdict, campaign.root)

    data = json.loads((campaign.root / "verdict.json").read_text(), parse_constant=_reject_constant)
    assert data["schema_version"] == 1 and data["campaign"] == "gates"
    assert data["passed"] is False and data["incomplete_runs"] == []
    assert [(g["kind"], g["passed"]) for g in data["gates"]] == [
        ("exact_outputs", True),
        ("counter", True),
        ("better", True),
        ("lockstep", False),
    ]
    assert data["gates"][2]["evidence"]["treat/warm"]["label"] == "better"

    root = ET.parse(campaign.root / "verdict.junit.xml").getroot()
    assert root.tag == "testsuites"
    (suite,) = list(root)
    assert suite.get("name") == "harness.gates"
    assert suite.get("tests") == "4" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases] == [
        "gate.exact_outputs",
        "gate.counter",
        "gate.better",
        "gate.lockstep",
        "campaign.journal_head",  # skipped: no head kept outside covers the journal's end
    ]
    assert cases[-1].find("skipped") is not None
    assert cases[2].get("name") == "better decode_tok_s"
    failures = [c for c in cases if c.find("failure") is not None]
    assert [c.get("classname") for c in failures] == ["gate.lockstep"]
    failure = failures[0].find("failure")
    assert failure is not None and "no lockstep result" in (failure.get("message") or "")
    assert failure.text == verdict.gates[3].reason
    passing = cases[0].find("system-out")
    assert passing is not None and "outputs match control" in (passing.text or "")


def _reject_constant(name: str) -> None:
    raise AssertionError(f"verdict.json holds {name}, which is not JSON")


def test_a_card_without_gates_never_passes(tmp_path: Path) -> None:
    verdict = verdict_of(tmp_path, "  []", Synth(speed=faster(1.5)))
    assert verdict.gates == [] and not verdict.passed


def test_verdict_lists_incomplete_runs(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: {"0001": "failed", "0004": None}.get(run["run_id"][:4], "ok"))
    verdict = verdict_of(
        tmp_path, "  - {kind: counter, counter: failed_runs, max: 2}", synth, cycles=2
    )
    assert verdict.incomplete_runs == ["0001-treat-c0-warm-s1-r0", "0004-treat-c1-warm-s0-r0"]
    assert only(verdict).passed  # two incomplete runs are within this gate's bound


def test_a_verdict_with_incomplete_runs_never_passes(tmp_path: Path) -> None:
    # The gate tolerates two failed runs, but the campaign is still incomplete.
    synth = Synth(status=lambda run: "failed" if run["run_id"].startswith("0001") else RUN_OK)
    verdict = verdict_of(tmp_path, "  - {kind: counter, counter: failed_runs, max: 2}", synth)
    assert only(verdict).passed and not verdict.passed
    assert verdict.exit_code() == 3
    write_verdict(verdict, tmp_path)
    assert json.loads((tmp_path / "verdict.json").read_text())["passed"] is False
    cases = ET.parse(tmp_path / "verdict.junit.xml").getroot().findall(".//testcase")
    complete = [c for c in cases if c.get("classname") == "campaign.complete"]
    assert len(complete) == 1
    failure = complete[0].find("failure")
    assert failure is not None and "0001-treat-c0-warm-s1-r0" in (failure.text or "")


@pytest.mark.slow
def test_cli_gate_exit_codes(tmp_path: Path) -> None:
    # One subprocess per exit code: each one also renders the HTML report, which takes seconds.
    gates = "  - {kind: better, metric: decode_tok_s}\n  - {kind: counter, counter: swaps, max: 0}"

    def incomplete(run: Run) -> str | None:
        return {"0002": None, "0005": "failed"}.get(run["run_id"][:4], RUN_OK)

    cases = {
        "pass": (Synth(speed=faster(1.5)), 0, "verdict: PASS"),
        "fail": (Synth(speed=faster(0.7)), 1, "worse"),
        "incomplete": (Synth(speed=faster(1.5), status=incomplete), 3, "runs not complete"),
    }
    for name, (synth, code, shown) in cases.items():
        campaign = build_campaign(tmp_path / name, card_text(gates, cycles=2), synth)
        result = run_cli("gate", str(campaign.root))
        assert result.code == code, f"{name}: {result.stdout}\n{result.stderr}"
        assert shown in result.stdout, result.stdout
        assert "Traceback" not in result.stderr
        verdict = json.loads((campaign.root / "verdict.json").read_text())
        assert verdict["passed"] is (code == 0)
        assert (campaign.root / "verdict.junit.xml").is_file()
    verdict = json.loads((campaign.root / "verdict.json").read_text())
    assert verdict["incomplete_runs"] == ["0002-treat-c0-warm-s2-r0", "0005-control-c1-warm-s1-r0"]


@pytest.mark.slow
def test_cli_gate_never_exits_0_with_incomplete_runs(tmp_path: Path) -> None:
    failed_run = Synth(status=lambda run: "failed" if run["run_id"].startswith("0001") else RUN_OK)
    cases = {
        # Every gate passes on the runs that completed: still not a pass, runs are missing (3).
        "incomplete": ("  - {kind: exact_outputs, vs: control, cells: [control]}", 3),
        # A gate that fails on complete data is a failure (1), whatever else is missing.
        "also-failed": ("  - {kind: counter, counter: swaps, max: 0, cells: [control]}\n"
                        "  - {kind: lockstep}", 1),
    }  # fmt: skip
    for name, (gates, code) in cases.items():
        campaign = build_campaign(tmp_path / name, card_text(gates, cycles=2), failed_run)
        result = run_cli("gate", str(campaign.root))
        assert result.code == code, f"{name}: {result.stdout}\n{result.stderr}"
        assert "verdict: FAIL" in result.stdout
        assert "0001-treat-c0-warm-s1-r0" in result.stdout, result.stdout
        assert json.loads((campaign.root / "verdict.json").read_text())["passed"] is False


def test_cli_gate_on_a_folder_that_is_not_a_campaign_is_bad_input(tmp_path: Path) -> None:
    result = run_cli("gate", str(tmp_path))
    assert result.code == 2
    assert "not a campaign directory (no plan.json)" in result.stderr


def test_a_pass_says_which_comparisons_no_gate_asked_about(tmp_path: Path) -> None:
    """Gates on exact outputs and a counter can pass a campaign whose cells are all slower: the
    verdict (verdict.json, the terminal, record.md and the banner) says no gate asked."""
    from harness.report import build_context
    from harness.report.record import render_record
    from harness.report.terminal import print_verdict

    gates = "  - {kind: exact_outputs}\n  - {kind: counter, counter: swaps, max: 0}"
    text = card_text(gates, cycles=2, cells=("control", "slow", "slower"))
    campaign = build_campaign(tmp_path / "ladder", text, Synth(speed=faster(0.8)))
    analysis = analyze_campaign(campaign.root)
    verdict = evaluate_gates(analysis)
    assert verdict.passed and verdict.ungated == ["slow", "slower"]
    write_verdict(verdict, campaign.root)
    assert json.loads((campaign.root / "verdict.json").read_text())["ungated"] == ["slow", "slower"]
    out = io.StringIO()
    print_verdict(verdict, out)
    assert "not decided here: no gate asks whether slow, slower beat the control" in out.getvalue()
    context = build_context(campaign.root, analysis, verdict, figures=False)
    assert "**Not decided here:** no gate asks whether slow, slower beat" in render_record(context)
    gated = card_text(gates + "\n  - {kind: better, metric: decode_tok_s}", cycles=2)
    other = build_campaign(tmp_path / "gated", gated, Synth(speed=faster(1.5)))
    assert evaluate_gates(analyze_campaign(other.root)).ungated == []


WASHED = DATA / "campaigns" / "demo-washed"


def test_a_stripped_seal_never_gates_exit_0_without_the_flag_and_says_unverified_with_it(
    tmp_path: Path,
) -> None:
    # The adversary's edit: remove `seal`, `files` and the chain's `prev` from every event of a
    # sealed, passing campaign, so the directory reads as one made before sealing (it once
    # gated PASS, exit 0, with one stderr note).
    from tests.campaign_dirs import stripped_copy

    root = stripped_copy(WASHED, tmp_path / "washed")
    refused = run_cli("gate", str(root))
    assert refused.code == 3, refused.stdout + refused.stderr
    assert "not sealed from its start" in refused.stderr and "--allow-unsealed" in refused.stderr
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["passed"] is False and verdict["verified"] is False
    assert 'failures="1"' in (root / "verdict.junit.xml").read_text(encoding="utf-8")
    allowed = run_cli("gate", "--allow-unsealed", str(root))
    assert allowed.code == 0, allowed.stdout + allowed.stderr
    assert "UNVERIFIED:" in allowed.stdout
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["passed"] is True and verdict["verified"] is False
    assert "not sealed from its start" in verdict["unverified"]
    junit = (root / "verdict.junit.xml").read_text(encoding="utf-8")
    assert 'classname="campaign.sealed"' in junit and "<skipped" in junit
    assert "**Unverified:**" in (root / "record.md").read_text(encoding="utf-8")
    assert "<strong>Unverified:</strong>" in (root / "report.html").read_text(encoding="utf-8")


def test_a_directory_that_no_longer_verifies_leaves_no_old_pass_behind(tmp_path: Path) -> None:
    root = tmp_path / "washed"
    shutil.copytree(WASHED, root)
    assert run_cli("gate", str(root)).code == 0
    assert json.loads((root / "verdict.json").read_text(encoding="utf-8"))["passed"] is True
    run = sorted((root / "runs").iterdir())[0]
    (run / "run.json").write_text((run / "run.json").read_text() + " ", encoding="utf-8")
    again = run_cli("gate", str(root))
    assert again.code == 3 and "changed since" in again.stderr
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["passed"] is False and "changed since" in verdict["gates"][0]["reason"]
    assert 'failures="1"' in (root / "verdict.junit.xml").read_text(encoding="utf-8")
    # A path that is no campaign gets nothing written into it.
    stranger = tmp_path / "not-a-campaign"
    stranger.mkdir()
    assert run_cli("gate", str(stranger)).code in (2, 3)
    assert list(stranger.iterdir()) == []


def test_a_mistyped_look_event_is_refused_with_exit_3_not_a_traceback(tmp_path: Path) -> None:
    # Look events are not under the seal (they are written as the campaign decides), and the
    # sequential levels are read from them. One edited to a cycles count no harness writes
    # raised ValueError or TypeError out of gate: a traceback and exit 1, "the gate failed" to
    # a CI. Now the journal is named and the exit is 3, with no old PASS left behind.
    root = tmp_path / "washed"
    shutil.copytree(WASHED, root)
    assert run_cli("gate", str(root)).code == 0  # a PASS on disk, before the edit
    journal = root / "journal.jsonl"
    original = journal.read_text(encoding="utf-8")
    for cycles in ("abc", 2.5, None, 0, True):
        events = [json.loads(line) for line in original.splitlines()]
        for event in events:
            if event.get("event") == "look" and event.get("look") == 1:
                event["cycles"] = cycles
        journal.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
        refused = run_cli("gate", str(root))
        assert refused.code == 3, (cycles, refused.stdout + refused.stderr)
        assert "journal.jsonl: a look event's cycles is" in refused.stderr, cycles
        assert "Traceback" not in refused.stderr
        verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
        assert verdict["passed"] is False, cycles


def test_a_moved_and_rewritten_campaign_says_it_was_verified_against_itself_only(
    tmp_path: Path,
) -> None:
    from tests.campaign_dirs import rechain_journal

    # Rewritten with every digest recomputed, and moved where no results store keeps its head:
    # its chain verifies, but only against itself, which anyone who can write it can make.
    root = tmp_path / "moved"
    shutil.copytree(WASHED, root)
    rechain_journal(root / "journal.jsonl", lambda events: events[-1].update(t=events[-1]["t"] + 1))
    done = run_cli("gate", str(root))
    assert done.code == 0, done.stdout + done.stderr
    assert "verified against itself only: no journal head was given back" in done.stdout
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["verified"] is False and verdict["head_checked"] == ""
    assert verdict["checked_against"].startswith("verified against itself only")
    (case,) = ET.parse(root / "verdict.junit.xml").findall(".//testcase[@classname]")[-1:]
    assert case.get("classname") == "campaign.journal_head"
    skipped = case.find("skipped")
    assert skipped is not None and "verified against itself only" in str(skipped.get("message"))
    for page in ("record.md", "report.html"):  # the records a reviewer reads say it too
        assert "verified against itself only" in (root / page).read_text(encoding="utf-8"), page
    # Given back the head it printed, it says which head was checked.
    head = verdict["journal_head"]
    done = run_cli("gate", str(root), "--journal-head", head)
    assert done.code == 0, done.stdout + done.stderr
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["verified"] is True and verdict["head_checked"] == head
    said = f"verified against the journal head you kept ({head[:16]}…, event 84 of 84)"
    assert verdict["checked_against"] == said and said in done.stdout
    (case,) = ET.parse(root / "verdict.junit.xml").findall(".//testcase[@classname]")[-1:]
    assert case.find("skipped") is None and case.findtext("system-out") == said
    assert f"**Journal:** verified against the journal head you kept ({head[:16]}" in (
        root / "record.md"
    ).read_text(encoding="utf-8")
