"""Campaign directories a release gate can trust (issue 30), through the CLI.

One small campaign is run once per session by ``harness run`` on the reference runtime
(:func:`tests.campaign_dirs.run_tiny`); each test changes a copy of it the way a bad copy, a
broken disk or a hand edit would, and checks what ``gate``/``analyze``/``report`` make of it:
a sealed directory that no longer holds what its journal vouches for is exit 3, "campaign
directory does not verify", naming the file; never a pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.errors import EXIT_BAD_INPUT, EXIT_INFRASTRUCTURE, EXIT_OK
from harness.formats.records import Journal, write_parquet
from tests.campaign_dirs import copy_campaign, rechain_journal
from tests.conftest import DATA, REPO, run_cli, start_campaign

DEMO = DATA / "campaigns" / "demo-shaped"
NOT_VERIFIED = "campaign directory does not verify: "


@pytest.fixture
def finished(finished_campaign: Path) -> Path:
    """A finished, sealed campaign (read-only for tests: copy it before changing anything)."""
    return finished_campaign


def cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The CLI in this process (argument parsing and exit codes as for a user)."""
    capsys.readouterr()
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue(), capsys.readouterr().err


def _runs(root: Path) -> list[Path]:
    return sorted((root / "runs").iterdir())


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _plan_drop_run(root: Path) -> str:
    _edit_json(root / "plan.json", lambda p: p["runs"].pop(1))
    return "plan.json"


def _plan_unknown_cell(root: Path) -> str:
    _edit_json(root / "plan.json", lambda p: p["runs"][0].update(cell="nosuchcell"))
    return "plan.json"


def _plan_cycles(root: Path) -> str:
    _edit_json(root / "plan.json", lambda p: p.update(cycles=99))
    return "plan.json"


def _plan_slot(root: Path) -> str:
    _edit_json(root / "plan.json", lambda p: p["runs"][0].update(slot=7))
    return "plan.json"


def _swap_identities(root: Path) -> str:
    a, b = (run / "run.json" for run in _runs(root)[:2])
    text_a, text_b = a.read_text(), b.read_text()
    a.write_text(text_b)
    b.write_text(text_a)
    return "run.json"


def _symlink_record(root: Path) -> str:
    a, b = (run / "run.json" for run in _runs(root)[:2])
    a.unlink()
    a.symlink_to(b)
    return f"{a.parent.name}/run.json: is a symlink"


def _drop_prompt_rows(root: Path) -> str:
    path = _runs(root)[0] / "requests.parquet"
    frame = pd.read_parquet(path)
    scored = frame[~frame["warmup"]]
    write_parquet(frame[frame["prompt_id"] != scored["prompt_id"].iloc[0]], path)
    return "requests.parquet"


def _duplicate_prompt_rows(root: Path) -> str:
    path = _runs(root)[0] / "requests.parquet"
    frame = pd.read_parquet(path)
    write_parquet(pd.concat([frame, frame], ignore_index=True), path)
    return "requests.parquet"


def _infinite_counter(root: Path) -> str:
    path = _runs(root)[1] / "counters.json"
    text = path.read_text()
    data = json.loads(text)
    data["delta"]["new_swapout_pages"] = math.inf
    path.write_text(json.dumps(data))  # json writes Infinity, as the file held
    return "counters.json"


def _extra_run(root: Path) -> str:
    shutil.copytree(_runs(root)[0], root / "runs" / "0009-control-c9-warm-s0-r0")
    return "0009-control-c9-warm-s0-r0: a run folder plan.json does not name"


def _missing_run(root: Path) -> str:
    shutil.rmtree(_runs(root)[2])
    return "missing, but the journal holds the run as done"


def _card_edited(root: Path) -> str:
    path = root / "card.yaml"
    path.write_text(path.read_text().replace("max: 0", "max: 1000"))
    return "card.yaml: changed since it was written"


def _journal_gone(root: Path) -> str:
    (root / "journal.jsonl").unlink()
    return "journal.jsonl: missing"


EDITS: dict[str, Callable[[Path], str]] = {
    "a run dropped from plan.json": _plan_drop_run,
    "a run's cell renamed to one that does not exist": _plan_unknown_cell,
    "cycles raised to 99": _plan_cycles,
    "a run's slot set to 7": _plan_slot,
    "two runs' run.json swapped": _swap_identities,
    "a run.json replaced by a symlink to another's": _symlink_record,
    "a scored prompt's rows deleted": _drop_prompt_rows,
    "every request row duplicated": _duplicate_prompt_rows,
    "counters.json with Infinity under a max: 0 gate": _infinite_counter,
    "a run folder the plan does not name": _extra_run,
    "a done run's folder deleted": _missing_run,
    "the card's bound loosened": _card_edited,
    "the journal deleted": _journal_gone,
}


def test_the_untouched_campaign_verifies_and_passes(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path)
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_OK, out + err
    assert "not sealed" not in err
    events = [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["event"] == "campaign_start")
    assert start["seal"] == 2 and {"card.yaml", "plan.json"} <= set(start["files"])
    done = [e for e in events if e["event"] == "run_done"]
    assert len(done) == 4 and all("run.json" in e["files"] for e in done)


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_gate_never_passes_a_directory_that_does_not_verify(
    edit: str, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path)
    named = EDITS[edit](root)
    for verb in ("gate", "analyze", "report"):
        code, out, err = cli(verb, str(root), capsys=capsys)
        assert code == EXIT_INFRASTRUCTURE, (verb, out, err)
        assert NOT_VERIFIED in err and named in err, (verb, err)
        assert "Traceback" not in err


def test_the_gate_exits_3_as_a_process(finished: Path, tmp_path: Path) -> None:
    root = copy_campaign(finished, tmp_path)
    _swap_identities(root)
    done = run_cli("gate", str(root), "--quiet")
    assert done.code == EXIT_INFRASTRUCTURE, done.stderr
    assert done.stderr.startswith(NOT_VERIFIED) and "run.json" in done.stderr
    assert not (root / "verdict.json").exists() or "PASS" not in done.stdout


def test_an_unsealed_older_directory_is_read_and_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "demo-shaped"
    shutil.copytree(DEMO, root)
    code, out, err = cli("analyze", str(root), "--json", capsys=capsys)
    assert code == EXIT_OK, err
    assert "is not sealed" in err and json.loads(out)
    # Identity still holds it: a run.json in another run's folder is a failed verification.
    runs = _runs(root)
    shutil.copyfile(runs[0] / "run.json", runs[1] / "run.json")
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and NOT_VERIFIED in err and "disagrees with plan.json" in err


def test_values_are_checked_where_read_in_an_unsealed_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "demo-shaped"
    shutil.copytree(DEMO, root)
    run = _runs(root)[0]
    _edit_json(run / "counters.json", lambda c: c["delta"].update(new_swapout_pages=math.inf))
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_BAD_INPUT and "counters.json: delta.new_swapout_pages" in err, err
    shutil.copyfile(DEMO / "runs" / run.name / "counters.json", run / "counters.json")
    requests = pd.read_parquet(run / "requests.parquet")
    write_parquet(pd.concat([requests, requests.iloc[:1]]), run / "requests.parquet")
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_BAD_INPUT and "requests.parquet: rows: request 0 appears more" in err, err
    write_parquet(requests.assign(ttft_s=-requests["ttft_s"]), run / "requests.parquet")
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_BAD_INPUT and "requests.parquet: ttft_s: must be finite and not" in err
    write_parquet(requests, run / "requests.parquet")
    chunks = pd.read_parquet(run / "chunks.parquet")
    reversed_times = chunks.assign(t_s=chunks["t_s"].to_numpy()[::-1])
    write_parquet(reversed_times, run / "chunks.parquet")
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_BAD_INPUT and "a negative inter-token latency" in err, err


def test_a_card_bound_of_nan_or_infinity_is_a_card_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.campaign_dirs import tiny_card

    for bound in (".nan", ".inf", "-.inf"):
        gates = f"gates:\n  - {{kind: counter, counter: new_swapout_pages, max: {bound}}}\n"
        card = tiny_card(tmp_path / bound.strip(".-"), gates=gates)
        code, _, err = cli("validate", str(card), capsys=capsys)
        assert code == EXIT_BAD_INPUT and "gates.0.counter: Input should be a finite number" in err


def test_an_imported_vllm_file_with_a_negative_itl_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.importers.test_import import _export_demo, _mapping

    files = _export_demo(tmp_path / "files", detailed=True)
    data = json.loads(files[0].read_text())
    data["itls"][0][1] = -0.004
    files[0].write_text(json.dumps(data))
    code, _, err = cli(
        "import", "vllm", *map(str, files), "--map", str(_mapping(tmp_path / "map.yaml")),
        "-o", str(tmp_path / "out"), capsys=capsys,
    )  # fmt: skip
    assert code == EXIT_BAD_INPUT and "itls[0][1]: must not be negative" in err, err


def test_an_import_is_sealed_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.importers.test_import import _export_demo, _mapping

    files = _export_demo(tmp_path / "files", detailed=True)
    out = tmp_path / "imported"
    argv = ["import", "vllm", *map(str, files), "--map", str(_mapping(tmp_path / "map.yaml"))]
    code, _, err = cli(*argv, "-o", str(out), capsys=capsys)
    assert code == EXIT_OK, err
    code, _, err = cli("analyze", str(out), "--json", capsys=capsys)
    assert code == EXIT_OK and "not sealed" not in err, err
    (out / "sources" / files[0].name).write_text("{}")
    code, _, err = cli("gate", str(out), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and f"sources/{files[0].name}: changed" in err, err


# ---- one harness per campaign directory ---------------------------------------------------------

_HOLD = """
import sys, time
from pathlib import Path
from harness.formats.lock import campaign_lock
with campaign_lock(Path(sys.argv[1]), "harness run --resume (held by the test)"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_harness_is_refused_naming_the_holder_and_a_killed_one_frees_it(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path)
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            journal = (root / "journal.jsonl").read_bytes()
            for argv in (
                ["run", "--resume", str(root)],
                ["gate", str(root)],
                ["analyze", str(root)],
            ):
                code, _, err = cli(*argv, capsys=capsys)
                assert code == EXIT_INFRASTRUCTURE, (argv, err)
                assert "another harness is using this campaign directory" in err
                assert f"pid {holder.pid} on {socket.gethostname()}" in err
                assert "`harness run --resume (held by the test)`" in err and " UTC" in err
            assert (root / "journal.jsonl").read_bytes() == journal  # the refusal wrote nothing
        finally:
            holder.kill()  # SIGKILL: no cleanup runs in the holder
            holder.wait()
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_OK, err


def test_import_refuses_a_folder_that_is_not_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.importers.test_import import _export_demo, _mapping

    files = _export_demo(tmp_path / "files", detailed=True)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "card.yaml").write_text("my own card\n")
    (out / "journal.jsonl").write_text("my own notes\n")
    argv = ["import", "vllm", *map(str, files), "--map", str(_mapping(tmp_path / "map.yaml"))]
    code, _, err = cli(*argv, "-o", str(out), capsys=capsys)
    assert code == EXIT_BAD_INPUT and f"{out}: not empty" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["card.yaml", "journal.jsonl"]
    assert (out / "card.yaml").read_text() == "my own card\n"


# ---- a refused command changes nothing -----------------------------------------------------------


def _sequential_campaign(base: Path) -> Path:
    """A sequential campaign (max_cycles 5) as `harness run` starts it, before its first run."""
    from harness.card import load_card
    from harness.execute.campaign import new_campaign_dir
    from harness.plan.build import build_plan
    from tests.campaign_dirs import tiny_card

    card = tiny_card(base / "cards")
    text = card.read_text().replace(
        "design: {order: abba, cycles: 1,",
        "design: {order: abba, sequential: true, max_cycles: 5, cycles: 1,",
    )
    card.write_text(text)
    loaded = load_card(card)
    return new_campaign_dir(loaded, build_plan(loaded), base / "reports").root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.parametrize(
    ("cycles", "said"),
    [
        ("18", "Start a new campaign with max_cycles >= 18 (nothing was changed here)"),
        ("100000000", "--cycles 100000000: a campaign has 1 to 1000 mirrored cycles"),
    ],
)
def test_a_refused_extension_changes_nothing(
    cycles: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _sequential_campaign(tmp_path)
    before = _snapshot(root)
    code, out, err = cli("run", "--resume", str(root), "--cycles", cycles, capsys=capsys)
    assert code == EXIT_BAD_INPUT and said in err, out + err
    assert "extended" not in out
    assert _snapshot(root) == before


@pytest.mark.parametrize(
    ("gate", "said"),
    [
        ("{kind: quality, min_pass: 0}", "without `vs` the gate could never fail"),
        ("{kind: quality, min_pass: 0/2}", "without `vs` the gate could never fail"),
        ("{kind: exact_outputs, min_match: 0}", "k is 0, so the gate could never fail"),
    ],
)
def test_a_gate_that_cannot_fail_is_refused_at_validate(
    gate: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.campaign_dirs import tiny_card

    card = tiny_card(tmp_path, gates=f"gates:\n  - {gate}\n")
    code, _, err = cli("validate", str(card), capsys=capsys)
    assert code == EXIT_BAD_INPUT and said in err, err


def test_every_passing_reason_states_its_counts(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path)
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_OK, err
    gates = json.loads((root / "verdict.json").read_text())["gates"]
    reasons = {g["kind"]: g["reason"] for g in gates}
    assert re.search(r"adaptive: \d+/\d+", reasons["exact_outputs"]), reasons
    assert re.fullmatch(r"4 runs within bounds \(max 0; highest seen 0\)", reasons["counter"])


# ---- output faults: exit 3 with the path and the errno's meaning, nothing lost ------------------


@contextlib.contextmanager
def _mounted(target: Path, *options: str) -> Iterator[Path]:
    """``mount`` at ``target`` (a tmpfs, a read-only bind), unmounted after; skipped where this
    machine does not let the test mount (not root, no mount namespace)."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *options, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({done.stderr.strip() or done.returncode})")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _fault(err: str, path: Path, meaning: str) -> None:
    assert f"{path}" in err and meaning in err, err
    assert "Traceback" not in err


def test_a_full_disk_under_gate_is_exit_3_and_keeps_the_previous_records(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=32m", "tmpfs") as disk:
        root = copy_campaign(finished, disk)
        verdict = (root / "verdict.json").read_bytes()
        summary = (root / "analysis" / "summary.json").read_bytes()
        filler = disk / "filler"
        with filler.open("wb", buffering=0) as handle:  # the rest of the disk, to the last byte
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * 65536)
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0")
        code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
        assert code == EXIT_INFRASTRUCTURE, err
        _fault(err, root, "No space left on device")
        assert (root / "verdict.json").read_bytes() == verdict
        assert (root / "analysis" / "summary.json").read_bytes() == summary
        assert not list(root.rglob(".*.tmp"))  # no half-written temp files left behind
        filler.unlink()
        code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
        assert code == EXIT_OK, err


def test_a_read_only_file_system_is_exit_3_naming_it(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path / "src")
    with _mounted(tmp_path / "ro", "--bind", "-o", "ro", str(tmp_path / "src")) as ro:
        mounted = ro / root.relative_to(tmp_path / "src")
        for argv in (["gate", str(mounted)], ["run", "--resume", str(mounted)]):
            code, _, err = cli(*argv, capsys=capsys)
            assert code == EXIT_INFRASTRUCTURE, (argv, err)
            _fault(err, mounted, "Read-only file system")


def test_reports_or_output_that_is_a_file_or_under_one_is_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.campaign_dirs import tiny_card
    from tests.importers.test_import import _export_demo, _mapping

    card = tiny_card(tmp_path / "cards")
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    for reports in (a_file, a_file / "under"):
        code, _, err = cli("run", str(card), "--reports", str(reports), capsys=capsys)
        assert code == EXIT_INFRASTRUCTURE, err
        _fault(err, a_file, "Not a directory")
    files = _export_demo(tmp_path / "files", detailed=True)
    mapping = str(_mapping(tmp_path / "map.yaml"))
    for out in (a_file, a_file / "under"):
        code, _, err = cli("import", "vllm", *map(str, files), "--map", mapping, "-o", str(out),
                           capsys=capsys)  # fmt: skip
        assert code == EXIT_INFRASTRUCTURE, err
        _fault(err, a_file, "")
    assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize(
    ("name", "kind", "meaning"),
    [
        ("report.html", "dir", "Is a directory"),
        ("analysis", "file", "File exists (and is not a folder)"),
        ("verdict.json", "dir", "Is a directory"),
    ],
)
def test_a_folder_where_a_file_goes_or_the_reverse_is_exit_3(
    name: str,
    kind: str,
    meaning: str,
    finished: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = copy_campaign(finished, tmp_path)
    path = root / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.mkdir() if kind == "dir" else path.write_text("in the way\n")
    code, _, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE, err
    _fault(err, root, meaning)


def test_a_journal_that_is_a_folder_or_runs_that_is_a_file(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path / "a")
    (root / "journal.jsonl").unlink()
    (root / "journal.jsonl").mkdir()
    code, _, err = cli("gate", str(root), capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and "journal.jsonl: not a regular file" in err, err
    code, _, err = cli("run", "--resume", str(root), capsys=capsys)
    # Resume verifies the directory before anything else: the same words as gate.
    assert code == EXIT_INFRASTRUCTURE and "journal.jsonl: not a regular file" in err, err
    root = copy_campaign(finished, tmp_path / "b")
    shutil.rmtree(root / "runs")
    (root / "runs").write_text("in the way\n")
    code, _, err = cli("gate", str(root), capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and f"{root / 'runs'}: not a folder" in err, err


@pytest.mark.slow
def test_a_campaign_that_fills_its_disk_stops_with_exit_3_and_resumes_once_there_is_space(
    tmp_path: Path,
) -> None:
    from tests.campaign_dirs import tiny_card

    card = tiny_card(tmp_path / "cards")
    with _mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as disk:
        done = run_cli("run", str(card), "--reports", str(disk), "--quiet")
        assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
        (root,) = disk.glob("trust/*")
        _fault(done.stderr, root, "No space left on device")
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        done = run_cli("run", "--resume", str(root), "--quiet")
        assert done.code == EXIT_OK, done.stdout + done.stderr
        done = run_cli("gate", str(root), "--quiet")
        assert done.code == EXIT_OK, done.stderr


@pytest.mark.slow
def test_a_second_resume_while_a_campaign_runs_is_refused_and_a_sigkill_frees_the_directory(
    tmp_path: Path,
) -> None:
    from tests.campaign_dirs import tiny_card

    card = tiny_card(tmp_path / "cards")
    # Each boot waits 3 s before it loads, so the first campaign is still running while the
    # second resume and the gate try the directory (the tiny card once finished in between on
    # a loaded machine, and the gate found it free).
    text = card.read_text().replace(
        "knobs: {policy: frozen}", "knobs: {policy: frozen, boot_delay_s: 3}"
    )
    card.write_text(
        text.replace("knobs: {policy: adaptive}", "knobs: {policy: adaptive, boot_delay_s: 3}")
    )
    reports = tmp_path / "reports"
    first = start_campaign(card, reports)
    try:
        deadline = time.monotonic() + 60
        while not list(reports.glob("trust/*/runs/*/server.log")):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        (root,) = reports.glob("trust/*")
        second = run_cli("run", "--resume", str(root), "--quiet")
        assert second.code == EXIT_INFRASTRUCTURE, second.stdout + second.stderr
        assert f"pid {first.pid} on {socket.gethostname()}" in second.stderr
        assert "harness run" in second.stderr
        gate = run_cli("gate", str(root), "--quiet")
        assert gate.code == EXIT_INFRASTRUCTURE and "another harness" in gate.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the harness and the runtime it booted
        first.wait()
    done = run_cli("run", "--resume", str(root), "--quiet")
    assert done.code == EXIT_OK, done.stdout + done.stderr
    events = [json.loads(x) for x in (root / "journal.jsonl").read_text().splitlines() if x]
    done_runs = [e["run_id"] for e in events if e["event"] == "run_done"]
    assert len(done_runs) == len(set(done_runs)) == 4


# ---- inputs that validated and then failed or hung ---------------------------------------------


def _card_with(tmp_path: Path, old: str, new: str) -> Path:
    from tests.campaign_dirs import tiny_card

    card = tiny_card(tmp_path)
    text = card.read_text()
    assert old in text
    card.write_text(text.replace(old, new, 1))
    return card


ENV = 'env: {"REFBOX_LAYERS": "2"'


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (ENV, 'env: {"BAD=NAME": "1", "REFBOX_LAYERS": "2"', "without `=` or a NUL byte"),
        (ENV, 'env: {"": "1", "REFBOX_LAYERS": "2"', "must be non-empty"),
        (ENV, 'env: {"X": "a\\0b", "REFBOX_LAYERS": "2"', "a value with a NUL byte"),
        ("knobs: {policy: frozen}", 'args: ["--x\\0y"]\n    knobs: {policy: frozen}', "NUL"),
        ("window_s: 0.5", "window_s: 1e-300", "window_s: Input should be greater than or equal"),
    ],
)
def test_what_would_fail_later_is_a_card_error_at_its_line(
    old: str, new: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = _card_with(tmp_path, old, new)
    code, _, err = cli("validate", str(card), capsys=capsys)
    assert code == EXIT_BAD_INPUT and said in err, err
    assert re.search(r"trust\.yaml:\d+: ", err) and "Traceback" not in err, err


def test_a_rowmap_whose_hot_and_cold_overlap_is_refused_when_the_card_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rowmap = tmp_path / "overlap.json"
    layer = {"hot": [0, 1, 2, 3], "cold": [3, 4, 5, 6, 7]}
    rowmap.write_text(json.dumps({"layers": {"0": layer, "1": layer}, "meta": {}}))
    card = _card_with(
        tmp_path,
        "knobs: {policy: frozen}",
        f"files: {{rowmap: {rowmap}}}\n    knobs: {{policy: frozen}}",
    )
    code, _, err = cli("validate", str(card), capsys=capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "cells.control.files.rowmap" in err and "ids [3] are both hot and cold" in err, err


def test_a_fifo_as_a_card_or_a_ring_is_an_error_not_a_hang(tmp_path: Path) -> None:
    card, ring = tmp_path / "card.yaml", tmp_path / "ring.bin"
    os.mkfifo(card)
    os.mkfifo(ring)
    done = run_cli("validate", str(card), timeout_s=30)
    assert done.code == EXIT_BAD_INPUT and "is a FIFO, not a regular file" in done.stderr
    done = run_cli("ring", "show", str(ring), timeout_s=30)
    assert done.code == EXIT_BAD_INPUT and "is a FIFO, not a regular file" in done.stderr


@pytest.mark.parametrize(
    "pattern",
    [
        "(a+)+$",
        "(1|1)*2",
        "(a|a?)+b",
        "(x|x)+y",
        # Round three's: nested bounded repeats, a chain of repeats, a bounded repeat of an
        # optional, and a choice one of whose alternatives is another twice.
        "(1{1,30}){1,30}2",
        "1*1*1*1*1*1*1*1*1*1*1*1*2",
        "(1?){38}1{38}",
        "(?:1|11)+?2",
    ],
)
def test_a_profile_regex_that_backtracks_without_bound_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pattern: str
) -> None:
    # A repeat inside a repeat, or a repeated choice whose alternatives match the same text
    # (`(1|1)*2` on a line of 1s tries 2^n paths; the guard used to let it through).
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    profile = (REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml").read_text()
    assert 'pattern: "[1-9][0-9]*"' in profile
    (runtimes / "refbox.yaml").write_text(profile.replace('"[1-9][0-9]*"', f'"{pattern}"', 1))
    code, _, err = cli("validate", str(runtimes / "refbox.yaml"), capsys=capsys)
    assert code == EXIT_BAD_INPUT and "can take exponential time" in err, err


@pytest.mark.parametrize(
    "pattern",
    [
        "(a|b)*c",
        "(x|xy|z)+",
        "(foo|bar)+ (\\d+)",
        "(a|)*b",
        "(\\d{1,3}\\.){3}\\d{1,3}",
        "a*b*c*",
        "(ab?)*c",
    ],
)
def test_a_repeated_choice_of_distinct_alternatives_is_allowed(pattern: str) -> None:
    from harness.formats.textfile import compile_pattern

    assert compile_pattern(pattern).pattern == pattern


def test_absurd_figures_and_a_stray_carriage_return_in_imports_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for cycle, order in enumerate(["ABBA", "BAAB"]):
        for slot, arm in enumerate(order):
            cell = "stale" if arm == "A" else "seed"
            path = tmp_path / f"{cell}-c{cycle}-s{slot}.json"
            speed = 1e308 if (cycle, slot) == (0, 0) else 300.0
            rows = [[1, 48.2, 48.2], [8, speed, speed / 8]]
            path.write_text(json.dumps({"tag": "t", "rows": rows, "ts": 0}))
            files.append(path)
    from tests.importers.test_import import _mapping

    mapping = _mapping(tmp_path / "m.yaml", select="{C: 8}")
    code, _, err = cli("import", "knee", *map(str, files), "--map", str(mapping),
                       "-o", str(tmp_path / "o"), capsys=capsys)  # fmt: skip
    assert code == EXIT_BAD_INPUT and "e+307 is outside what a run measures" in err, err
    csv = tmp_path / "stale-c0-s0.csv"
    csv.write_text("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps\n2048,2048,40\r0,0\n")
    from harness.errors import ResultFileError
    from harness.importers.write import read_source

    with pytest.raises(
        ResultFileError, match=r"stale-c0-s0.csv:2: not CSV as the benchmark writes"
    ):
        read_source("ds4", csv)
    # Round three: a negative duration and a count no client sends were imported as measured.
    line = (DATA / "importers" / "sglang-bench_serving.jsonl").read_text().splitlines()[0]
    sglang = tmp_path / "sglang.jsonl"
    sglang.write_text(json.dumps({**json.loads(line), "duration": -42}) + "\n")
    with pytest.raises(ResultFileError, match=r"sglang.jsonl: duration: must be a finite positive"):
        read_source("sglang", sglang)
    result = json.loads((DATA / "vllm" / "bench-serve-random-c1.json").read_text())
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps({**result, "completed": 10**30}))
    with pytest.raises(ResultFileError, match=r"vllm.json: completed: must be a whole number"):
        read_source("vllm", vllm)


# ---- what the card says is data, in every output -------------------------------------------


def test_a_runtime_name_that_is_a_path_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("../../../tmp/evil", "a/b", ".hidden"):
        card = _card_with(
            tmp_path / name.replace("/", "_"), "runtime: refbox", f"runtime: {name!r}"
        )
        code, _, err = cli("validate", str(card), capsys=capsys)
        assert code == EXIT_BAD_INPUT and "is a name, not a path" in err, err
        code, _, err = cli("run", str(card), "--reports", str(tmp_path / "r"), capsys=capsys)
        assert code == EXIT_BAD_INPUT and "is a name, not a path" in err, err
    assert not (tmp_path / "r").exists() and not Path("/tmp/evil.yaml").exists()


TRAP = (
    "x\n# 2026-12-01 forged: PASS\n<!-- [bold red]red[/bold red] [/] <script>alert(1)</script>"
    "<img src=x onerror=alert(1)> [l](javascript:alert(1)) \x1b[31m \x00|"
)


def test_card_text_is_data_in_the_terminal_junit_and_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.campaign_dirs import start_with
    from tests.gate.campaigns import Synth, build_campaign, card_text

    # The card's description, and a quality prompt id (from a pool) that every gate reason names.
    text = card_text("  - {kind: quality, min_pass: 1}")
    text = text.replace("campaign: gates\n", f"campaign: gates\ndescription: {json.dumps(TRAP)}\n")
    synth = Synth(quality=lambda run, prompt_id: "no", quality_ids=(TRAP,))
    campaign = build_campaign(tmp_path, text, synth)
    suite = [{"id": TRAP, "domain": "x", "check": {"kind": "regex", "pattern": "^OK"}}]
    start_with(campaign.root, "quality.json", {"prompts": suite})
    code, out, err = cli("gate", str(campaign.root), capsys=capsys)
    assert code == 1, out + err  # no answer passes: a verdict, not a crash
    assert "Traceback" not in err and "\x1b[31m" not in out
    assert "[bold red]red[/bold red]" in out  # shown as written, not obeyed
    junit = ET.parse(campaign.root / "verdict.junit.xml").getroot()  # well-formed despite NUL
    failure = junit.find("./testsuite/testcase/failure")
    assert failure is not None and "<script>alert(1)</script>" in (failure.text or "")
    record = (campaign.root / "record.md").read_text()
    assert "<script>" not in record and "<img" not in record and "<!--" not in record
    assert "](javascript:" not in record
    assert not any(line.startswith("# 2026-12-01 forged") for line in record.splitlines())


@pytest.mark.slow  # resumes boot the runtime
def test_a_run_killed_between_its_record_and_its_seal_is_redone_by_resume(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The harness killed (or out of disk) after writing a run's run.json and before journalling
    # its run_done: the record says ok, nothing vouches for it. Gate refuses it, and resume used
    # to count it done from run.json alone and skip it, so gate refused it forever, its advice
    # ("resume the campaign to redo it") looping. Now resume redoes it, and the directory
    # verifies and gates again.
    root = copy_campaign(finished, tmp_path)
    journal = root / "journal.jsonl"
    lines = journal.read_text(encoding="utf-8").splitlines()
    last = max(i for i, line in enumerate(lines) if json.loads(line)["event"] == "run_done")
    cut = json.loads(lines[last])["run_id"]
    # The kill: the journal ends before that run_done (what followed was never written).
    journal.write_text("\n".join(lines[:last]) + "\n", encoding="utf-8")
    code, out, err = cli("gate", str(root), capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and "never sealed the run as done" in err, err
    resumed = run_cli("run", "--resume", str(root), "--quiet", timeout_s=300)
    assert resumed.code == EXIT_OK, resumed.stdout + resumed.stderr
    events = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    assert [e["run_id"] for e in events if e["event"] == "run_done"].count(cut) == 1
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_OK, out + err


def test_resume_refuses_a_directory_that_does_not_verify_before_it_boots(
    finished: Path, tmp_path: Path
) -> None:
    # The card's bound loosened by hand: `run --resume` used to boot and run every remaining
    # run, then refuse the verdict. Now it checks the directory first (a run left unsealed by
    # a kill is what it redoes, so that alone passes) and boots nothing.
    root = copy_campaign(finished, tmp_path)
    named = _card_edited(root)
    before = (root / "journal.jsonl").read_text(encoding="utf-8")
    refused = run_cli("run", "--resume", str(root), "--quiet", timeout_s=120)
    assert refused.code == EXIT_INFRASTRUCTURE, refused.stdout + refused.stderr
    assert NOT_VERIFIED in refused.stderr and named in refused.stderr
    assert (root / "journal.jsonl").read_text(encoding="utf-8") == before  # nothing journalled


# ---- the journal as a hash chain, its head kept outside the directory --------------------------


def _rechain(root: Path, change: Callable[[list[dict]], None]) -> None:  # type: ignore[type-arg]
    """What a forger who can write the directory does: change events, then recompute every
    ``prev`` so that the chain holds again."""
    rechain_journal(root / "journal.jsonl", change)


def _forge_card(root: Path) -> None:
    """The card's bound loosened, its digest re-sealed and the chain recomputed: every check
    inside the directory holds."""
    _card_edited(root)
    digest = hashlib.sha256((root / "card.yaml").read_bytes()).hexdigest()

    def reseal(events: list[dict]) -> None:  # type: ignore[type-arg]
        next(e for e in events if e["event"] == "campaign_start")["files"]["card.yaml"] = digest

    _rechain(root, reseal)


def _head(out: str) -> str:
    found = re.search(r"journal head: ([0-9a-f]{64})", out)
    assert found, out
    return found.group(1)


def test_every_journal_line_is_chained_so_an_edit_of_any_event_is_caught(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A look event rewritten moved the final α and nothing noticed: events other than the
    # sealing ones were not sealed. Now each line carries the digest of the one before it.
    events = (finished / "journal.jsonl").read_text(encoding="utf-8").splitlines()
    kinds = [json.loads(line)["event"] for line in events]
    assert all("prev" in json.loads(line) for line in events)
    for index in (1, kinds.index("boot"), len(events) - 2):
        root = copy_campaign(finished, tmp_path / str(index))
        lines = list(events)
        edited = json.loads(lines[index])
        edited["t"] = edited["t"] + 1.0
        lines[index] = json.dumps(edited)
        (root / "journal.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
        assert code == EXIT_INFRASTRUCTURE, out + err
        assert f"journal.jsonl: line {index + 2} ({kinds[index + 1]})" in err, err
    # A line inserted (a planted boot line, say) breaks it the same way.
    root = copy_campaign(finished, tmp_path / "planted")
    planted = json.dumps({"event": "boot", "run_id": "x", "pgid": 1, "prev": ""})
    lines = [*events[:2], planted, *events[2:]]
    (root / "journal.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and "journal.jsonl: line 3 (boot)" in err, err


def test_a_rewrite_with_resealed_digests_is_caught_by_the_head_kept_outside(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path)
    code, out, err = cli("gate", str(root), capsys=capsys)
    assert code == EXIT_OK, out + err
    head = _head(out)
    assert json.loads((root / "verdict.json").read_text())["journal_head"] == head
    store = tmp_path / "reports" / "history" / "journal-heads.jsonl"
    kept = [json.loads(x) for x in store.read_text().splitlines()]
    assert kept[-1]["head"] == head and kept[-1]["when"] == "gate"
    # Re-sealed and re-chained: nothing inside the directory can tell. The head in the
    # results store can.
    _forge_card(root)
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE, out + err
    assert NOT_VERIFIED in err and "journal.jsonl: rewritten since" in err, err
    assert str(store) in err
    assert json.loads((root / "verdict.json").read_text())["passed"] is False
    # The forger who also deletes the store is caught by the head the CI kept from the log.
    store.unlink()
    code, out, err = cli("gate", str(root), "--quiet", "--journal-head", head, capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and "no event line has the head" in err, out + err
    # Without either, this forgery is still caught: card.yaml is also the frozen copy whose
    # hash inputs/manifest.json keeps, and the plan is rebuilt from it. (A forger who rewrites
    # the manifest too is the README's "What the seal protects against" remainder.)
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and "card.yaml: edited since the campaign started" in err


def _plan_drop_run_whole(root: Path) -> str:
    """A run dropped from plan.json with its folder and every journal line about it."""
    plan = json.loads((root / "plan.json").read_text())
    gone = plan["runs"].pop()["run_id"]
    (root / "plan.json").write_text(json.dumps(plan, indent=2))
    shutil.rmtree(root / "runs" / gone)
    return gone


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_plan_cycles, "cycles 99, but the card plans"),
        (_plan_drop_run_whole, "not the plan its frozen card builds (3 runs against 4"),
    ],
)
def test_a_resealed_plan_is_held_to_the_plan_its_frozen_card_builds(
    finished: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[Path], str],
    said: str,
) -> None:
    # Even with no journal head kept anywhere, a plan.json grown to 99 cycles (or with a run
    # dropped), re-sealed and re-chained, is not the plan the campaign's own frozen card gives.
    root = copy_campaign(finished, tmp_path)
    gone = edit(root)
    digest = hashlib.sha256((root / "plan.json").read_bytes()).hexdigest()

    def reseal(events: list[dict]) -> None:  # type: ignore[type-arg]
        next(e for e in events if e["event"] == "campaign_start")["files"]["plan.json"] = digest
        events[:] = [e for e in events if e.get("run_id") != gone]

    _rechain(root, reseal)
    (tmp_path / "reports" / "history" / "journal-heads.jsonl").unlink(missing_ok=True)
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE, out + err
    assert NOT_VERIFIED in err and "plan.json: " in err and said in err, err


def test_a_kept_head_passes_the_journal_it_ends_not_a_grown_one_and_a_bad_one_is_exit_2(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_campaign(finished, tmp_path)
    code, out, err = cli("gate", str(root), capsys=capsys)
    head = _head(out)
    code, out, err = cli("gate", str(root), "--quiet", "--journal-head", head, capsys=capsys)
    assert code == EXIT_OK, out + err
    assert f"verified against the journal head you kept ({head[:16]}…" in out
    # A kept head is where trust ends: even what a resume appends is refused under it, and
    # passes under the head that resume printed.
    Journal(root / "journal.jsonl").append("campaign_resume")
    code, out, err = cli("gate", str(root), "--quiet", "--journal-head", head, capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and "1 event line follows the head" in err, out + err
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_OK and "verified against itself only" in out, out + err
    newer = _head(out)
    code, out, err = cli("gate", str(root), "--quiet", "--journal-head", newer, capsys=capsys)
    assert code == EXIT_OK, out + err
    code, out, err = cli("gate", str(root), "--journal-head", "abc", capsys=capsys)
    assert code == EXIT_BAD_INPUT and "64 hex digits" in err and "Traceback" not in err, err


def test_a_sealed_event_may_name_only_a_path_inside_the_directory(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A sealed event naming /etc/shadow made the verifier say whether that file had a given
    # digest: a hash oracle for any file of the machine.
    for name in ("/etc/hostname", "../../../etc/hostname", "runs/../../x"):
        root = copy_campaign(finished, tmp_path / str(abs(hash(name))))
        digest = hashlib.sha256(Path("/etc/hostname").read_bytes()).hexdigest()
        Journal(root / "journal.jsonl").append("sealed", files={name: digest})
        code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
        assert code == EXIT_INFRASTRUCTURE, out + err
        assert "not a path inside the campaign directory" in err, err


def test_the_lock_is_the_directory_so_deleting_the_lock_file_lets_no_second_harness_in(
    finished: Path, tmp_path: Path
) -> None:
    from harness.formats.lock import CampaignLocked, campaign_lock

    root = copy_campaign(finished, tmp_path)
    with campaign_lock(root, "harness run (first)"):
        (root / ".lock").unlink()
        with pytest.raises(CampaignLocked, match="another harness"), campaign_lock(root):
            pass
    with campaign_lock(root):  # released with its holder
        pass


def test_a_campaign_cut_off_while_it_is_made_leaves_no_directory_to_strand(
    tmp_path: Path,
) -> None:
    # Killed (or out of disk) before campaign_start was journalled, the directory used to be
    # left with a card and a plan: resume ran every run, then gate refused it forever (no
    # campaign_start). It is now made under a hidden name and renamed into place whole.
    from tests.campaign_dirs import tiny_card

    card = tiny_card(tmp_path / "cards")
    with _mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=12k", "tmpfs") as disk:
        done = run_cli("run", str(card), "--reports", str(disk), "--quiet")
        assert done.code == EXIT_INFRASTRUCTURE, done.stdout + done.stderr
        assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
        assert [p.name for p in (disk / "trust").iterdir()] == []  # nothing, not even a partial


@pytest.mark.slow  # resumes boot the runtime
def test_an_extension_cut_off_before_its_plan_is_in_place_is_finished_by_resume(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `run --resume --cycles N` journals the grown plan's digest, then renames it over
    # plan.json. Killed between the two, the directory used to fail verification with no
    # advice. The state a kill leaves: the grown plan staged, its journal line written.
    from harness.execute.reopen import reopen_campaign
    from harness.plan.build import extend_plan, plan_json_text

    root = copy_campaign(finished, tmp_path)
    plan = reopen_campaign(root).plan
    grown = extend_plan(plan, plan.cycles + 1)
    staged = root / ".plan.json.next"
    staged.write_text(plan_json_text(grown) + "\n")
    Journal(root / "journal.jsonl").append(
        "campaign_extended",
        **{"from": plan.cycles, "to": grown.cycles},
        runs_before=len(plan.runs),
        runs_after=len(grown.runs),
        files={"plan.json": hashlib.sha256(staged.read_bytes()).hexdigest()},
    )
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_INFRASTRUCTURE and f"harness run --resume {root}` finishes it" in err, err
    resumed = run_cli("run", "--resume", str(root), "--quiet", timeout_s=300)
    assert resumed.code == EXIT_OK, resumed.stdout + resumed.stderr
    assert "finished the extension" in resumed.stdout and not staged.exists()
    assert json.loads((root / "plan.json").read_text())["cycles"] == grown.cycles
    assert len(_runs(root)) == len(grown.runs)
    code, out, err = cli("gate", str(root), "--quiet", capsys=capsys)
    assert code == EXIT_OK, out + err


def test_an_extension_cut_off_before_its_journal_line_leaves_the_campaign_as_it_was(
    finished: Path, tmp_path: Path
) -> None:
    root = copy_campaign(finished, tmp_path)
    before = (root / "plan.json").read_text()
    (root / ".plan.json.next").write_text(before.replace('"cycles"', '"cycles_"'))
    resumed = run_cli("run", "--resume", str(root), "--quiet", timeout_s=300)
    assert resumed.code == EXIT_OK, resumed.stdout + resumed.stderr
    assert "removed the grown plan" in resumed.stdout
    assert (root / "plan.json").read_text() == before
    assert not (root / ".plan.json.next").exists()


UNSEEN = (
    "\u202eevil\u202c \x1b]8;;http://x.example\x07link\x1b]8;;\x07 bell\x07 \x9b31m \u2066x\u2069"
    # Round three: zero-width characters (ev\u200bil reads as evil) and the line separators.
    " z\u200bw\u200d\u2060\ufeff ls\u2028ps\u2029"
)


def test_controls_and_bidi_overrides_reach_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A right-to-left override, an OSC 8 hyperlink ended by BEL, a C1 CSI and an isolate in the
    # card's description: escaping stops markup, not these. They reached record.md, the page
    # and the gate table, where a terminal or viewer obeys them; now each is U+FFFD.
    from tests.gate.campaigns import Synth, build_campaign, card_text

    text = card_text("  - {kind: quality, min_pass: 1}")
    described = f"campaign: gates\ndescription: {json.dumps(UNSEEN)}\n"
    text = text.replace("campaign: gates\n", described)
    campaign = build_campaign(tmp_path, text, Synth(quality=lambda run, prompt_id: "no"))
    code, out, err = cli("gate", str(campaign.root), capsys=capsys)
    assert code in (0, 1), out + err
    assert run_cli("report", str(campaign.root)).code in (0, 1)
    outputs = {
        "terminal": out + err,
        "record.md": (campaign.root / "record.md").read_text(encoding="utf-8"),
        "report.html": (campaign.root / "report.html").read_text(encoding="utf-8"),
    }
    assert "evil" in outputs["record.md"] and "evil" in outputs["report.html"]
    for name, text_out in outputs.items():
        for char in ("\u202e", "\u202c", "\x1b", "\x07", "\x9b", "\u2066", "\u2069", "\u200b",
                     "\u200d", "\u2060", "\ufeff", "\u2028", "\u2029"):  # fmt: skip
            assert char not in text_out, (name, repr(char))


def test_a_partial_folder_a_killed_harness_left_is_removed_by_the_next_start(
    tmp_path: Path,
) -> None:
    # A harness killed between campaign_start and the rename leaves `.<stamp>-<pid>.partial`
    # (its inputs copied whole), which nothing read, removed or mentioned. The next start in
    # the folder removes those whose process is gone, and leaves a live one's alone.
    from harness.card import load_card
    from harness.execute.campaign import new_campaign_dir
    from harness.plan.build import build_plan
    from tests.campaign_dirs import tiny_card

    gone = subprocess.Popen(["true"])
    gone.wait()
    folder = tmp_path / "reports" / "trust"
    dead = folder / f".20260101T000000Z-{gone.pid}.partial"
    live = folder / f".20260101T000000Z-{os.getpid()}.partial"
    for partial in (dead, live):
        (partial / "inputs").mkdir(parents=True)
        (partial / "inputs" / "pool.jsonl").write_text("{}\n")
    loaded = load_card(tiny_card(tmp_path / "cards"))
    root = new_campaign_dir(loaded, build_plan(loaded), tmp_path / "reports").root
    assert root.parent == folder and not dead.exists() and live.exists()


def test_a_document_too_large_says_whether_aliases_made_it_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A card of 10,002 cells written out was told "aliases of aliases?"; an alias bomb still is.
    big = tmp_path / "big.yaml"
    cells = "".join(
        f"  c{i}: {{knobs: {{a: {i}, b: {i}, c: {i}, d: {i}, e: {i}}}}}\n" for i in range(10002)
    )
    big.write_text("campaign: big\ncells:\n" + cells, encoding="utf-8")
    code, _, err = cli("validate", str(big), capsys=capsys)
    assert code == EXIT_BAD_INPUT and "expands to more than 100,000 values" in err, err
    assert "aliases" not in err and "split it" in err, err
    bomb = tmp_path / "bomb.yaml"
    rows = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefg":
        rows.append(f"{level}: &{level} [" + ", ".join([f"*{chr(ord(level) - 1)}"] * 10) + "]")
    bomb.write_text("\n".join(rows) + "\n", encoding="utf-8")
    code, _, err = cli("validate", str(bomb), capsys=capsys)
    assert code == EXIT_BAD_INPUT and "aliases of aliases?" in err, err
