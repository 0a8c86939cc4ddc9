"""The swap queue at its budget after a shift (seed 000 Fig. 3), read from a route trace's
drain lines on the ring's clock (harness.analyze.saturation)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from harness.analyze.campaign import analyze_campaign
from harness.analyze.saturation import QueueSaturation, queue_saturation
from tests.conftest import DATA


def _trace(path: Path, drains: list[tuple[int, int]], layers: int = 40) -> Path:
    lines = [{"kind": "header", "version": 2, "layers": layers}]
    lines += [{"kind": "drain", "step": s, "swaps": 2 * n, "saturated": n} for s, n in drains]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _ring(steps: int, step_ms: float = 100.0, first: int = 0) -> pd.DataFrame:
    seq = list(range(first, first + steps))
    return pd.DataFrame({"seq": seq, "t_ns": [int(i * step_ms * 1e6) for i in range(steps)]})


def test_the_queue_is_saturated_until_a_drain_with_under_half_the_layers_at_budget(
    tmp_path: Path,
) -> None:
    # A step every 100 ms; a shift at 2 s. Drains 3 s (40 layers), 5 s (36), 8 s (31) and
    # 12 s (12 of 40: under half) after the shift: saturated 12 s, 40 layers at the peak.
    trace = _trace(tmp_path / "t.jsonl", [(10, 3), (50, 40), (70, 36), (100, 31), (140, 12)])
    (shift,) = queue_saturation(trace, _ring(200), [(2.0, 19.9)])
    assert shift == QueueSaturation(peak_layers=40, layers=40, saturated_s=12.0)
    # Never saturated: the first drain after the shift already has few layers at budget.
    calm = _trace(tmp_path / "c.jsonl", [(50, 4), (90, 0)])
    assert queue_saturation(calm, _ring(200), [(2.0, 19.9)]) == [QueueSaturation(4, 40, 0.0)]
    # Steps numbered from the ring's first recorded step (a ring read since the scored start).
    late = queue_saturation(trace, _ring(150, first=50), [(0.0, 14.9)])
    assert late == [QueueSaturation(40, 40, 9.0)]  # 140 - 50 = 90 steps after the shift


def test_a_run_without_drains_or_step_numbers_measures_nothing(tmp_path: Path) -> None:
    spans = [(2.0, 19.9)]
    assert queue_saturation(tmp_path / "none.jsonl", _ring(200), spans) == [None]
    empty = _trace(tmp_path / "e.jsonl", [])
    assert queue_saturation(empty, _ring(200), spans) == [None]
    trace = _trace(tmp_path / "t.jsonl", [(50, 40)])
    assert queue_saturation(trace, _ring(200).drop(columns="seq"), spans) == [None]


def test_the_demo_reproduces_seed_000s_figure_3_in_miniature(tmp_path: Path) -> None:
    # The stale boot map's shift pins every layer at the budget for seconds; the seed map's
    # never saturates (seed 000: 31-40 of 40 for ~10 s on the September map, none on the seed).
    root = tmp_path / "demo" / "20260101T000000Z"
    shutil.copytree(DATA / "campaigns" / "demo-washed", root)
    ladder = analyze_campaign(root).seed_tables.recovery
    assert ladder is not None
    rows = {r.cell: r.t90[0] for r in ladder.rows}
    stale, seed = rows["stale"], rows["seed"]
    assert stale.layers == seed.layers == 8
    assert stale.at_budget_layers == 8 and stale.saturated_s is not None
    assert stale.saturated_s > 1.0
    assert seed.at_budget_layers is not None and seed.at_budget_layers < 8 / 2
    assert seed.saturated_s == 0.0
