"""Routing trace formats: the refbox route trace, Megatron-style JSONL, .npy/.npz, bad traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.errors import TraceError
from harness.policy.residency import PolicyKnobs
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.model import ModelConfig
from harness.sim.decisions import lockstep
from harness.sim.trace_files import load_trace
from harness.sim.traces import concat_traces, decode_counts

SMALL = ModelConfig(layers=3, experts=16, top_k=2, d_model=16, d_ff=16, seed=7)


def test_refbox_trace_expands_prefill_tokens_and_keeps_knobs_and_swaps(tmp_path: Path) -> None:
    """One row per policy call: a prefill step is one row per prompt token (BOS first)."""
    path = tmp_path / "t.jsonl"
    knobs = PolicyKnobs(drain_every=2, promote_threshold=0.5)
    engine = Engine(
        SMALL,
        EngineOptions(hot_slots=4, knobs=knobs, expert_bytes=0, cold_dir=str(tmp_path),
                      route_trace_path=str(path)),
    )  # fmt: skip
    list(engine.generate(b"abc", 6))
    engine.set_knobs({"phase": 3, "hysteresis": 0.5})
    list(engine.generate(b"xy", 4))
    counters = engine.counters()
    engine.close()
    trace = load_trace(path)
    assert trace.format == "refbox" and trace.mode == "rowmap"
    assert (trace.layers, trace.top_k, trace.experts_count) == (3, 2, 16)
    assert trace.rows == counters["prefill_tokens"] + counters["decode_tokens"] == 4 + 5 + 3 + 3
    _starts, steps = trace.step_bounds()
    assert steps.tolist() == list(range(counters["steps"]))
    assert trace.prefill.tolist() == [True] * 4 + [False] * 5 + [True] * 3 + [False] * 3
    assert trace.steps[:4].tolist() == [0] * 4
    assert trace.phase.tolist() == [0] * 9 + [3] * 6
    assert trace.knobs == knobs and trace.hot == [[0, 1, 2, 3]] * 3
    assert [(c.step, c.knobs.hysteresis, c.phase) for c in trace.knob_changes] == [(6, 0.5, 3)]
    assert trace.swaps is not None and len(trace.swaps) == counters["swaps"]
    assert trace.where(6).startswith(f"{path}:")


def test_megatron_jsonl_groups_records_by_step(tmp_path: Path) -> None:
    """Records per (step, layer); one token or a list of tokens per record."""
    path = tmp_path / "m.jsonl"
    records = [
        {"step": 5, "layer": 1, "top_indices": [3, 4]},
        {"step": 5, "layer": 0, "top_indices": [1, 2]},
        {"step": 9, "layer": 0, "top_indices": [[0, 1], [2, 3]], "phase": 2},
        {"step": 9, "layer": 1, "top_indices": [[5, 6], [7, 0]], "phase": 2},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    trace = load_trace(path, experts=8)
    assert trace.experts.tolist() == [
        [[1, 2], [3, 4]],
        [[0, 1], [5, 6]],
        [[2, 3], [7, 0]],
    ]
    assert trace.steps.tolist() == [5, 9, 9] and trace.phase.tolist() == [0, 2, 2]
    assert trace.experts_count == 8 and trace.swaps is None


def test_npy_and_npz_arrays(tmp_path: Path) -> None:
    """vLLM's routed_experts: [tokens, layers, top_k]; an .npz may carry phase and prefill."""
    experts = np.arange(24).reshape(4, 3, 2) % 10
    np.save(tmp_path / "a.npy", experts)
    trace = load_trace(tmp_path / "a.npy")
    assert trace.steps.tolist() == [0, 1, 2, 3] and not trace.prefill.any()
    assert trace.experts_count == 10 and not trace.phase_tagged
    np.savez(tmp_path / "b.npz", routed_experts=experts, phase=[0, 0, 1, 1],
             prefill=[True, False, False, False])  # fmt: skip
    tagged = load_trace(tmp_path / "b.npz", experts=12)
    assert tagged.phase.tolist() == [0, 0, 1, 1] and tagged.prefill.tolist()[0]
    assert tagged.experts_count == 12
    joined = concat_traces([trace, tagged])
    assert joined.steps.tolist() == list(range(8))
    assert joined.phase.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def test_decode_counts_skip_prefill_and_decay() -> None:
    """Counts of decode selections; a half-life weighs older selections down."""
    from harness.sim.traces import trace_from_arrays

    experts = np.array([[[0]], [[1]], [[1]], [[0]]])
    trace = trace_from_arrays(experts, prefill=[True, False, False, False], experts_count=2)
    assert decode_counts(trace).tolist() == [[1.0, 2.0]]
    decayed = decode_counts(trace, half_life_steps=1.0)
    assert decayed.tolist() == [[1.0, 0.25 + 0.5]]


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


HEADER = {"kind": "header", "version": 2, "layers": 2, "experts": 4, "top_k": 2,
          "hot_slots": 2, "mode": "rowmap", "knobs": {}, "hot": [[0, 1], [0, 1]]}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", [], "is empty"),
        ("no-steps.jsonl", [HEADER], "no steps"),
        (
            "range.jsonl",
            [HEADER, {"kind": "step", "step": 0, "prefill": False, "experts": [[0, 9], [1, 2]]}],
            "expert id 9 is not in 0..3",
        ),
        (
            "shape.jsonl",
            [
                HEADER,
                {"kind": "step", "step": 0, "prefill": False, "experts": [[0, 1, 2], [1, 2, 3]]},
            ],
            ":2: experts must have shape [layers, top_k]",
        ),
        (
            "backwards.jsonl",
            [
                HEADER,
                {"kind": "step", "step": 3, "prefill": False, "experts": [[0, 1], [1, 2]]},
                {"kind": "step", "step": 2, "prefill": False, "experts": [[0, 1], [1, 2]]},
            ],
            ":3: step 2 after step 3",
        ),
        (
            "mixed.jsonl",
            [
                {"step": 0, "layer": 0, "top_indices": [1, 2]},
                {"step": 1, "layer": 0, "top_indices": [1, 2, 3]},
            ],
            ":2: top_indices has 3 experts, earlier records have 2: mixed top-k",
        ),
        (
            "meg-back.jsonl",
            [
                {"step": 4, "layer": 0, "top_indices": [1]},
                {"step": 2, "layer": 0, "top_indices": [1]},
            ],
            ":2: step 2 comes after step 4",
        ),
        ("alien.jsonl", [{"hello": 1}], ":1: unknown trace format"),
        (
            "drain.jsonl",
            [
                HEADER,
                {"kind": "step", "step": 0, "prefill": False, "experts": [[0, 1], [1, 2]]},
                {"kind": "drain", "step": "zero"},
            ],
            ":3: a drain line needs an integer step",
        ),
    ],
)
def test_bad_jsonl_traces_name_file_line_and_fix(
    tmp_path: Path, name: str, content: list[object], message: str
) -> None:
    """Every bad trace fails with TraceError naming the file (and line where there is one)."""
    path = _write(tmp_path / name, content)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(path) in caught.value.message and message in caught.value.message


def test_bad_array_traces(tmp_path: Path) -> None:
    """Wrong rank, empty arrays and ids outside the model are refused with the fix."""
    np.save(tmp_path / "flat.npy", np.zeros((4, 6), dtype=int))
    with pytest.raises(TraceError, match=r"flat\.npy: routing must have shape \[tokens"):
        load_trace(tmp_path / "flat.npy")
    np.save(tmp_path / "none.npy", np.zeros((0, 2, 2), dtype=int))
    with pytest.raises(TraceError, match="empty"):
        load_trace(tmp_path / "none.npy")
    np.save(tmp_path / "big.npy", np.full((2, 2, 2), 7))
    with pytest.raises(TraceError, match=r"expert id 7 is not in 0\.\.3; pass the model"):
        load_trace(tmp_path / "big.npy", experts=4)
    np.save(tmp_path / "neg.npy", np.full((2, 2, 2), -1))
    with pytest.raises(TraceError, match="expert id -1"):
        load_trace(tmp_path / "neg.npy")
    np.savez(tmp_path / "steps.npz", experts=np.zeros((3, 1, 1), dtype=int), step=[0, 2, 1])
    with pytest.raises(TraceError, match="row 2: step 1 comes after step 2"):
        load_trace(tmp_path / "steps.npz")
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.npy")


def test_a_version_1_route_trace_replays_its_routing_but_not_its_decisions(tmp_path: Path) -> None:
    step = {"kind": "step", "step": 0, "prefill": False, "experts": [[0, 1], [1, 2]]}
    path = _write(tmp_path / "old.jsonl", [{**HEADER, "version": 1}, step])
    trace = load_trace(path)
    assert trace.rows == 1 and trace.swaps is None and trace.drains is None
    with pytest.raises(TraceError, match="a version 1 route trace, recorded when drains fell"):
        lockstep(trace)
    future = _write(tmp_path / "new.jsonl", [{**HEADER, "version": 3}, step])
    with pytest.raises(TraceError, match="route trace version 3 is not 2"):
        load_trace(future)
