"""End to end on the local box with the real reference runtime: records, resume, failures."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.boxes.base import Box, shell_command
from harness.boxes.local import LocalBox
from harness.card import load_card
from harness.execute.campaign import new_campaign_dir
from harness.execute.run import CampaignRunner
from harness.formats.records import CampaignDir, Journal
from harness.formats.ring_read import read_ring
from harness.plan.build import build_plan
from harness.profiles.box import BoxSpec
from tests.conftest import DATA, REPO

TINY = DATA / "cards" / "e2e" / "tiny.yaml"
pytestmark = pytest.mark.slow
CONTROL = 'control:\n    env: {REFBOX_LAYERS: "2"'
WIDE = 'wide:\n    env: {REFBOX_LAYERS: "2"'
# The tiny card's two cells run one after the other, each once per cache state.
SEQUENTIAL = {
    "control: control\n": "",
    "order: abba": "order: sequential",
    "{kind: exact_outputs, min_match: all}": "{kind: exact_outputs, vs: control}",
}


def _card_with(tmp_path: Path, name: str, replace: dict[str, str], source: Path = TINY) -> Path:
    """``source`` with each ``replace`` key (which must be there) replaced, its pools made
    absolute, written to ``tmp_path/name``."""
    text = source.read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _run(card: Path, reports: Path) -> tuple[CampaignDir, list[str], list[str]]:
    loaded = load_card(card)
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, reports)
    outcome = CampaignRunner(loaded, plan, campaign).execute()
    return campaign, outcome.done, outcome.failed


def test_two_cell_abba_campaign_records_everything(tmp_path: Path) -> None:
    campaign, done, failed = _run(TINY, tmp_path / "reports")
    assert failed == [] and len(done) == 4
    plan = json.loads((campaign.root / "plan.json").read_text())
    assert [r["cell"] for r in plan["runs"]] == ["control", "wide", "wide", "control"]
    for run in plan["runs"]:
        folder = campaign.run_dir(run["run_id"])
        record = json.loads((folder / "run.json").read_text())
        assert record["status"] == "ok" and record["schema_version"] == 1
        requests = pd.read_parquet(folder / "requests.parquet")
        scored = requests[~requests["warmup"]]
        assert len(scored) == 4 and scored["ok"].all()
        assert (scored["completion_tokens"] == 8).all()
        assert requests["warmup"].sum() == 1
        chunks = pd.read_parquet(folder / "chunks.parquet")
        assert len(chunks) >= len(scored) * 7
        ring = pd.read_parquet(folder / "ring.parquet")
        assert len(ring) > 0 and set(ring["phase"]) >= {0, 1}
        counters = json.loads((folder / "counters.json").read_text())
        assert counters["delta"]["decode_tokens"] > 0
        assert "listening on" in (folder / "server.log").read_text()
        assert record["ring_lost"] == 0
    env = json.loads((campaign.root / "boxes" / "local.json").read_text())
    assert env["harness_version"] and env["runtime"]["profile"] == "refbox"
    events = [e["event"] for e in Journal(campaign.root / "journal.jsonl").events()]
    assert events.count("run_done") == 4 and events[-1] == "campaign_end"


def test_no_process_is_left_behind(tmp_path: Path) -> None:
    campaign, _, _ = _run(TINY, tmp_path / "reports")
    box = LocalBox("local", BoxSpec())
    for line in Journal(campaign.root / "journal.jsonl").events():
        assert line["event"] != "run_failed"
    for folder in campaign.runs_dir.iterdir():
        log = (folder / "server.log").read_text()
        assert "listening on" in log
    # Every runtime was started with setsid: its pgid equals its pid, and none is alive.
    result = box.sh("pgrep -f 'harness.refbox serve' || true", check=False)
    mine = [p for p in result.stdout.split() if str(campaign.root) in _cmdline(int(p))]
    assert mine == []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_runtime_failures_are_recorded_and_the_campaign_goes_on(tmp_path: Path) -> None:
    card = _card_with(
        tmp_path,
        "faults.yaml",
        {
            WIDE: 'wide:\n    env: {REFBOX_FAIL_AFTER_TOKENS: "12", REFBOX_LAYERS: "2"',
            "cycles: 1": "cycles: 2",
        },
    )
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert len(failed) == 4 and len(done) == 4  # every `wide` run crashes mid-stream
    for run_id in failed:
        record = json.loads((campaign.run_dir(run_id) / "run.json").read_text())
        assert record["status"] == "failed"
        assert "requests failed" in record["reason"] or "exited" in record["reason"]


def test_never_ready_and_hang_are_failures_with_reasons(tmp_path: Path) -> None:
    card = _card_with(
        tmp_path,
        "hang.yaml",
        {
            CONTROL: 'control:\n    env: {REFBOX_NEVER_READY: "1", REFBOX_LAYERS: "2"',
            WIDE: 'wide:\n    env: {REFBOX_HANG_AFTER_TOKENS: "3", REFBOX_LAYERS: "2"',
            "request_timeout_s: 20": "request_timeout_s: 3",
            # One run of each: a second would wait out the same timeouts for the same reasons.
            "design: {order: abba,": "design: {order: sequential,",
        },
    )
    profile = tmp_path / "runtimes"
    profile.mkdir()
    text = (REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml").read_text()
    # Long enough for the hanging cell to boot on a loaded box (2 s quiet; 4 s was once short).
    (profile / "refbox.yaml").write_text(text.replace("timeout_s: 60", "timeout_s: 10"))
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert done == [] and len(failed) == 2
    reasons = {
        json.loads((campaign.run_dir(r) / "run.json").read_text())["cell"]: json.loads(
            (campaign.run_dir(r) / "run.json").read_text()
        )["reason"]
        for r in failed
    }
    assert "not ready after 10 s" in reasons["control"]
    # Hung in the canaries, the boot's first requests: one timed out, then nothing more is sent.
    assert reasons["wide"].startswith("runtime hung: request "), reasons["wide"]
    assert "(phase canary) timed out after 3 s" in reasons["wide"]


def _stop_leftovers(reports: Path) -> None:
    """Kill, by PID, any process still naming the campaign. A SIGKILL that lands after a runtime
    started and before its group was journalled leaves one no resume can know of."""
    for proc in Path("/proc").glob("[0-9]*"):
        if str(reports) in _cmdline(int(proc.name)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def test_killed_campaign_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    try:
        _killed_campaign_resumes(tmp_path, reports)
    finally:
        _stop_leftovers(reports)


def _killed_campaign_resumes(tmp_path: Path, reports: Path) -> None:
    card = _card_with(tmp_path, "resume.yaml", {"cycles: 1": "cycles: 2"})
    process = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(card), "--reports", str(reports), "--quiet"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    journal_path = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = list(reports.glob("tiny/*/journal.jsonl"))
        if found and sum('"run_done"' in line for line in found[0].read_text().splitlines()) >= 3:
            journal_path = found[0]
            break
        time.sleep(0.2)
    assert journal_path is not None, "campaign made no progress"
    os.killpg(process.pid, signal.SIGKILL)  # the harness and the runtime it was driving
    process.wait()
    root = journal_path.parent
    done_before = Journal(journal_path).done_runs()
    assert 3 <= len(done_before) < 8
    resumed = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(root), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # Every run completed once: the card's gates (identical outputs, no lost ring record) pass.
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = Journal(journal_path).events()
    done = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert len(done) == len(set(done)) == 8  # every run once, none twice
    for run_id in done_before:
        # Completed runs were kept, not redone.
        assert (
            sum(1 for e in events if e.get("run_id") == run_id and e["event"] == "run_start") == 1
        )
    # The runtime the killed harness was driving was stopped by the resume, not left running.
    for boot in (e for e in events if e["event"] == "boot"):
        with pytest.raises(ProcessLookupError):
            os.killpg(boot["pgid"], 0)


def test_injection_shaped_knob_values_arrive_literally(tmp_path: Path) -> None:
    box = LocalBox("local", BoxSpec())
    hostile = ["x; rm -rf ~", "$(touch /tmp/pwned)", "a'b\"c", "`id`", "line1\nline2", "*"]
    out = tmp_path / "out.json"
    program = (
        "import json,os,sys; json.dump({'argv': sys.argv[1:], "
        "'env': {k: v for k, v in os.environ.items() if k.startswith('KNOB')}}, "
        f"open({str(out)!r}, 'w'))"
    )
    env = {f"KNOB{i}": value for i, value in enumerate(hostile)}
    box.sh(shell_command([sys.executable, "-c", program, *hostile], env))
    got = json.loads(out.read_text())
    assert got["argv"] == hostile
    assert got["env"] == env


def test_ring_of_a_run_reads_back_with_zero_loss(tmp_path: Path) -> None:
    ring_path = tmp_path / "ring.bin"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.refbox",
            "serve",
            "--port",
            "0",
            "--layers",
            "2",
            "--experts",
            "8",
            "--hot-slots",
            "4",
            "--expert-bytes",
            "0",
            "--ring",
            str(ring_path),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = ""
        while "listening on" not in line:
            line = process.stderr.readline()
        url = line.split("listening on ")[1].strip()
        import urllib.request

        body = json.dumps({"prompt": "hello", "max_tokens": 20}).encode()
        request = urllib.request.Request(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).read()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()
    ring = read_ring(ring_path)
    assert ring.lost == 0 and ring.dropped == 0
    assert len(ring.frame) == 20  # one prefill step and 19 decode steps


def _resident_bytes(path: Path) -> int:
    done = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[0])


def test_cold_state_evicts_the_runtime_files_from_the_page_cache(tmp_path: Path) -> None:
    # The refbox writes its slow tier at its first boot: the warm runs come first.
    card = _card_with(
        tmp_path, "cold.yaml", {**SEQUENTIAL, "cache_states: [warm]": "cache_states: [warm, cold]"}
    )
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert failed == [] and len(done) == 4
    records = [json.loads((campaign.run_dir(r) / "run.json").read_text()) for r in done]
    assert [r["cache_state"] for r in records] == ["warm", "warm", "cold", "cold"]
    cache = f"{campaign.root.resolve()}/box/cache/refbox-slow-"
    for record in records:
        evicted = record["runtime"].get("evicted", [])
        if record["cache_state"] == "cold":
            assert evicted and all(p.startswith(cache) for p in evicted), record["runtime"]
        else:
            assert evicted == []
    slow_files = list((campaign.root / "box" / "cache").glob("refbox-slow-*.bin"))
    assert slow_files, "the refbox keeps its slow tier in the box cache folder"
    box = LocalBox("local", BoxSpec())
    path = slow_files[0]
    path.read_bytes()  # bring it into the page cache
    assert _resident_bytes(path) > 0
    assert box.evict_from_page_cache([str(path)])
    assert _resident_bytes(path) == 0


def test_a_cold_run_with_nothing_yet_to_evict_primes_a_boot_first(tmp_path: Path) -> None:
    # Cold first: no boot has written the refbox's slow tier yet. The first run boots its cell
    # once and stops it, then evicts what that boot wrote and runs cold; later runs find it.
    card = _card_with(tmp_path, "cold-first.yaml", {"cache_states: [warm]": "cache_states: [cold]"})
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert failed == [] and len(done) == 4
    cache = f"{campaign.root.resolve()}/box/cache/"
    for run_id in done:
        record = json.loads((campaign.run_dir(run_id) / "run.json").read_text())
        evicted = record["runtime"]["evicted"]
        assert evicted and all(p.startswith(cache) for p in evicted), record["runtime"]
    events = campaign.journal.events()
    (priming,) = [e for e in events if e["event"] == "cache_priming"]
    first = min(done, key=lambda r: next(i for i, e in enumerate(events) if e.get("run_id") == r))
    assert priming["run_id"] == first and priming["run_dir"].endswith(f"{first}/prime")
    boots = [e for e in events if e["event"] == "boot" and e["run_id"] == first]
    stopped = {e["pgid"] for e in events if e["event"] == "boot_stopped"}
    assert len(boots) == 2 and {b["pgid"] for b in boots} <= stopped  # the priming boot, stopped


def test_a_cold_run_whose_cache_files_never_match_fails(tmp_path: Path) -> None:
    # A profile naming files no boot writes: even after priming there is nothing to evict, and
    # the run fails rather than run warm.
    profile = (REPO / "campaigns" / "runtimes" / "refbox.yaml").read_text(encoding="utf-8")
    wrong = profile.replace('cache_files: ["{cache_dir}/refbox-slow-*.bin"]',
                            'cache_files: ["{cache_dir}/no-such-*.bin"]')  # fmt: skip
    assert wrong != profile
    wrong = wrong.replace("name: refbox\n", "name: refbox-wrong\n")
    (tmp_path / "runtimes").mkdir()
    (tmp_path / "runtimes" / "refbox-wrong.yaml").write_text(wrong, encoding="utf-8")
    replace = {
        "cache_states: [warm]": "cache_states: [cold]",
        "runtime: refbox": "runtime: refbox-wrong",
    }
    card = _card_with(tmp_path, "cold-wrong.yaml", replace)
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert done == [] and len(failed) == 4
    pattern = f"{campaign.root.resolve()}/box/cache/no-such-*.bin"
    for run_id in failed:
        record = json.loads((campaign.run_dir(run_id) / "run.json").read_text())
        assert record["reason"].startswith(
            f"cold run could not evict: no file matched {pattern} (the profile's cache_files) "
            "on box local even after a priming boot of the cell"
        ), record["reason"]
        assert "boot_s" not in record["runtime"]  # the run itself never booted


def test_a_declared_ring_that_was_not_collected_fails_the_run(tmp_path: Path) -> None:
    # The profile looks for the ring where the runtime does not write it. The good run fails for
    # it; the run that failed anyway says so as well, so no reader takes the absence for zero.
    profile = (REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml").read_text(
        encoding="utf-8"
    )
    declared = 'ring: {path: "{run_dir}/ring.bin", header: true}'
    assert declared in profile
    profile = profile.replace("name: refbox", "name: misplaced-ring").replace(
        declared, 'ring: {path: "{run_dir}/elsewhere.bin", header: true}'
    )
    (tmp_path / "runtimes").mkdir()
    (tmp_path / "runtimes" / "misplaced-ring.yaml").write_text(profile, encoding="utf-8")
    card = _card_with(
        tmp_path,
        "ringless.yaml",
        {
            **SEQUENTIAL,
            "runtime: refbox": "runtime: misplaced-ring",
            WIDE: 'wide:\n    env: {REFBOX_FAIL_AFTER_TOKENS: "12", REFBOX_LAYERS: "2"',
        },
    )
    campaign, done, failed = _run(card, tmp_path / "reports")
    assert done == [] and len(failed) == 2
    good, crashed = (json.loads((campaign.run_dir(r) / "run.json").read_text()) for r in failed)
    assert good["cell"] == "control" and crashed["cell"] == "wide"
    missing = f"the runtime wrote no ring at {campaign.root.resolve()}/box/"
    assert good["status"] == "failed"
    assert good["reason"].startswith("collecting telemetry failed: " + missing), good["reason"]
    assert crashed["status"] == "failed" and crashed["reason"].startswith("runtime down: ")
    assert "; telemetry not collected: " + missing in crashed["reason"], crashed["reason"]


def test_a_runtime_started_but_never_journalled_is_found_by_its_mark(tmp_path: Path) -> None:
    """A SIGKILL between a runtime's start and its journalled group: the resume finds it by the
    mark the runner puts in every runtime's environment, journalled before the start."""
    loaded = load_card(_card_with(tmp_path, "mark.yaml", {}))
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    run_id = plan.runs[0].run_id
    mark = f"{campaign.root}/box/{run_id}"
    campaign.journal.append("boot_starting", run_id=run_id, box="local", mark=mark)
    # The runtime as start_background leaves it: its own session, the mark in its environment.
    runtime = subprocess.Popen(
        ["sleep", "300"], env={**os.environ, "HARNESS_BOOT_DIR": mark}, start_new_session=True
    )
    other = subprocess.Popen(  # another campaign's runtime: not this one's to stop
        ["sleep", "300"],
        env={**os.environ, "HARNESS_BOOT_DIR": mark + "-x"},
        start_new_session=True,
    )
    try:
        runner = CampaignRunner(loaded, plan, campaign)
        assert runner.box.groups_marked("HARNESS_BOOT_DIR", mark) == [runtime.pid]
        runner._stop_orphans()
        assert runtime.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        killed = [e for e in campaign.journal.events() if e["event"] == "orphan_killed"]
        assert [(e["run_id"], e["pgid"]) for e in killed] == [(run_id, runtime.pid)]
        # Over a shell (the SSH box's way), the same scan finds the same group.
        shell = Box.groups_marked(runner.box, "HARNESS_BOOT_DIR", mark + "-x")
        assert shell == [other.pid]
    finally:
        for process in (runtime, other):
            if process.poll() is None:
                process.kill()
                process.wait()
