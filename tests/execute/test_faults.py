"""Faults fail fast and leave nothing running: a hung runtime, SIGTERM and SIGHUP, on the real
reference runtime and the real ``harness run``."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.card import load_card
from harness.execute.campaign import new_campaign_dir
from harness.execute.run import CampaignRunner
from harness.formats.records import Journal
from harness.plan.build import build_plan
from tests.conftest import DATA, REPO, run_cli

TINY = DATA / "cards" / "e2e" / "tiny.yaml"
pytestmark = pytest.mark.slow
WIDE = 'wide:\n    env: {REFBOX_LAYERS: "2"'
# Runs long enough that a signal sent once the runtime listens lands mid-run.
LONG_RUNS = {
    "max_tokens: 8": "max_tokens: 32",
    "requests: 2}": "requests: 8}",
    "requests: 2, shift: true}": "requests: 8, shift: true}",
}


def _card_with(tmp_path: Path, replace: dict[str, str]) -> Path:
    text = TINY.read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "card.yaml"
    path.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    return path


def _events(root: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    events = Journal(root / "journal.jsonl").events()
    return [e for e in events if run_id is None or e.get("run_id") == run_id]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _assert_gone(events: list[dict[str, Any]], root: Path) -> None:
    """Every runtime group the journal booted is gone, and no process names the campaign."""
    boots = [e for e in events if e["event"] == "boot"]
    assert boots
    for boot in boots:
        # A stopped runtime is a zombie until init reaps it, which here takes a second or two.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(boot["pgid"], 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        with pytest.raises(ProcessLookupError):
            os.killpg(boot["pgid"], 0)
    for proc in Path("/proc").glob("[0-9]*"):
        cmdline = _cmdline(int(proc.name))
        assert str(root) not in cmdline, cmdline


def test_a_runtime_that_dies_in_a_timed_phase_fails_its_run_at_once(tmp_path: Path) -> None:
    # The runtime exits 12 tokens into the first scored request of a 60 s phase. Before, the
    # drive went on sending requests that were refused at once, thousands, until the deadline.
    card = _card_with(
        tmp_path,
        {
            WIDE: 'wide:\n    env: {REFBOX_FAIL_AFTER_TOKENS: "12", REFBOX_LAYERS: "2"',
            "max_tokens: 8": "max_tokens: 32",
            "warmup_requests: 1": "warmup_requests: 0",
            "{name: prose, domains: [en-prose], requests: 2}": (
                "{name: soak, domains: [en-prose], duration_s: 60}"
            ),
            "    - {name: code, domains: [python], requests: 2, shift: true}\n": "",
        },
    )
    loaded = load_card(card)
    full = build_plan(loaded)
    dying = next(r for r in full.runs if r.cell == "wide")
    plan = dataclasses.replace(full, runs=(dying,))
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    outcome = CampaignRunner(loaded, plan, campaign).execute()
    assert outcome.failed == [dying.run_id]
    folder = campaign.run_dir(dying.run_id)
    record = json.loads((folder / "run.json").read_text())
    reason = record["reason"]
    assert reason.startswith("runtime down: request "), reason
    assert "could not connect (ClientConnectorError" in reason
    assert "the runtime exited or stopped listening" in reason
    requests = pd.read_parquet(folder / "requests.parquet")
    # The one the runtime died in, then the one that found it gone: nothing after. Under load
    # the request after the death can take the pool's kept-alive connection before aiohttp has
    # seen it close, and fail as a disconnect: then the next one is refused, and the drive stops.
    assert 2 <= len(requests) <= 3 and not requests["ok"].any(), requests["error"].tolist()
    _assert_gone(_events(campaign.root), campaign.root)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_hung_runtime_fails_its_run_within_one_request_timeout(
    tmp_path: Path, concurrency: int
) -> None:
    # The warmup (32 tokens) and the first scored request (32) complete; the second scored
    # request streams 3 tokens and the runtime hangs for good. With two in flight, the third
    # was sent when the first ended (the reference runtime serves one request at a time), so
    # its timeout would come a whole request later than the hung one's.
    timeout_s = 5
    card = _card_with(
        tmp_path,
        {
            WIDE: 'wide:\n    env: {REFBOX_HANG_AFTER_TOKENS: "67", REFBOX_LAYERS: "2"',
            "max_tokens: 8": "max_tokens: 32",
            "request_timeout_s: 20": (
                f"request_timeout_s: {timeout_s}\n  concurrency: {concurrency}"
            ),
            "requests: 2}": "requests: 4}",
            "requests: 2, shift: true}": "requests: 4, shift: true}",
            # No washout, no canaries: the tokens before the hang are the warm-up's and the
            # scored ones.
            "retries: 0": "retries: 1, washout: 0",
            "control: control\n": "control: control\ncanaries: {prompts: 0}\n",
        },
    )
    loaded = load_card(card)
    full = build_plan(loaded)
    hung = next(r for r in full.runs if r.cell == "wide")
    plan = dataclasses.replace(full, runs=(hung,))
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    outcome = CampaignRunner(loaded, plan, campaign).execute()
    assert outcome.failed == [hung.run_id]

    folder = campaign.run_dir(hung.run_id)
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "failed" and record["attempt"] == 2
    reason = record["reason"]
    assert reason.startswith("runtime hung: request "), reason
    assert f"timed out after {timeout_s} s with no token from any request" in reason
    # Eight scored requests: one completed, one hung, and with two in flight a third waited.
    cancelled = concurrency - 1
    assert f"stopped sending ({cancelled} request" in reason
    assert f"cancelled, {8 - 2 - cancelled} not sent)" in reason
    assert "raise workload.request_timeout_s" in reason
    assert "--hang-after-tokens 67 reached; hanging" in record["log_tail"]

    requests = pd.read_parquet(folder / "requests.parquet")
    scored = requests[~requests["warmup"]]
    assert len(scored) == 2 + cancelled  # nothing was sent once the runtime was judged hung
    assert scored["ok"].sum() == 1
    timed_out = scored[scored["error"].str.startswith("timed out")]
    assert len(timed_out) == 1
    assert (scored["error"].str.startswith("cancelled: the runtime was judged hung")).sum() == (
        cancelled
    )
    # No request started after the hung one timed out.
    hung_row = timed_out.iloc[0]
    assert (scored["t_start_s"] < hung_row["t_start_s"] + timeout_s).all()
    # One request timeout and the stop, not one timeout per remaining request (about 30 s).
    busy_s = record["ended_at"] - record["started_at"] - record["runtime"]["boot_s"]
    assert busy_s < 2 * timeout_s + 10, busy_s

    # The retry booted a fresh runtime, after the hung one was stopped.
    events = _events(campaign.root, hung.run_id)
    kinds = [e["event"] for e in events]
    assert kinds.count("run_start") == 2 and kinds.count("run_failed") == 2
    boots = [e["pgid"] for e in events if e["event"] == "boot"]
    stopped = [e["pgid"] for e in events if e["event"] == "boot_stopped"]
    assert len(set(boots)) == 2 and stopped == boots
    assert kinds.index("boot_stopped") < kinds.index("run_start", 1)
    _assert_gone(events, campaign.root)


def _sighup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextmanager
def _harness_run(
    card: Path, reports: Path, log: Path, *, stdout_pipe: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """``harness run CARD`` as a real process in a session of its own, as CI would start it;
    its output goes to ``log`` (only stderr, with ``stdout_pipe``: stdout is then a pipe).

    Whatever the test found, nothing it started outlives it: the harness's session and every
    runtime group the journal names are killed at the end (a no-op when all is well).
    """
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness", "run", str(card), "--reports", str(reports)],
            cwd=REPO,
            stdout=subprocess.PIPE if stdout_pipe else out,
            stderr=out if stdout_pipe else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # A suite started under nohup hands SIGHUP down ignored, and the harness rightly
            # keeps an ignored signal ignored; the tests send it, so it starts at its default.
            preexec_fn=_sighup_default,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for journal in reports.glob("*/*/journal.jsonl"):
            for event in Journal(journal).events():
                # Only a group still led by this campaign's runtime: a PID may be reused.
                if event["event"] == "boot" and str(reports) in _cmdline(event["pgid"]):
                    with suppress(ProcessLookupError):
                        os.killpg(event["pgid"], signal.SIGKILL)


def _wait_for_boot(reports: Path, process: subprocess.Popen[bytes], ready: bool) -> Path:
    """The campaign folder once a run has booted (and its runtime is listening, if ``ready``)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "the harness exited before a run was in flight"
        for journal in reports.glob("tiny/*/journal.jsonl"):
            boots = [e for e in Journal(journal).events() if e["event"] == "boot"]
            if not boots:
                continue
            log = journal.parent / "box" / boots[0]["run_id"] / "server.log"
            if not ready or (log.is_file() and "listening on" in log.read_text()):
                return journal.parent
        time.sleep(0.05)
    raise AssertionError("no run was in flight after 120 s")


def _stop(process: subprocess.Popen[bytes], *signals: signal.Signals) -> int:
    """Send the signals (the first, then the rest during the shutdown it starts); exit code."""
    for index, signum in enumerate(signals):
        process.send_signal(signum)
        if index + 1 < len(signals):
            time.sleep(0.05)
    return process.wait(timeout=120)


def _interrupted_run(root: Path) -> dict[str, Any]:
    events = _events(root)
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "campaign_interrupted", kinds
    interrupted = [e for e in events if e["event"] == "run_interrupted"]
    assert len(interrupted) == 1, kinds
    run_id = interrupted[0]["run_id"]
    mine = [e["event"] for e in events if e.get("run_id") == run_id]
    assert mine.count("boot") == mine.count("boot_stopped") == 1
    record: dict[str, Any] = json.loads((root / "runs" / run_id / "run.json").read_text())
    assert record["status"] == "interrupted"
    return record


def test_sigterm_stops_the_runtime_journals_the_run_and_resumes(tmp_path: Path) -> None:
    # Long enough runs that the signal, sent once the runtime listens, lands mid-run.
    card = _card_with(tmp_path, LONG_RUNS)
    reports = tmp_path / "reports"
    log = tmp_path / "harness.log"
    with _harness_run(card, reports, log) as process:
        root = _wait_for_boot(reports, process, ready=True)
        code = _stop(process, signal.SIGTERM)
    output = log.read_text()
    assert code == 143, output
    record = _interrupted_run(root)
    assert record["reason"] == f"interrupted (SIGTERM); resume with harness run --resume {root}"
    assert f"interrupted (SIGTERM); resume with: harness run --resume {root}\n" in output
    # The signal cancels the drive's task; raised inside the task's HTTP callbacks instead, it
    # ends up in that task and asyncio prints it at exit.
    assert "Task exception was never retrieved" not in output and "Traceback" not in output
    assert _events(root)[-1]["signal"] == "SIGTERM"
    _assert_gone(_events(root), root)

    resumed = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(root), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = _events(root)
    done = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert sorted(done) == sorted(set(done)) and len(done) == 4
    assert record["run_id"] in done
    _assert_gone(events, root)


def test_sighup_during_boot_and_more_signals_during_shutdown_leave_nothing(
    tmp_path: Path,
) -> None:
    # The runtime takes a minute to load, so the signal lands while the harness waits for it.
    card = _card_with(
        tmp_path,
        {"control:\n    env: {": 'control:\n    env: {REFBOX_BOOT_DELAY_S: "60", '},
    )
    reports = tmp_path / "reports"
    log = tmp_path / "harness.log"
    with _harness_run(card, reports, log) as process:
        root = _wait_for_boot(reports, process, ready=False)
        code = _stop(process, signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    output = log.read_text()
    assert code == 129, output  # the first signal decides
    # Signals that land while the shutdown runs are noted ("SIGTERM again; …"); ones that land
    # after it are ignored. Which it is depends on the machine's speed; neither may change the
    # exit code or cut the records short.
    assert "Traceback" not in output
    record = _interrupted_run(root)
    assert record["reason"].startswith("interrupted (SIGHUP); resume with harness run --resume ")
    assert (root / "runs" / record["run_id"] / "requests.parquet").is_file()
    _assert_gone(_events(root), root)


def test_a_gate_failed_on_complete_data_wins_over_runs_that_failed(tmp_path: Path) -> None:
    # Every `wide` run crashes; the control's runs complete and breach a bound of their own.
    # Exit 3 would tell a pipeline to retry the infrastructure; the breach is a verdict.
    card = _card_with(
        tmp_path,
        {
            WIDE: 'wide:\n    env: {REFBOX_FAIL_AFTER_TOKENS: "4", REFBOX_LAYERS: "2"',
            "  - {kind: counter, counter: lost_ring_records, max: 0}": (
                "  - {kind: counter, counter: cold_lookups, max: 0, cells: [control]}"
            ),
        },
    )
    ran = run_cli("run", str(card), "--quiet", "--reports", str(tmp_path / "reports"))
    assert ran.code == 1, ran.stdout + ran.stderr
    assert "2 runs could not be completed" in ran.stdout
    (root,) = (tmp_path / "reports").glob("tiny/*")
    verdict = json.loads((root / "verdict.json").read_text())
    counter = next(g for g in verdict["gates"] if g["kind"] == "counter")
    assert not counter["passed"] and not counter["incomplete"]
    assert counter["reason"].startswith("out of bounds: ")
    assert run_cli("gate", str(root)).code == 1


def test_sighup_with_the_terminal_gone_still_exits_129_and_keeps_the_run(tmp_path: Path) -> None:
    # A hung-up terminal: the harness's stdout is a pipe whose reader has gone, so every line
    # it prints from here on (the progress bar, "interrupted …; resume with …") fails to write.
    card = _card_with(tmp_path, LONG_RUNS)
    reports = tmp_path / "reports"
    errors = tmp_path / "stderr.log"
    with _harness_run(card, reports, errors, stdout_pipe=True) as process:
        root = _wait_for_boot(reports, process, ready=True)
        assert process.stdout is not None
        process.stdout.close()
        code = _stop(process, signal.SIGHUP)
    output = errors.read_text()
    assert code == 129, output
    assert "Traceback" not in output and "Exception ignored" not in output, output
    record = _interrupted_run(root)
    assert record["reason"].startswith("interrupted (SIGHUP); resume with harness run --resume ")
    _assert_gone(_events(root), root)
