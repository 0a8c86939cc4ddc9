"""The runner's rules for real: checks before a cohort, a watch during runs, and the cohort rule.

Each test breaks one rule on this machine with a real process or a bound it cannot meet, runs
the llama-bench card (one mirrored cycle = one cohort of four runs), and checks that the cohort
is recorded invalid with the reason, that nothing retried it into validity, and that
``harness gate`` fails closed. Slow: each needs the built llama.cpp binaries.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.boxes.local import LocalBox
from harness.card import Cell
from harness.card.resolve import load_runtime_profile
from harness.card.schema import Guards
from harness.execute.guards import (
    cohort_checks,
    competing_processes,
    enough_memory,
    guards_enabled,
    on_ac_power,
    wait_idle,
    wired_bytes,
)
from harness.profiles.box import BoxSpec
from harness.profiles.schema import Idle
from harness.runtimes.boot import boot, boot_spec, http_json
from tests.conftest import REPO, run_cli
from tests.engines.test_command_driver import (  # noqa: F401 - tiny_model is a fixture
    CARD,
    ONE_CYCLE,
    PROFILE,
    SHIPPED_DESIGN,
    card_dir,
    tiny_model,
)
from tests.swap import swapping

PATTERNS = ["(^|/)llama-(server|bench|cli)( |$)", "(^|/)ds4(-server|-bench)?( |$)"]


def _card(guards: str, *, n_gen: int = 8) -> str:
    text = CARD.read_text(encoding="utf-8")
    assert SHIPPED_DESIGN in text
    text = text.replace(SHIPPED_DESIGN, ONE_CYCLE)
    for threads in (1, 2):
        text = text.replace(
            f"threads: {threads}, n_gen: 32, repetitions: 3",
            f"threads: {threads}, n_gen: {n_gen}, repetitions: 1",
        )
    return text + f"guards: {guards}\n"


def _run(tmp_path: Path, model: Path, guards: str, **kwargs: int) -> tuple[Path, str]:
    card = card_dir(tmp_path, model, card=_card(guards, **kwargs))
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=300)
    (root,) = [p for p in reports.glob("*/*") if p.is_dir()]
    return root, result.stdout + result.stderr


def _records(root: Path) -> list[dict[str, object]]:
    return [
        json.loads((run / "run.json").read_text(encoding="utf-8"))
        for run in sorted((root / "runs").iterdir())
    ]


def _invalid_cohort(root: Path) -> dict[str, object]:
    cohorts = json.loads((root / "cohorts.json").read_text(encoding="utf-8"))["cohorts"]
    assert list(cohorts) == ["t2/warm/cycle0"]
    entry = cohorts["t2/warm/cycle0"]
    assert entry["valid"] is False
    return dict(entry)


def _gate_fails_closed(root: Path, reason: str) -> None:
    gate = run_cli("gate", str(root))
    assert gate.code == 3, gate.stdout + gate.stderr
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    (cohorts,) = [g for g in verdict["gates"] if g["kind"] == "cohorts"]
    assert cohorts["passed"] is False and reason in cohorts["reason"]
    assert not verdict["passed"]


def test_defaults_on_for_real_runtimes_off_for_the_reference_one() -> None:
    assert guards_enabled(Guards(), "llama-bench") == (
        True,
        "on by default for runtime llama-bench",
    )
    assert guards_enabled(Guards(), "refbox")[0] is False
    assert guards_enabled(Guards(enabled=True), "refbox")[0] is True


def test_this_box_reads_power_memory_and_wired_memory() -> None:
    box = LocalBox("local", BoxSpec())
    power = on_ac_power(box)
    assert power.passed  # a server (no supply listed) or mains: not on battery
    memory = enough_memory(box, Guards())
    assert memory.passed and "GiB free of" in memory.reason
    assert (wired_bytes(box) or 0) >= 0
    refused = enough_memory(box, Guards(min_free_memory_pct=None, min_free_memory_bytes=1e18))
    assert not refused.passed and "under 9.31323e+08 GiB" in refused.reason


@pytest.mark.slow
def test_a_competing_process_is_found_and_invalidates_the_cohort(
    tiny_model: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    rival = subprocess.Popen(["bash", "-c", "exec -a llama-server sleep 60"])
    try:
        deadline = time.monotonic() + 10
        box = LocalBox("local", BoxSpec())
        check = competing_processes(box, PATTERNS)
        while check.passed and time.monotonic() < deadline:
            time.sleep(0.1)
            check = competing_processes(box, PATTERNS)
        assert not check.passed and f"{rival.pid} llama-server 60" in str(check.value)
        root, output = _run(tmp_path, tiny_model, "{}")
    finally:
        rival.terminate()
        rival.wait(timeout=10)
    assert "runs: 0 done, 4 failed" in output, output
    entry = _invalid_cohort(root)
    assert any(f"{rival.pid} llama-server 60" in str(r) for r in entry["reasons"])  # type: ignore[union-attr]
    for record in _records(root):
        assert str(record["reason"]).startswith("cohort t2/warm/cycle0 invalid, not run: competing")
        assert record["attempt"] == 0  # never run
    _gate_fails_closed(root, "competing process running")
    run_cli("report", str(root), "--no-figures")
    record = (root / "record.md").read_text(encoding="utf-8")
    (line,) = [x for x in record.splitlines() if x.startswith("| t2/warm/cycle0 | 4 |")]
    assert "competing: competing process running:" in line and f"{rival.pid} llama-server" in line


@pytest.mark.slow
def test_a_memory_bound_above_the_machine_refuses_the_cohort(
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    root, output = _run(tmp_path, tiny_model, "{competing: false, min_free_memory_bytes: 1.0e18}")
    assert "runs: 0 done, 4 failed" in output, output
    entry = _invalid_cohort(root)
    assert "free_memory" in str(entry["reasons"])
    _gate_fails_closed(root, "free_memory")


@pytest.mark.slow
def test_a_time_limit_shorter_than_the_run_aborts_it_and_the_cohort_is_not_retried(
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    root, output = _run(tmp_path, tiny_model, "{competing: false, max_run_s: 1.0}", n_gen=4000)
    assert "runs: 0 done, 4 failed" in output, output
    records = _records(root)
    first = records[0]
    assert str(first["reason"]).startswith("guard: run past the time limit of 1 s")
    assert first["attempt"] == 1  # design.retries is 1, but an invalid cohort is not retried
    for record in records[1:]:
        assert "invalid, not run: run past the time limit" in str(record["reason"])
    _gate_fails_closed(root, "time limit")


@pytest.mark.slow
def test_new_swap_out_during_a_run_aborts_it_and_invalidates_the_cohort(
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # A real process pages itself out throughout (tests/swap.py): the run's watch sees pswpout
    # grow past the baseline it took at the start, stops the runtime, and the cohort is void.
    with swapping(tmp_path) as swapper:
        assert swapper > 0
        root, output = _run(tmp_path, tiny_model, "{competing: false}", n_gen=4000)
    assert "runs: 0 done, 4 failed" in output, output
    records = _records(root)
    first = records[0]
    assert str(first["reason"]).startswith("guard: new swap-out during the run:"), first["reason"]
    assert first["attempt"] == 1  # not retried into validity
    for record in records[1:]:
        assert "invalid, not run: new swap-out during the run" in str(record["reason"])
    entry = _invalid_cohort(root)
    assert "swap-out" in str(entry["reasons"])
    _gate_fails_closed(root, "swap-out")


@pytest.mark.slow
def test_wired_memory_over_a_bound_aborts_the_run(
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    box = LocalBox("local", BoxSpec())
    wired = wired_bytes(box)
    if not wired:
        pytest.skip("this kernel reports no locked memory to bound")
    root, _ = _run(
        tmp_path, tiny_model, f"{{competing: false, max_wired_bytes: {wired / 2:.0f}}}", n_gen=4000
    )
    first = _records(root)[0]
    assert str(first["reason"]).startswith("guard: wired memory"), first["reason"]
    _gate_fails_closed(root, "wired memory")


@pytest.mark.slow
def test_a_binary_that_changes_within_a_cohort_invalidates_it(
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # The profile's recorded binary is a file each run appends to: the resolved build changes.
    marker = tmp_path / "build.txt"
    marker.write_text("build 0\n", encoding="utf-8")
    profile = PROFILE.read_text(encoding="utf-8")
    binary = "binary: '${HARNESS_CACHE:-$HOME/.cache/harness}/llama.cpp/bin/llama-bench'"
    assert binary in profile
    profile = profile.replace(binary, f"binary: {marker}")
    command = """'exec "${HARNESS_CACHE:-$HOME/.cache/harness}/llama.cpp/bin/llama-bench" "$@"'"""
    assert command in profile
    # Each run changes the "binary" as it ends, so the next run of the cohort sees another one.
    profile = profile.replace(
        command,
        command[:-1].replace("exec ", "") + f"; s=$?; echo more >> {marker}; exit $s'",
    )
    card = card_dir(tmp_path, tiny_model, card=_card("{competing: false}"), profile=profile)
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=300)
    (root,) = [p for p in reports.glob("*/*") if p.is_dir()]
    records = _records(root)
    assert records[0]["status"] == "ok", result.stdout + result.stderr
    assert "runtime binary changed within the cohort" in str(records[1]["reason"])
    _gate_fails_closed(root, "runtime binary changed")


def test_cohort_checks_name_each_rule_kept_on() -> None:
    box = LocalBox("local", BoxSpec())
    names = [c.guard for c in cohort_checks(box, Guards(), PATTERNS)]
    assert names == ["ac_power", "competing", "free_memory"]
    off = Guards(ac_power=False, competing=False, min_free_memory_pct=None)
    assert cohort_checks(box, off, PATTERNS) == []


@pytest.mark.slow
def test_a_busy_runtime_is_not_idle_and_an_idle_one_is(
    tiny_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / "llama-cpp.yaml")
    assert profile.idle is not None and profile.telemetry.metrics_http == "/metrics"
    box = LocalBox("local", BoxSpec())
    cell = Cell(knobs={"threads": 1, "model": str(tiny_model)})
    spec = boot_spec(
        profile, cell, port=box.free_port(), run_dir=str(tmp_path), python="python3",
        bind_host="127.0.0.1", cache_dir=str(tmp_path), uploaded={},
    )  # fmt: skip
    runtime = boot(box, profile, spec)
    done = threading.Event()
    workers: list[threading.Thread] = []
    try:
        idle = wait_idle(runtime.base_url, "/metrics", profile.idle)
        assert idle.passed and "llamacpp:requests_processing=0" in idle.reason
        body = {"prompt": "Once", "max_tokens": 3000, "temperature": 0, "ignore_eos": True}
        url = runtime.base_url + "/v1/completions"

        def generate() -> None:
            # Request after request until the check is over (a quiet machine finishes one of
            # 3000 tokens within the check's window); two of these keep one always running.
            with contextlib.suppress(OSError):
                while not done.is_set():
                    http_json(url, body, timeout_s=120)

        workers += [threading.Thread(target=generate) for _ in range(2)]
        for worker in workers:
            worker.start()
        time.sleep(1.0)
        busy = wait_idle(
            runtime.base_url, "/metrics", Idle(metrics=profile.idle.metrics, for_s=1, timeout_s=2)
        )
        assert not busy.passed and "llamacpp:requests_processing=1" in busy.reason, busy.reason
        absent = wait_idle(
            runtime.base_url, "/metrics", Idle(metrics=["vllm:num_requests_running"])
        )
        assert not absent.passed and "serves no vllm:num_requests_running" in absent.reason
    finally:
        # The generators finish the request they are in before the runtime stops: stopped
        # under a request, llama-server stays up until the stop's 30 s grace runs out.
        done.set()
        for worker in workers:
            worker.join(timeout=120)
        assert runtime.stop()
