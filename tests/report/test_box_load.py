"""The box's load and speed, shown: the "Box load and speed" section of ``report.html`` and
``record.md``, and the warning on a loaded or drifted run, pinned on a fixture campaign.

The records are tests/data/campaigns/demo-washed, with readings written into each ``run.json``
as the runner writes them (``runtime.box_load``) and the journal re-sealed over them, so the
directory verifies as one the harness made. An old directory without readings says "not
recorded".
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.analyze.box_load import DRIFT, LOADED_PER_CORE, box_load_table
from harness.analyze.campaign import analyze_campaign
from harness.execute.box_load import REFERENCE
from harness.formats.records import write_json_atomic
from harness.formats.seal import file_sha256
from harness.gate.evaluate import evaluate_gates
from harness.report import render_report
from tests.conftest import DATA, run_cli

RECORDS = DATA / "campaigns" / "demo-washed"
Reading = Callable[[int, str], dict[str, Any]]


def _reading(runnable: int, reference_ms: float, cpus: int = 2) -> dict[str, Any]:
    return {
        "load_1m": 0.2 + runnable,
        "cpus": cpus,
        "runnable": runnable,
        "reference_ms": reference_ms,
        "reference": REFERENCE,
    }


def _quiet(index: int, when: str) -> dict[str, Any]:
    # Within ±3% of 20 ms: a quiet box's repeat noise.
    return _reading(0, 20.0 * (1 + 0.03 * ((index % 3) - 1)))


def _loaded(index: int, when: str) -> dict[str, Any]:
    if index in (4, 5) and when == "before":
        return _reading(2, 20.0)  # two `yes` loops on two cores: 1.0 per core
    if index == 9:
        return _reading(0, 26.0)  # the machine 30% slower
    return _quiet(index, when)


def _with_readings(tmp_path: Path, reading: Reading | None) -> Path:
    """demo-washed copied, each run's ``runtime.box_load`` written by ``reading`` (none: as
    it is) and the journal re-sealed over the rewritten records."""
    from tests.campaign_dirs import rechain_journal  # it imports the report tests' card

    root = tmp_path / "reports" / "demo" / "20261206T000000Z"
    shutil.copytree(RECORDS, root, ignore=shutil.ignore_patterns("README.md"))
    if reading is None:
        return root
    digests = {}
    for index, folder in enumerate(sorted((root / "runs").iterdir())):
        path = folder / "run.json"
        record = json.loads(path.read_text(encoding="utf-8"))
        record["runtime"]["box_load"] = {w: reading(index, w) for w in ("before", "after")}
        write_json_atomic(path, record)
        digests[folder.name] = file_sha256(path)

    def reseal(events: list[dict[str, Any]]) -> None:
        for event in events:
            if event["event"] == "run_done":
                event["files"]["run.json"] = digests[event["run_id"]]

    rechain_journal(root / "journal.jsonl", reseal)
    return root


def _render(root: Path) -> tuple[str, str, list[str]]:
    analysis = analyze_campaign(root)
    render_report(root, analysis, evaluate_gates(analysis), figures=False)
    record = (root / "record.md").read_text(encoding="utf-8")
    page = (root / "report.html").read_text(encoding="utf-8")
    return record, page, analysis.warnings


def _section(record: str) -> str:
    return record.split("## Box load and speed", 1)[1].split("\n## ", 1)[0]


def test_a_quiet_campaign_shows_every_run_and_warns_of_nothing(tmp_path: Path) -> None:
    root = _with_readings(tmp_path, _quiet)
    record, page, warnings = _render(root)
    section = _section(record)
    rows = [line for line in section.splitlines() if line.startswith("| 00")]
    assert len(rows) == 16
    # run, cell, load before / after, per core, CPUs, reference ms, ÷ median, flag, note
    assert rows[0].split(" | ")[2:7] == ["0.20 / 0.20", "0.00", "2", "19.4 / 19.4", "0.97 / 0.97"]
    assert "load per core before the boot at most 0.00" in section
    assert "reference step median 20.0 ms on" in section and "spread 1.06×" in section
    assert "; quiet." in section
    assert not any(w.startswith("box load") for w in warnings)
    assert "Box load and speed" in page and "box load:" not in page
    gated = run_cli("gate", str(root))
    assert "warning: box load" not in gated.stdout, gated.stdout


def test_a_loaded_run_and_a_drifted_one_warn_where_people_read(tmp_path: Path) -> None:
    root = _with_readings(tmp_path, _loaded)
    record, page, warnings = _render(root)
    section = _section(record)
    loaded = [line for line in section.splitlines() if line.startswith(("| 0004", "| 0005"))]
    assert all("| 1.00 | 2 |" in line and "| loaded |" in line for line in loaded), loaded
    drifted = next(line for line in section.splitlines() if line.startswith("| 0009"))
    assert "| 26.0 / 26.0 |" in drifted and "| drifted |" in drifted
    assert "loaded or drifted: runs 0004-seed-c1-warm-s0-r0, 0005-stale-c1-warm-s1-r0, " in section
    [warning] = [w for w in warnings if w.startswith("box load")]
    assert "runs 0004-seed-c1-warm-s0-r0, 0005-stale-c1-warm-s1-r0 started with more than 0.5" in (
        warning
    )
    assert "reference step of run 0009-seed-c2-warm-s1-r0 was more than 10%" in warning
    assert warning.endswith("which load cannot move")  # the remedy last
    assert warning in record.split("## Warnings", 1)[1]
    assert "box load: runs 0004-seed-c1-warm-s0-r0" in page
    gated = run_cli("gate", str(root))
    assert f"warning: {warning}" in " ".join(gated.stdout.split()), gated.stdout


def test_a_reading_that_failed_says_why_and_shows_no_number(tmp_path: Path) -> None:
    def failed(index: int, when: str) -> dict[str, Any]:
        if index == 0 and when == "before":
            return {"error": "not read: python3 on the box: command not found"}
        return _quiet(index, when)

    record, _, _ = _render(_with_readings(tmp_path, failed))
    first = next(x for x in _section(record).splitlines() if x.startswith("| 0000"))
    assert "| not read / 0.20 | not read | not read | not read / 19.4 |" in first, first
    assert "before: not read: python3 on the box: command not found" in first
    assert "15 of 16 runs read before the boot" in record


def test_a_campaign_without_readings_says_not_recorded(tmp_path: Path) -> None:
    record, page, warnings = _render(_with_readings(tmp_path, None))
    assert "\nnot recorded: no run of this campaign carries box-load readings" in record
    assert "not recorded: no run of this campaign carries box-load readings" in page
    assert not any(w.startswith("box load") for w in warnings)


def _entry(run_id: str, runnable: float, reference_ms: float) -> dict[str, Any]:
    reading = _reading(0, reference_ms, cpus=4) | {"runnable": runnable}
    return {"run_id": run_id, "cell": "a", "box": "b", "box_load": {"before": reading}}


@pytest.mark.parametrize(
    ("runnable", "loaded"), [(2.0, False), (1.96, False), (2.4, True), (4.0, True)]
)
def test_loaded_is_more_than_half_a_core_of_other_work_per_core(
    runnable: float, loaded: bool
) -> None:
    assert LOADED_PER_CORE == 0.5
    load = box_load_table([_entry("x", runnable, 20.0), _entry("y", 0, 20.0)])
    assert (load.loaded_runs == ("x",)) is loaded
    assert load.max_load_per_core == pytest.approx(runnable / 4, abs=1e-3)


@pytest.mark.parametrize(("slower", "drifted"), [(1.09, False), (1.11, True)])
def test_drifted_is_a_reference_step_more_than_ten_percent_off_the_median(
    slower: float, drifted: bool
) -> None:
    assert DRIFT == 0.10
    runs = [_entry(f"r{i}", 0, 20.0) for i in range(4)] + [_entry("slow", 0, 20.0 * slower)]
    load = box_load_table(runs)
    assert (load.drifted_runs == ("slow",)) is drifted
    assert load.reference_spread == pytest.approx(slower, abs=1e-3)
    assert load.median_reference_ms == {"b": 20.0}


def test_one_reading_off_alone_is_a_blip_not_a_drifted_run() -> None:
    # A quiet VM's make demo: 16-19 ms readings, and now and then one of 24-30 ms whose run's
    # other reading sat at the median. The block ran between the two: not on a slower machine.
    def both(run_id: str, before: float, after: float) -> dict[str, Any]:
        entry = _entry(run_id, 0, before)
        entry["box_load"]["after"] = _reading(0, after, cpus=4) | {"runnable": 0}
        return entry

    runs = [both(f"r{i}", 18.0, 18.0) for i in range(6)]
    load = box_load_table([*runs, both("blip", 29.5, 18.0)])
    assert load.drifted_runs == () and load.warning is None
    assert load.reference_spread == pytest.approx(29.5 / 18.0, abs=1e-3)
    # Both readings slow: the block ran on a slower machine.
    assert box_load_table([*runs, both("slow", 29.5, 25.0)]).drifted_runs == ("slow",)
