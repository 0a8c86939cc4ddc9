"""The box's load and reference step, read on the box before each run boots and after it ends:
recorded in ``run.json`` by a real campaign of the reference runtime on the local box (the
shared ``finished_campaign``), shown in its ``record.md``, and a reading that fails recorded as
not read, never a failed run. (Over SSH: tests/execute/test_execute_ssh.py.)"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from harness.boxes.local import LocalBox
from harness.execute.box_load import REFERENCE, read_box_load
from harness.profiles.box import BoxSpec


def test_every_run_of_a_campaign_records_the_box_before_and_after(finished_campaign: Path) -> None:
    runs = sorted((finished_campaign / "runs").iterdir())
    assert runs
    for folder in runs:
        record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        assert record["status"] == "ok"
        load = record["runtime"]["box_load"]
        for when in ("before", "after"):
            reading = load[when]
            assert reading["reference"] == REFERENCE, reading
            assert reading["cpus"] == os.cpu_count()
            assert reading["load_1m"] >= 0 and reading["runnable"] >= 0
            assert 0 < reading["reference_ms"] < 5000
    section = (finished_campaign / "record.md").read_text(encoding="utf-8")
    section = section.split("## Box load and speed", 1)[1].split("\n## ", 1)[0]
    assert f"{len(runs)} of {len(runs)} runs read before the boot" in section
    assert all(f"| {folder.name} |" in section for folder in runs)


def test_a_reading_takes_one_short_box_command() -> None:
    box = LocalBox("local", BoxSpec())
    started = time.perf_counter()
    readings = [read_box_load(box, sys.executable) for _ in range(2)]
    elapsed_s = time.perf_counter() - started
    assert all("error" not in r for r in readings), readings
    # Measured 0.15-0.2 s a reading on a busy 2-core box; before and after, well under 1 s
    # quiet. The bound leaves room for a loaded test machine.
    assert elapsed_s < 3, elapsed_s


def test_a_reading_that_fails_is_recorded_as_not_read() -> None:
    box = LocalBox("local", BoxSpec())
    reading = read_box_load(box, "/nonexistent/python3")
    assert list(reading) == ["error"]
    assert reading["error"].startswith("not read: /nonexistent/python3 on the box: ")
    assert "No such file" in reading["error"]
