"""Fleets: a campaign's cohorts over several boxes at once, with the reference runtime.

The plan's dealing and the interaction test are checked directly; the rest runs the real
harness: two local boxes in parallel beside a third that fails its preflight, SIGTERM and
SIGKILL in the middle of a fleet and the resume after them, and two SSH boxes over the
loopback sshd, SIGKILLed mid-fleet too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from harness.analyze.fleet import interaction_p, welch_anova_p
from harness.boxes.local import LocalBox
from harness.card import load_card
from harness.errors import CardError
from harness.execute.fleet import deal_shares
from harness.formats.records import Journal
from harness.plan.build import build_plan
from harness.profiles.box import BoxSpec
from tests.conftest import DATA, CliResult, run_cli, start_campaign
from tests.sshd import LoopbackSshd, sshd  # noqa: F401 - the session fixture

TINY = DATA / "cards" / "e2e" / "tiny.yaml"
TWO_LOCAL = "boxes: [{name: a}, {name: b}]"


def _card(tmp_path: Path, boxes: str = TWO_LOCAL, cycles: int = 2, name: str = "fleet") -> Path:
    text = TINY.read_text(encoding="utf-8")
    text = text.replace("box: local", boxes).replace("cycles: 1", f"cycles: {cycles}")
    text = text.replace("campaign: tiny", f"campaign: {name}")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _harness(*args: str) -> CliResult:
    return run_cli(*args, timeout_s=600)


def _records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/run.json"))]


def _alive(pgid: int) -> bool:
    """A live (non-zombie) process in the group: a stopped runtime's zombie waits for init."""
    return LocalBox("local", BoxSpec()).group_alive(pgid)


def _stop_groups(root: Path) -> None:
    """Kill, by process group, every runtime the journal says was booted (test cleanup)."""
    for event in Journal(root / "journal.jsonl").events():
        if event["event"] == "boot":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(event["pgid"]), signal.SIGKILL)


# ---- the plan and the statistics --------------------------------------------------------------


def test_cohorts_are_dealt_so_each_box_runs_both_orders_and_both_arms(tmp_path: Path) -> None:
    plan = build_plan(load_card(_card(tmp_path, cycles=4)))
    by_cycle = {r.cycle: r.box for r in plan.runs}
    assert by_cycle == {0: "a", 1: "b", 2: "b", 3: "a"}  # consecutive cycles on both boxes
    for box in ("a", "b"):
        mine = [r for r in plan.runs if r.box == box]
        assert Counter(r.pattern for r in mine) == {"ABBA": 4, "BAAB": 4}
        assert Counter(r.cell for r in mine) == {"control": 4, "wide": 4}
    # A cohort never straddles boxes.
    cohorts: dict[tuple[str, str, int], set[str]] = {}
    for r in plan.runs:
        cohorts.setdefault((r.comparison, r.cache_state, r.cycle), set()).add(r.box)
    assert all(len(boxes) == 1 for boxes in cohorts.values())
    # Three boxes, six cycles: round robin, and each box again gets one cycle of each order.
    three = build_plan(
        load_card(_card(tmp_path, "boxes: [{name: a}, {name: b}, {name: c}]", 6, "three"))
    )
    for box in ("a", "b", "c"):
        assert Counter(r.pattern for r in three.runs if r.box == box) == {"ABBA": 4, "BAAB": 4}
    # The estimate counts the busiest box, not the sum.
    single = build_plan(load_card(_card(tmp_path, "box: local", 4, "single")))
    assert plan.estimated_total_s() == pytest.approx(single.estimated_total_s() / 2)


def test_a_dropped_box_hands_its_cohorts_to_the_others(tmp_path: Path) -> None:
    plan = build_plan(load_card(_card(tmp_path, "boxes: [{name: a}, {name: b}, {name: c}]", 6)))
    shares = deal_shares(plan, ["a", "c"])
    assert sorted(shares["a"] + shares["c"]) == sorted(r.run_id for r in plan.runs)
    assert shares["a"] and shares["c"]
    for ids in shares.values():
        # Whole cohorts only, in plan order.
        cycles = {r.cycle for r in plan.runs if r.run_id in ids}
        assert sorted(ids) == sorted(r.run_id for r in plan.runs if r.cycle in cycles)
    # A cohort that already ran (in part) on a box stays there.
    first = [r for r in plan.runs if r.cycle == 1]
    assert first[0].box == "b"
    kept = deal_shares(plan, ["a", "c"], {first[0].run_id: "c"})
    assert {r.run_id for r in first} <= set(kept["c"])


def test_card_errors_name_the_boxes_field(tmp_path: Path) -> None:
    both = _card(tmp_path, "box: local\nboxes: [{name: a}, {name: b}]", name="both")
    with pytest.raises(CardError) as exc:
        load_card(both)
    assert any("`box` or `boxes`, not both" in line for line in exc.value.lines())
    twice = _card(tmp_path, "boxes: [{name: a}, {name: a}]", name="twice")
    with pytest.raises(CardError) as exc:
        load_card(twice)
    assert any("boxes.1:" in line and "listed twice" in line for line in exc.value.lines())
    unknown = _card(tmp_path, "boxes: [{name: a}, gh200-z]", name="unknown")
    result = _harness("validate", str(unknown))
    assert result.code == 2, result.stdout + result.stderr
    assert "unknown box 'gh200-z'" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_the_interaction_test_finds_a_box_that_disagrees() -> None:
    same = {"a": [0.10, 0.12, 0.09, 0.11], "b": [0.11, 0.10, 0.12, 0.10]}
    differs = {"a": [0.10, 0.12, 0.09, 0.11], "b": [-0.01, 0.01, 0.0, 0.02]}
    p_same, p_differs = interaction_p(same), interaction_p(differs)
    assert p_same is not None and p_same > 0.3
    assert p_differs is not None and p_differs < 0.001
    three = {"a": [0.1, 0.11, 0.1], "b": [0.1, 0.12, 0.11], "c": [0.3, 0.31, 0.3]}
    p_three = interaction_p(three)
    assert p_three is not None and p_three < 0.05
    # One cycle a box has no spread to test against; a box with one is left out.
    assert interaction_p({"a": [0.1, 0.2, 0.15], "b": [0.1]}) is None
    assert interaction_p({"a": [0.1, 0.11], "b": [0.3, 0.31], "c": [0.2]}) is not None
    # Deterministic metrics: no spread within a box; boxes agree or they do not.
    assert interaction_p({"a": [0.2] * 3, "b": [0.2] * 3}) == 1.0
    assert interaction_p({"a": [0.2] * 3, "b": [0.3] * 3}) == 0.0


@pytest.mark.parametrize(("boxes", "cycles"), [("ab", 3), ("ab", 2), ("abcd", 2)])
def test_the_interaction_test_holds_its_size_at_the_default_designs_sizes(
    boxes: str, cycles: int
) -> None:
    # The same effect on every box, normal noise: at 3 cycles a box Welch's test rejects near α;
    # at 2 a box (8 cycles dealt to 4 boxes) it rejected 7.6-10.3% and the test did not run at
    # all; the pooled-variance F test it runs there now holds α.
    rng = np.random.default_rng(45)
    draws = 4000
    rejected = 0
    for _ in range(draws):
        p = interaction_p({box: list(rng.normal(0.0, 1.0, cycles)) for box in boxes})
        assert p is not None
        rejected += p < 0.05
    assert rejected / draws <= 0.06


# ---- end to end ----------------------------------------------------------------------------


@pytest.mark.slow
def test_two_local_boxes_run_in_parallel_a_third_is_dropped_and_each_reports(
    tmp_path: Path,
) -> None:
    # Three boxes, the third failing its preflight: its cohort is dealt to the other two.
    boxes = "boxes: [{name: a}, {name: b}, {name: broken, python: /nonexistent/bin/python3}]"
    reports = tmp_path / "reports"
    card = _card(tmp_path, boxes, cycles=4)
    result = _harness("run", str(card), "--reports", str(reports), "--quiet")
    root = next(reports.glob("fleet/*"))
    try:
        assert result.code == 0, result.stdout + result.stderr
        assert "box broken dropped:" in result.stdout
        events = Journal(root / "journal.jsonl").events()
        dropped = [e for e in events if e["event"] == "box_dropped"]
        assert [e["box"] for e in dropped] == ["broken"] and "python" in dropped[0]["reason"]
        records = _records(root)
        assert len(records) == 16 and all(r["status"] == "ok" for r in records)
        assert Counter(r["box"] for r in records) == {"a": 8, "b": 8}
        # The boxes worked at the same time: some run on a overlaps some run on b.
        spans = {
            b: [(r["started_at"], r["ended_at"]) for r in records if r["box"] == b] for b in "ab"
        }
        assert any(s < e2 and s2 < e for s, e in spans["a"] for s2, e2 in spans["b"])
        assert {p.name for p in (root / "boxes").glob("*.json")} == {"a.json", "b.json"}
        fleet = next(e for e in events if e["event"] == "fleet")
        assert fleet["runs"] == {"a": 8, "b": 8}
        done = [e["run_id"] for e in events if e["event"] == "run_done"]
        assert len(done) == len(set(done)) == 16
        summary = json.loads(_harness("analyze", str(root), "--json").stdout)
        rows = summary["fleet"]["boxes"]
        decode = [r for r in rows if r["metric"] == "decode_tok_s"]
        assert {r["box"] for r in decode} == {"a", "b"}
        assert all(r["n_cycles"] == 2 for r in decode)
        interactions = [r for r in summary["fleet"]["interactions"] if r["metric"] == "hit_rate"]
        # Two cycles a box: the interaction test runs, on the boxes' pooled noise (Welch's
        # needs three a box).
        assert interactions and interactions[0]["p_interaction"] is not None, interactions
        assert interactions[0]["note"] == ""
        html = (root / "report.html").read_text(encoding="utf-8")
        assert 'id="per-box"' in html and "interaction p" in html
        # `harness box check --card` checks every box of the fleet and says what a run does.
        check = _harness("box", "check", "--card", str(card))
        assert check.code == 3, check.stdout + check.stderr
        assert "box a: 9 of 9 checks passed" in check.stdout
        assert "1 of 3 boxes failed: a fleet drops them" in check.stdout
    finally:
        _stop_groups(root)


def _wait_until(reports: Path, ready: Any, timeout_s: float = 180) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for journal in reports.glob("*/*/journal.jsonl"):
            if ready(Journal(journal).events()):
                return journal.parent
        time.sleep(0.1)
    raise AssertionError("the fleet made no progress")


def _booted_after_a_run(boxes: set[str]) -> Any:
    def ready(events: list[dict[str, Any]]) -> bool:
        done = sum(e["event"] == "run_done" for e in events)
        stopped = {(e.get("run_id"), e.get("pgid")) for e in events if e["event"] == "boot_stopped"}
        live = {
            e["box"]
            for e in events
            if e["event"] == "boot" and (e["run_id"], e["pgid"]) not in stopped
        }
        return done >= 2 and live == boxes

    return ready


_both_booted_after_a_run = _booted_after_a_run({"a", "b"})


def _sigkill_and_resume(card: Path, reports: Path, boxes: set[str]) -> Path:
    """SIGKILL the harness while a runtime runs on every box, resume, and check that the
    orphans were stopped and no run was lost or made twice; the campaign folder."""
    process = start_campaign(card, reports)
    root = _wait_until(reports, _booted_after_a_run(boxes))
    os.kill(process.pid, signal.SIGKILL)  # the harness only: its runtimes live on
    process.wait()
    events = Journal(root / "journal.jsonl").events()
    done_before = {e["run_id"] for e in events if e["event"] == "run_done"}
    stopped = {(e.get("run_id"), e.get("pgid")) for e in events if e["event"] == "boot_stopped"}
    left = [e for e in events if e["event"] == "boot" and (e["run_id"], e["pgid"]) not in stopped]
    orphans = {e["box"]: int(e["pgid"]) for e in left if _alive(int(e["pgid"]))}
    assert set(orphans) == boxes, left  # one runtime left running on each box
    resumed = _harness("run", "--resume", str(root), "--quiet")
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    events = Journal(root / "journal.jsonl").events()
    killed = {e["pgid"] for e in events if e["event"] == "orphan_killed"}
    assert set(orphans.values()) <= killed
    assert not any(_alive(pgid) for pgid in orphans.values())
    done = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert len(done) == len(set(done)) == 8
    for run_id in done_before:  # completed runs were kept, not redone
        assert sum(e.get("run_id") == run_id and e["event"] == "run_start" for e in events) == 1
    return root


@pytest.mark.slow
def test_sigkill_mid_fleet_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    try:
        _sigkill_and_resume(_card(tmp_path, cycles=2), reports, {"a", "b"})
    finally:
        for root in reports.glob("*/*"):
            _stop_groups(root)


@pytest.mark.slow
def test_sigterm_mid_fleet_stops_every_box_and_resume_completes(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    process = start_campaign(_card(tmp_path, cycles=2), reports)
    root = _wait_until(reports, _both_booted_after_a_run)
    try:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 143
        events = Journal(root / "journal.jsonl").events()
        assert events[-1]["event"] == "campaign_interrupted"
        for boot in (e for e in events if e["event"] == "boot"):
            assert not _alive(int(boot["pgid"])), boot  # nothing left on either box
        interrupted = {r["box"] for r in _records(root) if r["status"] == "interrupted"}
        assert interrupted == {"a", "b"}  # each box recorded the run it was in
        resumed = _harness("run", "--resume", str(root), "--quiet")
        assert resumed.code == 0, resumed.stdout + resumed.stderr
        assert all(r["status"] == "ok" for r in _records(root)) and len(_records(root)) == 8
    finally:
        _stop_groups(root)


@pytest.mark.slow
def test_two_ssh_boxes_over_the_loopback_sshd(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    def box(name: str) -> str:
        return (
            f"{{name: {name}, kind: ssh, host: 127.0.0.1, port: {sshd.port}, user: '{sshd.user}', "
            f"key: '{sshd.client_key}', python: '{sys.executable}', "
            f"workdir: '{tmp_path / 'box-workdir'}', known_hosts: '{sshd.known_hosts}'}}"
        )

    # Killed outright mid-fleet, as the local fleet is: the resume reaches each box over SSH
    # to stop the runtime the killed harness left there.
    card = _card(tmp_path, f"boxes: [{box('x')}, {box('y')}]", cycles=2)
    reports = tmp_path / "reports"
    try:
        root = _sigkill_and_resume(card, reports, {"x", "y"})
        records = _records(root)
        assert Counter(r["box"] for r in records) == {"x": 4, "y": 4}
        assert all(r["status"] == "ok" for r in records)
        # The two boxes share a disk here: each kept its own folder.
        workdir = tmp_path / "box-workdir" / "fleet" / root.name
        assert (workdir / "y").is_dir()
        summary = json.loads(_harness("analyze", str(root), "--json").stdout)
        assert {r["box"] for r in summary["fleet"]["boxes"]} == {"x", "y"}
        assert 'id="per-box"' in (root / "report.html").read_text(encoding="utf-8")
        for name in ("x", "y"):  # each box's capture, with its tunnel's round trip
            capture = json.loads((root / "boxes" / f"{name}.json").read_text())
            assert capture["drive"] == "tunnel" and capture["tunnel_rtt"]
    finally:
        for root in reports.glob("*/*"):
            _stop_groups(root)


def test_box_interaction_holds_its_size_with_unequal_spreads() -> None:
    # Three boxes, no interaction, the smallest box the noisiest: the equal-variance F test
    # rejects in about 12% of draws; Welch's ANOVA stays near 5% (issue 26).
    rng = np.random.default_rng(26)
    draws = 2000
    rejected = 0
    for _ in range(draws):
        effects = {
            box: list(rng.normal(0.0, sd, n))
            for box, n, sd in (("a", 6, 1.0), ("b", 6, 1.0), ("c", 4, 2.5))
        }
        p = interaction_p(effects)
        assert p is not None
        rejected += p < 0.05
    assert rejected / draws <= 0.065


def test_welch_anova_of_two_boxes_is_welchs_t_test() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 7), rng.normal(0.5, 2, 5)
    t = stats.ttest_ind(a, b, equal_var=False)
    assert welch_anova_p([a, b]) == pytest.approx(float(t.pvalue), rel=1e-9)
