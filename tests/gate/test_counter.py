"""The counter gate: bounds on the runtime's own counters, lost ring records and failed runs.

Campaigns are built on disk by :mod:`tests.gate.campaigns` and gated without booting anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.formats.records import (
    RUN_OK,
)
from tests.gate.campaigns import (
    COUNTERS,
    Run,
    Synth,
    only,
    verdict_of,
)


def _counters_with(**values: float) -> Callable[[Run], dict[str, float]]:
    def counters(run: Run) -> dict[str, float]:
        out = dict(COUNTERS)
        if run["run_id"].startswith("0001"):
            out.update(values)
        return out

    return counters


@pytest.mark.parametrize(
    ("gate", "values", "passed", "why"),
    [
        ("{kind: counter, counter: new_swapout_pages, max: 0}", {}, True, "4 runs within"),
        ("{kind: counter, counter: new_swapout_pages, max: 0}", {"new_swapout_pages": 3}, False,
         "out of bounds: 0001-treat-c0-warm-s1-r0=3"),
        ("{kind: counter, counter: swaps, max: 2}", {"swaps": 2}, True, "(max 2; highest seen 2)"),
        ("{kind: counter, counter: swaps, max: 2}", {"swaps": 2.5}, False, "=2.5"),
        ("{kind: counter, counter: expert_loads, min: 1}", {"expert_loads": 0}, False, "=0"),
        ("{kind: counter, counter: expert_loads, min: 1, max: 500}", {}, True, "within"),
        ("{kind: counter, counter: bytes_read, max: 1000000}", {"bytes_read": 2e6}, False, "=2e"),
    ],
)  # fmt: skip
def test_counter_bounds(
    tmp_path: Path, gate: str, values: dict[str, float], passed: bool, why: str
) -> None:
    result = only(verdict_of(tmp_path, f"  - {gate}", Synth(counters=_counters_with(**values))))
    assert result.passed is passed, result.reason
    assert why in result.reason
    assert len(result.evidence["values"]) == 4


def test_counter_not_recorded_fails_closed(tmp_path: Path) -> None:
    # A box that cannot read swap-out counters leaves new_swapout_pages out of the delta.
    def counters(run: Run) -> dict[str, float]:
        out = dict(COUNTERS)
        if run["run_id"].startswith("0003"):
            del out["new_swapout_pages"]
        return out

    result = only(
        verdict_of(
            tmp_path,
            "  - {kind: counter, counter: new_swapout_pages, max: 0}",
            Synth(counters=counters),
        )
    )
    assert not result.passed
    assert "new_swapout_pages was not recorded for run 0003-" in result.reason
    assert "cannot be shown to hold" in result.reason


def test_counter_fails_closed_when_a_run_did_not_complete(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: None if run["run_id"].startswith("0002") else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: counter, counter: swaps, max: 0}", synth))
    assert not result.passed
    assert result.reason == "runs not complete: 0002-treat-c0-warm-s2-r0 (missing)"


@pytest.mark.parametrize(("capacity", "lost", "passed"), [(4096, 0, True), (500, 101, False)])
def test_counter_lost_ring_records(tmp_path: Path, capacity: int, lost: int, passed: bool) -> None:
    # Run 0002's ring is written 601 times: a 500-slot ring loses 101 records before the read.
    def ring(run: Run) -> tuple[int, int, float]:
        return (601, capacity if run["run_id"].startswith("0002") else 4096, 5.0)

    result = only(
        verdict_of(
            tmp_path, "  - {kind: counter, counter: lost_ring_records, max: 0}", Synth(ring=ring)
        )
    )
    assert result.passed is passed, result.reason
    assert result.evidence["values"]["0002-treat-c0-warm-s2-r0"] == lost


def test_counter_lost_ring_records_without_a_ring_fails_closed(tmp_path: Path) -> None:
    # run.json says 0 records lost, but no ring was collected: 0 is not evidence.
    synth = Synth(ring=lambda run: None if run["run_id"].startswith("0001") else (601, 4096, 5.0))
    result = only(
        verdict_of(tmp_path, "  - {kind: counter, counter: lost_ring_records, max: 0}", synth)
    )
    assert not result.passed
    assert result.reason.startswith(
        "lost_ring_records was not recorded for run 0001-treat-c0-warm-s1-r0"
    )


@pytest.mark.parametrize(("status", "passed"), [(RUN_OK, True), ("failed", False), (None, False)])
def test_counter_failed_runs(tmp_path: Path, status: str | None, passed: bool) -> None:
    synth = Synth(status=lambda run: status if run["run_id"].startswith("0003") else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: counter, counter: failed_runs, max: 0}", synth))
    assert result.passed is passed, result.reason
    assert result.evidence["values"] == {"campaign": 0.0 if passed else 1.0}


def test_counter_applies_only_to_its_cells(tmp_path: Path) -> None:
    synth = Synth(
        counters=lambda run: {**COUNTERS, "swaps": 9.0 if run["cell"] == "treat" else 0.0}
    )
    gates = (
        "  - {kind: counter, counter: swaps, max: 0, cells: [control]}\n"
        "  - {kind: counter, counter: swaps, max: 0, cells: [treat]}"
    )
    verdict = verdict_of(tmp_path, gates, synth)
    assert [g.passed for g in verdict.gates] == [True, False]
    assert not verdict.passed


# ---- better ------------------------------------------------------------------------------------
