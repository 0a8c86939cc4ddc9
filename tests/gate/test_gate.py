"""Promotion gates over real campaign directories built on disk, without booting anything.

Each test writes a campaign the way ``harness run`` does — ``new_campaign_dir`` for the card, plan
and quality suite, then per run ``run.json``, ``requests.parquet``, ``chunks.parquet``,
``counters.json`` and (for soaks) ``ring.parquet`` read back from a real ring file — with
timings chosen so the statistics have a known answer, then calls ``analyze_campaign`` and
``evaluate_gates``. Every gate kind is shown passing, failing, and failing closed on missing data.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.analyze.campaign import analyze_campaign
from harness.analyze.metrics import counter_metrics
from harness.card import load_card
from harness.card.phase_length import washout_requests
from harness.drive.client import RequestResult
from harness.errors import RecordError, VerificationError
from harness.execute.campaign import new_campaign_dir
from harness.execute.frames import chunks_frame, requests_frame
from harness.formats.records import (
    RUN_OK,
    CampaignDir,
    RunRecord,
    write_json_atomic,
    write_parquet,
    write_sealed_json,
)
from harness.formats.ring import RingGeometry, RingWriter
from harness.formats.ring_read import read_ring
from harness.gate.evaluate import GateResult, Verdict, evaluate_gates, write_verdict
from harness.gate.quality import check_passes
from harness.plan.build import build_plan
from tests.conftest import DATA, run_cli

POOLS = DATA / "pools"
# The held-out prompts of small.jsonl in pool order (what build_phases sends, one pass).
HELDOUT = ("en-held-1", "en-held-2", "py-held-1", "py-held-2")
DOMAINS = {"en-held-1": "en-prose", "en-held-2": "en-prose"}
# Prompt-to-prompt spread inside a block, the same in every block (prompts are aligned).
PROMPT_FACTOR = (1.0, 0.93, 1.08, 0.97)
TOKENS = 17  # completion tokens per request: 16 decode gaps
TTFT_S = 0.02
QUALITY_PASSING = {"q-ok": "OK, done.", "q-json": "{}"}

Run = dict[str, Any]


@dataclass
class Synth:
    """How each synthetic run behaves; every callable gets the plan's run entry."""

    speed: Callable[[Run], float] = lambda run: 100.0  # block decode tok/s before prompt factors
    status: Callable[[Run], str | None] = lambda run: RUN_OK  # None: the run never ran
    output: Callable[[Run, str], str] = lambda run, prompt_id: f"greedy text of {prompt_id}"
    counters: Callable[[Run], dict[str, float]] = lambda run: dict(COUNTERS)
    quality: Callable[[Run, str], str] | None = None  # quality-suite output per prompt id
    quality_ids: tuple[str, ...] | None = None  # default: the card's quality pool
    ring: Callable[[Run], tuple[int, int, float] | None] = lambda run: None
    noise_sd: float = 0.003  # seeded per-request noise on the log scale
    extra: dict[str, Any] = field(default_factory=dict)
    boot: Callable[[Run], str] | None = None  # the run's boot id; None: a boot of its own
    washout: bool = True  # warm runs record the card's washout, as harness run does


COUNTERS = {
    "tokens": 100.0,
    "lookups": 800.0,
    "cold_lookups": 200.0,
    "hits": 600.0,
    "misses": 200.0,
    "expert_loads": 200.0,
    "bytes_read": 200.0 * 4096,
    "swaps": 0.0,
    "decode_tokens": 64.0,
    "new_swapout_pages": 0.0,
}


def _card_text(
    gates: str,
    *,
    cycles: int = 1,
    states: str = "[warm]",
    cells: tuple[str, ...] = ("control", "treat"),
    order: str = "abba",
) -> str:
    cell_lines = "\n".join(f"  {name}: {{}}" for name in cells)
    control = f"control: {cells[0]}\n" if order != "sequential" else ""
    return (
        "campaign: gates\n"
        "box: local\n"
        "runtime: refbox\n"
        "prompts:\n"
        f"  pools: [{POOLS}/small.jsonl]\n"
        "  fit: {split: fit}\n"
        "  heldout: {split: heldout}\n"
        f"  quality: {POOLS}/quality.jsonl\n"
        "workload: {max_tokens: 16, warmup_requests: 1}\n"
        f"cells:\n{cell_lines}\n"
        f"{control}"
        f"design: {{order: {order}, cycles: {cycles}, cache_states: {states}, retries: 0}}\n"
        "analysis: {window_s: 0.5, converged_span_s: 1, hold_s: 0}\n"
        f"gates:\n{gates}\n"
    )


def _request(prompt_id: str, speed: float, text: str, *, warmup: bool, phase: str) -> RequestResult:
    decode_s = (TOKENS - 1) / speed
    e2el = TTFT_S + decode_s
    gaps = [TTFT_S + decode_s * k / (TOKENS - 1) for k in range(TOKENS)]
    return RequestResult(
        prompt_id=prompt_id,
        domain=DOMAINS.get(prompt_id, "python"),
        phase=phase,
        phase_index=-1 if warmup else (-2 if phase == "quality" else 0),
        warmup=warmup,
        ok=True,
        ttft_s=TTFT_S,
        e2el_s=e2el,
        completion_tokens=TOKENS,
        prompt_tokens=12,
        chunk_times_s=gaps,
        chunk_chars=[1] * TOKENS,
        output_text=text,
    )


def _write_ring(folder: Path, steps: int, capacity: int, spike_ms: float) -> int:
    """A real ring file of ``steps`` decode steps 100 ms apart, 5 ms each (one ``spike_ms``)."""
    path = folder / "ring.bin"
    with RingWriter(path, capacity, RingGeometry(2, 8, 2, 4)) as ring:
        for step in range(steps):
            dur_ms = spike_ms if step == steps // 2 else 5.0
            t_ns = step * 100_000_000
            ring.append((t_ns, int(dur_ms * 1e6), 1, 8, 2, 0, 2 * 4096, 0))
    read = read_ring(path)
    write_parquet(read.frame, folder / "ring.parquet")
    path.unlink()
    return read.lost


def build_campaign(root: Path, card_text: str, synth: Synth) -> CampaignDir:
    """Write a whole campaign directory as ``harness run`` leaves it, runs included."""
    root.mkdir(parents=True, exist_ok=True)
    card_path = root / "card-src.yaml"
    card_path.write_text(card_text, encoding="utf-8")
    loaded = load_card(card_path)
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, root / "reports")
    quality_ids = synth.quality_ids or tuple(p.id for p in loaded.quality)
    raw_runs = json.loads((campaign.root / "plan.json").read_text())["runs"]
    for index, run in enumerate(raw_runs):
        status = synth.status(run)
        if status is None:
            continue  # never ran: no run.json at all
        folder = campaign.run_dir(run["run_id"])
        folder.mkdir(parents=True)
        rng = np.random.default_rng(index)
        results: list[RequestResult] = []
        if status == RUN_OK:
            speed = synth.speed(run)
            results.append(
                _request(HELDOUT[0], speed, synth.output(run, HELDOUT[0]), warmup=True, phase="w")
            )
            for prompt_id, factor in zip(HELDOUT, PROMPT_FACTOR, strict=True):
                noisy = speed * factor * math.exp(rng.normal(0.0, synth.noise_sd))
                text = synth.output(run, prompt_id)
                results.append(_request(prompt_id, noisy, text, warmup=False, phase="main"))
            if synth.quality is not None:
                for prompt_id in quality_ids:
                    text = synth.quality(run, prompt_id)
                    results.append(_request(prompt_id, speed, text, warmup=False, phase="quality"))
            delta = synth.counters(run)
            write_json_atomic(
                folder / "counters.json", {"before": {}, "after": dict(delta), "delta": delta}
            )
        ring_lost = 0
        ring_spec = synth.ring(run)
        if ring_spec is not None and status == RUN_OK:
            ring_lost = _write_ring(folder, *ring_spec)
        warm_washout = synth.washout and run["cache_state"] == "warm"
        record = RunRecord(
            run_id=run["run_id"],
            runtime={"washout_requests": washout_requests(loaded) if warm_washout else 0},
            status=status,
            reason="" if status == RUN_OK else "runtime refbox exited during boot",
            cell=run["cell"],
            cycle=run["cycle"],
            slot=run["slot"],
            repeat=run["repeat"],
            cache_state=run["cache_state"],
            pattern=run["pattern"],
            comparison=run["comparison"],
            block=run["block"],
            box="local",
            boot_id=synth.boot(run) if synth.boot else f"{run['run_id']}-a1",
            started_at=1_000.0 + 10 * index,
            ended_at=1_000.0 + 10 * index + 8,
            ring_lost=ring_lost,
        )
        write_parquet(requests_frame(results, run["cell"]), folder / "requests.parquet")
        write_parquet(chunks_frame(results), folder / "chunks.parquet")
        write_json_atomic(folder / "run.json", record.to_json())
        event = "run_done" if status == RUN_OK else f"run_{status}"
        campaign.journal.append(event, run_id=run["run_id"])
    return campaign


def verdict_of(root: Path, gates: str, synth: Synth | None = None, **card: Any) -> Verdict:
    """Build the campaign, analyse it and evaluate its gates."""
    campaign = build_campaign(root, _card_text(gates, **card), synth or Synth())
    return evaluate_gates(analyze_campaign(campaign.root))


def only(verdict: Verdict) -> GateResult:
    """The single gate of a one-gate card."""
    assert len(verdict.gates) == 1
    return verdict.gates[0]


def faster(ratio: float) -> Callable[[Run], float]:
    """Treatment ``ratio`` times the control's speed."""
    return lambda run: 100.0 * (ratio if run["cell"] != "control" else 1.0)


# ---- exact outputs ---------------------------------------------------------------------------


def test_exact_outputs_pass_when_every_prompt_matches(tmp_path: Path) -> None:
    gate = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: all}"))
    assert gate.passed, gate.reason
    assert gate.evidence["cells"]["treat"]["matched"] == 4
    assert "treat: 4/4" in gate.reason


def _one_differs(run: Run, prompt_id: str) -> str:
    if run["cell"] == "treat" and prompt_id == "py-held-1" and run["slot"] == 2:
        return "a different greedy continuation"
    return f"greedy text of {prompt_id}"


@pytest.mark.parametrize(
    ("gate", "passed"),
    [
        ("{kind: exact_outputs, min_match: all}", False),
        ("{kind: exact_outputs, min_match: 4/4}", False),
        ("{kind: exact_outputs, min_match: 3/4}", True),
        ("{kind: exact_outputs, min_match: 3}", True),
        ("{kind: exact_outputs, min_match: 7/8}", False),  # ceil(7/8 · 4) = 4
        ("{kind: exact_outputs, min_match: all, allow: [py-held-1]}", True),
        ("{kind: exact_outputs, min_match: all, allow: [en-held-1]}", False),
    ],
)
def test_exact_outputs_k_of_n_and_allow_list(tmp_path: Path, gate: str, passed: bool) -> None:
    result = only(verdict_of(tmp_path, f"  - {gate}", Synth(output=_one_differs)))
    assert result.passed is passed, result.reason
    cell = result.evidence["cells"]["treat"]
    assert cell["matched"] == 3 and cell["n"] == 4
    if "allow: [py-held-1]" in gate:
        assert cell["allowed_mismatches"] == ["py-held-1"] and "+1 allowed" in result.reason
    else:
        assert cell["mismatched"] == ["py-held-1"]
    if not passed:
        assert "treat: 3/4 match control" in result.reason and "differ: py-held-1" in result.reason


def test_exact_outputs_fail_closed_when_the_cell_has_no_outputs(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: "failed" if run["cell"] == "treat" else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: 1/4}", synth))
    assert not result.passed
    assert result.reason.startswith("treat: runs not complete (0001-treat-c0-warm-s1-r0 (failed)")
    assert result.evidence["cells"]["treat"]["missing"] == list(HELDOUT)


def test_exact_outputs_with_every_output_empty_is_not_a_match(tmp_path: Path) -> None:
    # Both arms answered nothing: equal hashes, but nothing was compared.
    synth = Synth(output=lambda run, prompt_id: "")
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs}", synth))
    assert not result.passed and not result.incomplete
    assert result.reason == (
        "treat: 0/4 match control, need 4; 4 prompts with an empty output in control (nothing "
        "compared is not a match)"
    )


def test_exact_outputs_fail_closed_without_reference_outputs(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: None if run["cell"] == "control" else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: 1/4}", synth))
    assert not result.passed
    assert result.reason == (
        "reference control: runs not complete "
        "(0000-control-c0-warm-s0-r0 (missing), 0003-control-c0-warm-s3-r0 (missing))"
    )


def test_exact_outputs_fail_closed_with_no_completed_run(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: None)
    verdict = verdict_of(tmp_path, "  - {kind: exact_outputs}", synth)
    assert not only(verdict).passed
    assert "reference control: runs not complete" in only(verdict).reason
    assert len(verdict.incomplete_runs) == 4 and not verdict.passed


def test_exact_outputs_against_a_named_reference_cell(tmp_path: Path) -> None:
    def output(run: Run, prompt_id: str) -> str:
        return "changed" if run["cell"] == "control" else f"greedy text of {prompt_id}"

    result = only(
        verdict_of(
            tmp_path,
            "  - {kind: exact_outputs, vs: b, cells: [c]}",
            Synth(output=output),
            cells=("control", "b", "c"),
            cycles=2,
        )
    )
    assert result.passed, result.reason
    assert list(result.evidence["cells"]) == ["c"] and result.evidence["reference"] == "b"


@pytest.mark.parametrize(
    ("failing", "who"),
    [("0001", "treat: runs not complete (0001-treat-c0-warm-s1-r0 (failed))"),
     ("0003", "reference control: runs not complete (0003-control-c0-warm-s3-r0 (failed))")],
)  # fmt: skip
def test_exact_outputs_fail_closed_on_a_failed_run_even_when_others_cover_every_prompt(
    tmp_path: Path, failing: str, who: str
) -> None:
    # Every prompt still has outputs from the other runs; the failed run's outputs are unknown.
    synth = Synth(status=lambda run: "failed" if run["run_id"].startswith(failing) else RUN_OK)
    result = only(verdict_of(tmp_path, "  - {kind: exact_outputs, min_match: all}", synth,
                             cycles=2))  # fmt: skip
    assert not result.passed
    assert who in result.reason
    assert result.incomplete


# ---- counters --------------------------------------------------------------------------------


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


def test_better_passes_on_a_clear_speedup(tmp_path: Path) -> None:
    gates = "  - {kind: better, metric: decode_tok_s}\n  - {kind: better, metric: tpot_p50_ms}"
    verdict = verdict_of(tmp_path, gates, Synth(speed=faster(1.5)), cycles=3)
    speed, tpot = verdict.gates
    assert speed.passed and tpot.passed and verdict.passed, speed.reason + tpot.reason
    assert speed.evidence["treat/warm"]["label"] == "better"
    assert speed.evidence["treat/warm"]["ratio"] == pytest.approx(1.5, rel=0.01)
    assert tpot.evidence["treat/warm"]["ratio"] == pytest.approx(1 / 1.5, rel=0.01)
    assert speed.evidence["treat/warm"]["n_cycles"] == 3
    assert "treat/warm: ratio 1.50" in speed.reason and "over 3 cycles: better" in speed.reason
    # The evidence is plain JSON: ints stay ints and numbers are finite.
    assert isinstance(speed.evidence["treat/warm"]["n_cycles"], int)
    json.dumps(verdict.to_json(), allow_nan=False)


def test_better_fails_when_worse(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}",
                             Synth(speed=faster(0.7)), cycles=2))  # fmt: skip
    assert not result.passed
    assert "ratio 0.700" in result.reason and result.reason.endswith(": worse")


@pytest.mark.parametrize("shared", [False, True])
def test_better_without_a_washout_needs_the_cycles_that_estimate_carry_over(
    tmp_path: Path, shared: bool
) -> None:
    # 1.5x faster on every block, on boots of their own or each cycle's four blocks on one boot
    # (design.boot: per-cycle). Washed, two cycles decide it; without a washout two cycles
    # cannot estimate the carry-over the block before could leave (heat, a page cache, a
    # queue): the gate fails and says how many cycles would, or to declare the washout.
    gate = "  - {kind: better, metric: decode_tok_s}"
    boot = (lambda run: f"boot-{run['cycle']}") if shared else None
    bare = Synth(speed=faster(1.5), boot=boot, washout=False)
    result = only(verdict_of(tmp_path / "two", gate, bare, cycles=2))
    assert not result.passed
    assert result.evidence["treat/warm"]["label"] == "carry-over"
    assert "no washout preceded the blocks, and 2 cycles cannot estimate" in result.reason
    assert "run 3" in result.reason and "design.washout" in result.reason
    assert "nan" not in result.reason
    washed = Synth(speed=faster(1.5), boot=boot)
    assert only(verdict_of(tmp_path / "washed", gate, washed, cycles=2)).passed
    three = only(verdict_of(tmp_path / "three", gate, bare, cycles=3))
    assert three.passed, three.reason


def test_better_fails_within_noise_on_an_a_a_campaign(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}", cycles=2))
    assert not result.passed
    assert "within noise" in result.reason


def _inconsistent(run: Run) -> float:
    # Cycle effects +30%, −5%, +25%: large on average, but the CI includes 1.
    if run["cell"] == "control":
        return 100.0
    return 100.0 * (1.30, 0.95, 1.25)[run["cycle"]]


def test_better_fails_inconclusive_and_says_how_many_cycles(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}",
                             Synth(speed=_inconsistent), cycles=3))  # fmt: skip
    assert not result.passed
    assert ": inconclusive" in result.reason
    assert "cycles would be needed" in result.reason
    row = result.evidence["treat/warm"]
    assert row["ci_low"] < 1 < row["ci_high"]


def test_an_inconclusive_gate_is_undecided_not_failed_everywhere(tmp_path: Path) -> None:
    verdict = verdict_of(tmp_path / "undecided", "  - {kind: better, metric: decode_tok_s}",
                         Synth(speed=_inconsistent), cycles=3)  # fmt: skip
    assert only(verdict).undecided and not only(verdict).passed
    assert (verdict.outcome, verdict.word, verdict.exit_code()) == ("undecided", "UNDECIDED", 1)
    write_verdict(verdict, tmp_path)
    assert json.loads((tmp_path / "verdict.json").read_text())["outcome"] == "undecided"
    failure = ET.parse(tmp_path / "verdict.junit.xml").getroot().find(".//failure")
    assert failure is not None and failure.get("type") == "undecided"
    assert str(failure.get("message")).startswith("undecided (inconclusive, not worse)")
    # Worse is decided: failed, not undecided.
    worse = verdict_of(tmp_path / "worse", "  - {kind: better, metric: decode_tok_s}",
                       Synth(speed=faster(0.7)), cycles=2)  # fmt: skip
    assert not only(worse).undecided and (worse.outcome, worse.word) == ("fail", "FAIL")


def _drifting(run: Run) -> float:
    # The box slows 10% per run, linearly in log speed, on top of a real 30% speed-up: the
    # mirrored order cancels linear drift, and the bias the flagged drift could cause (½|outer −
    # inner| = 10% a cycle) cannot explain a 30% effect.
    index = int(run["run_id"][:4])
    return 100.0 * math.exp(-0.10 * index) * (1.3 if run["cell"] == "treat" else 1.0)


def _drifting_small(run: Run) -> float:
    # The box slows 4% per run on top of a 5% speed-up: linear drift cancels in every cycle, and
    # the trend the other cycles show is taken out of the drift bound (issue 26: the bound once
    # charged ½|outer − inner| = 4% and called this confounded).
    index = int(run["run_id"][:4])
    return 100.0 * math.exp(-0.04 * index) * (1.05 if run["cell"] == "treat" else 1.0)


def test_better_survives_linear_drift_it_cannot_be_explained_by(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path,
        _card_text("  - {kind: better, metric: decode_tok_s}", cycles=3),
        Synth(speed=_drifting),
    )
    analysis = analyze_campaign(campaign.root)
    assert {f["kind"] for f in analysis.flags if f["metric"] == "decode_tok_s"} == {"DRIFT"}
    result = only(evaluate_gates(analysis))
    assert result.passed, result.reason
    assert result.evidence["treat/warm"]["label"] == "better"
    assert result.evidence["treat/warm"]["ratio"] == pytest.approx(1.3, rel=0.01)


def test_linear_drift_is_not_charged_against_a_small_effect(tmp_path: Path) -> None:
    campaign = build_campaign(
        tmp_path,
        _card_text("  - {kind: better, metric: decode_tok_s}", cycles=3),
        Synth(speed=_drifting_small),
    )
    analysis = analyze_campaign(campaign.root)
    assert analysis.flags  # the drift is on record
    result = only(evaluate_gates(analysis))
    assert result.passed, result.reason
    assert result.evidence["treat/warm"]["label"] == "better"


@pytest.mark.parametrize("status", ["failed", None])
def test_better_fails_closed_on_a_failed_or_missing_run(tmp_path: Path, status: str | None) -> None:
    # 0007 is a treat run of cycle 1; the other two cycles alone would say *better*.
    synth = Synth(
        speed=faster(1.5),
        status=lambda run: status if run["run_id"].startswith("0007") else RUN_OK,
    )
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}", synth, cycles=2))
    assert not result.passed
    label = status or "missing"
    assert result.reason == f"treat/warm: runs not complete (0007-treat-c1-warm-s3-r0 ({label}))"


def test_better_fails_closed_without_any_comparison(tmp_path: Path) -> None:
    # The treatment never ran at all: no cycle is complete, so nothing was compared.
    synth = Synth(status=lambda run: None if run["cell"] == "treat" else RUN_OK)
    verdict = verdict_of(tmp_path, "  - {kind: better, metric: tpot_p95_ms}", synth)
    assert not only(verdict).passed and "runs not complete" in only(verdict).reason
    # With no run of the treatment in the plan's comparison, the gate still never passes.
    assert verdict.incomplete_runs and not verdict.passed


def test_better_fails_when_only_one_cycle_ran(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: decode_tok_s}",
                             Synth(speed=faster(1.5)), cycles=1))  # fmt: skip
    assert not result.passed
    assert "over 1 cycle: inconclusive" in result.reason
    assert result.evidence["treat/warm"]["ci_low"] is None


def _no_misses_for_treat(run: Run) -> dict[str, float]:
    # A runtime that counts hits but not misses: the treatment's hit rate cannot be formed.
    out = dict(COUNTERS)
    if run["cell"] == "treat":
        del out["misses"]
    return out


def test_hit_rate_without_a_misses_counter_is_not_recorded() -> None:
    assert counter_metrics({"delta": {"hits": 600.0}})["hit_rate"] is None
    assert counter_metrics({"delta": {"hits": 0.0, "misses": 0.0}})["hit_rate"] is None
    assert counter_metrics({"delta": {"hits": 600.0, "misses": 0.0}})["hit_rate"] == 1.0
    assert counter_metrics({"delta": {"hits": 600.0, "misses": 200.0}})["hit_rate"] == 0.75


def test_better_hit_rate_fails_closed_without_misses(tmp_path: Path) -> None:
    synth = Synth(counters=_no_misses_for_treat)
    result = only(verdict_of(tmp_path, "  - {kind: better, metric: hit_rate}", synth, cycles=2))
    assert not result.passed
    assert result.reason.startswith("treat/warm: hit_rate was not recorded for runs 0001-treat-")
    assert "so the cell cannot be compared on it" in result.reason
    # The control reports both counters: only the treatment's runs are named.
    assert "control" not in result.reason.split(" (")[0]


# ---- survives ----------------------------------------------------------------------------------


SURVIVES = (
    "  - {kind: better, metric: decode_tok_s}\n  - {kind: survives, cache_states: [warm, cold]}"
)


def test_survives_when_better_in_every_cache_state(tmp_path: Path) -> None:
    verdict = verdict_of(
        tmp_path, SURVIVES, Synth(speed=faster(1.4)), states="[warm, cold]", cycles=2
    )
    better, survives = verdict.gates
    assert better.passed and survives.passed, survives.reason
    assert "better in every state (warm, cold) on decode_tok_s" in survives.reason
    assert set(survives.evidence["decode_tok_s"]) == {"treat/warm", "treat/cold"}


def test_survives_fails_when_better_in_only_one_state(tmp_path: Path) -> None:
    def warm_only(run: Run) -> float:
        boost = run["cell"] == "treat" and run["cache_state"] == "warm"
        return 100.0 * (1.4 if boost else 1.0)

    verdict = verdict_of(
        tmp_path, SURVIVES, Synth(speed=warm_only), states="[warm, cold]", cycles=2
    )
    survives = verdict.gates[1]
    assert not survives.passed
    assert "decode_tok_s treat/cold:" in survives.reason and "within noise" in survives.reason
    assert survives.evidence["decode_tok_s"]["treat/warm"]["label"] == "better"


def test_survives_with_explicit_metrics_and_no_metric(tmp_path: Path) -> None:
    gates = (
        "  - {kind: survives, cache_states: [warm, cold], metrics: [tpot_p50_ms, decode_tok_s]}\n"
        "  - {kind: survives, cache_states: [warm]}"
    )
    verdict = verdict_of(tmp_path, gates, Synth(speed=faster(1.4)), states="[warm, cold]", cycles=2)
    explicit, bare = verdict.gates
    assert explicit.passed, explicit.reason
    assert set(explicit.evidence) == {"tpot_p50_ms", "decode_tok_s"}
    assert not bare.passed and "no metric to check" in bare.reason


# ---- quality -----------------------------------------------------------------------------------


SUITE = [
    {"id": "q-ok", "domain": "en-prose", "check": {"kind": "regex", "pattern": r"^\s*OK"}},
    {"id": "q-json", "domain": "json", "check": {"kind": "json_valid"}},
    {
        "id": "q-schema",
        "domain": "json",
        "check": {
            "kind": "json_schema",
            "schema": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "size": {"type": "integer"},
                    "mode": {"enum": ["fast", "slow"]},
                },
            },
        },
    },
]
GOOD = {"q-ok": " OK.", "q-json": "[1, 2]", "q-schema": '{"name": "x", "size": 3, "mode": "fast"}'}


def _quality_campaign(
    root: Path, gates: str, answers: Callable[[Run, str], str], *, suite: bool = True
) -> Verdict:
    ids = tuple(str(p["id"]) for p in SUITE)
    campaign = build_campaign(root, _card_text(gates), Synth(quality=answers, quality_ids=ids))
    if suite:
        # The suite as the harness writes it: its digest journalled (harness.formats.seal).
        write_sealed_json(campaign.root, campaign.root / "quality.json", {"prompts": SUITE})
    else:
        (campaign.root / "quality.json").unlink()
    return evaluate_gates(analyze_campaign(campaign.root))


def _answers(bad: dict[str, str], cells: tuple[str, ...] = ("treat",)) -> Callable[[Run, str], str]:
    def answer(run: Run, prompt_id: str) -> str:
        if run["cell"] in cells and prompt_id in bad:
            return bad[prompt_id]
        return GOOD.get(prompt_id, "")

    return answer


def test_quality_passes_every_check_kind(tmp_path: Path) -> None:
    # The suite's prompt ids are in quality.json; the run's requests carry them.
    result = only(_quality_campaign(tmp_path, "  - {kind: quality, min_pass: 3/3}", _answers({})))
    assert result.passed, result.reason
    assert result.evidence == {
        "control": {"passed": 3, "n": 3, "required": 3},
        "treat": {"passed": 3, "n": 3, "required": 3},
    }


@pytest.mark.parametrize(
    ("prompt_id", "bad"),
    [
        ("q-ok", "Sure: OK"),  # the regex is anchored
        ("q-json", "{'single': 'quotes'}"),
        ("q-schema", "not json"),
        ("q-schema", '{"size": 3}'),  # required name missing
        ("q-schema", '{"name": 7}'),  # wrong type
        ("q-schema", '{"name": "x", "size": 1.5}'),  # integer expected
        ("q-schema", '{"name": "x", "size": true}'),  # a boolean is not an integer
        ("q-schema", '{"name": "x", "mode": "medium"}'),  # not in the enum
        ("q-schema", '["name"]'),  # not an object
    ],
)
def test_quality_fails_a_check(tmp_path: Path, prompt_id: str, bad: str) -> None:
    verdict = _quality_campaign(
        tmp_path, "  - {kind: quality, min_pass: 3/3}", _answers({prompt_id: bad})
    )
    result = only(verdict)
    assert not result.passed
    assert result.reason == f"treat: 2/3 pass, need 3 (failing: {prompt_id})"
    assert result.evidence["control"]["passed"] == 3


@pytest.mark.parametrize(
    ("schema", "answer", "matches"),
    [
        ({"type": "number"}, "1.5", True),
        ({"type": "number"}, "3", True),
        ({"type": "number"}, "false", False),  # JSON booleans are not numbers
        ({"type": "integer"}, "true", False),
        ({"type": "boolean"}, "true", True),
        ({"enum": [1]}, "true", False),  # nor equal to 1
        ({"enum": [1]}, "1.0", True),  # JSON numbers compare by value
        ({"enum": [[0, 1]]}, "[false, true]", False),
        ({"type": "int"}, "3", False),  # an unknown type accepts nothing
    ],
)
def test_json_schema_checks_keep_booleans_apart(
    schema: dict[str, Any], answer: str, matches: bool
) -> None:
    assert check_passes({"kind": "json_schema", "schema": schema}, answer) is matches


def test_quality_fails_closed_on_an_invalid_check_in_the_campaign(tmp_path: Path) -> None:
    # A quality.json from before checks were validated: a regex without a pattern matched all.
    ids = tuple(str(p["id"]) for p in SUITE)
    campaign = build_campaign(
        tmp_path, _card_text("  - {kind: quality, min_pass: 1}"),
        Synth(quality=_answers({}), quality_ids=ids),
    )  # fmt: skip
    suite = [{**SUITE[0], "check": {"kind": "regex"}}, *SUITE[1:]]
    write_sealed_json(campaign.root, campaign.root / "quality.json", {"prompts": suite})
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed and not result.incomplete
    assert result.reason == (
        "quality check of prompt q-ok is invalid: check.pattern: a regex check needs a `pattern` "
        "(a regular expression string); without one it would match every answer"
    )


def test_quality_k_of_n_tolerates_a_failure(tmp_path: Path) -> None:
    answers = _answers({"q-ok": "no"}, cells=("control", "treat"))
    result = only(_quality_campaign(tmp_path, "  - {kind: quality, min_pass: 2}", answers))
    assert result.passed, result.reason


def test_quality_vs_is_a_no_regression_floor(tmp_path: Path) -> None:
    gate = "  - {kind: quality, min_pass: 1/3, vs: control}"
    regressed = only(_quality_campaign(tmp_path / "a", gate, _answers({"q-json": "oops"})))
    assert not regressed.passed
    assert regressed.reason == "treat: 2/3 pass, need 3 (control passes 3) (failing: q-json)"
    assert regressed.evidence["treat"]["reference"] == {"cell": "control", "passed": 3}
    # When the control also fails it, the treatment only has to match the control.
    both = _answers({"q-json": "oops"}, cells=("control", "treat"))
    held = only(_quality_campaign(tmp_path / "b", gate, both))
    assert held.passed, held.reason
    assert list(held.evidence) == ["treat"]


def test_quality_fails_closed_without_a_suite_or_answers(tmp_path: Path) -> None:
    # The suite the campaign started with, deleted: the directory no longer verifies.
    with pytest.raises(VerificationError, match=r"quality\.json: missing, but the journal sealed"):
        _quality_campaign(tmp_path / "a", "  - {kind: quality, min_pass: 1}", _answers({}),
                          suite=False)  # fmt: skip
    # A suite on disk but no quality answers in the runs: nothing passes.
    campaign = build_campaign(tmp_path / "b", _card_text("  - {kind: quality, min_pass: 1}"),
                              Synth())  # fmt: skip
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed and "0/2 pass, need 1" in result.reason


@pytest.mark.parametrize(
    ("gate", "missing", "who"),
    [
        ("{kind: quality, min_pass: 3/3}", "0002", "treat: runs not complete (0002-treat-"),
        ("{kind: quality, min_pass: 1, vs: control}", "0000", "reference control: runs not"),
    ],
)
def test_quality_fails_closed_on_a_missing_run(
    tmp_path: Path, gate: str, missing: str, who: str
) -> None:
    ids = tuple(str(p["id"]) for p in SUITE)
    synth = Synth(
        quality=_answers({}),
        quality_ids=ids,
        status=lambda run: None if run["run_id"].startswith(missing) else RUN_OK,
    )
    campaign = build_campaign(tmp_path, _card_text(f"  - {gate}", cycles=2), synth)
    write_sealed_json(campaign.root, campaign.root / "quality.json", {"prompts": SUITE})
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert not result.passed
    assert who in result.reason and "(missing)" in result.reason
    assert result.incomplete


# ---- soak --------------------------------------------------------------------------------------


def _soak(root: Path, gate: str, synth: Synth) -> GateResult:
    text = _card_text(f"  - {gate}", cycles=1, cells=("soak",), order="sequential")
    campaign = build_campaign(root, text, synth)
    return only(evaluate_gates(analyze_campaign(campaign.root)))


def _ring(steps: int = 601, capacity: int = 4096, spike_ms: float = 5.0) -> Synth:
    return Synth(ring=lambda run: (steps, capacity, spike_ms))


def test_soak_passes(tmp_path: Path) -> None:
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 60, itl_p99_ms_max: 6}", _ring())
    assert result.passed, result.reason
    run = result.evidence["0000-soak-c0-warm-s0-r0"]
    assert run["duration_s"] == pytest.approx(60.005)
    assert run["lost_ring_records"] == 0 and run["itl_p99_ms"] == pytest.approx(5.0)


def test_soak_too_short_fails(tmp_path: Path) -> None:
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 90}", _ring())
    assert not result.passed
    assert result.reason == "0000-soak-c0-warm-s0-r0: ran 60 s of 90 s"


def test_soak_lost_ring_records_fail(tmp_path: Path) -> None:
    # A 500-slot ring written 601 times: 101 records were overwritten before anyone read them.
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 40}", _ring(capacity=500))
    assert not result.passed
    assert result.reason == "0000-soak-c0-warm-s0-r0: 101 ring records lost"
    loose = _soak(
        tmp_path / "b",
        "{kind: soak, min_duration_s: 40, max_lost_records: 101}",
        _ring(capacity=500),
    )
    assert loose.passed, loose.reason


def test_soak_inter_token_p99_over_bound_fails(tmp_path: Path) -> None:
    # 601 steps of 5 ms but eight of 80 ms: p99 (linear interpolation) lands on the slow ones.
    def ring(run: Run) -> tuple[int, int, float]:
        return (601, 4096, 80.0)

    within = _soak(tmp_path / "a", "{kind: soak, min_duration_s: 60, itl_p99_ms_max: 6}",
                   Synth(ring=ring))  # fmt: skip
    # One spike is under the 1% tail, so p99 stays at 5 ms.
    assert within.passed, within.reason
    slow = _soak(
        tmp_path / "b", "{kind: soak, min_duration_s: 60, itl_p99_ms_max: 4}", Synth(ring=ring)
    )
    assert not slow.passed
    assert slow.reason == "0000-soak-c0-warm-s0-r0: inter-token p99 5.00 ms > 4 ms"


def test_soak_without_a_ring_or_rss_fails_closed(tmp_path: Path) -> None:
    # run.json spans 8 s and says 0 records lost; neither is evidence without the ring (the span
    # includes the boot, and nothing counted the losses).
    for gate in (
        "{kind: soak, min_duration_s: 5}",
        "{kind: soak, min_duration_s: 5, itl_p99_ms_max: 50}",
    ):
        no_ring = _soak(tmp_path / gate[-3:-1], gate, Synth())
        assert not no_ring.passed and not no_ring.incomplete
        assert no_ring.reason == (
            "0000-soak-c0-warm-s0-r0: no ring records: duration, lost records and inter-token "
            "p99 cannot be shown (the runtime's ring was not collected)"
        )
        assert no_ring.evidence["0000-soak-c0-warm-s0-r0"]["duration_s"] is None
    rss = _soak(tmp_path / "b", "{kind: soak, min_duration_s: 5, rss_growth_pct_max: 10}", _ring())
    assert not rss.passed
    assert "RSS was not sampled, so growth cannot be bounded" in rss.reason


@pytest.mark.parametrize("status", ["failed", None])
def test_soak_that_crashed_or_never_ran_fails(tmp_path: Path, status: str | None) -> None:
    result = _soak(tmp_path, "{kind: soak, min_duration_s: 5}", Synth(status=lambda run: status))
    assert not result.passed
    assert result.reason.startswith(f"0000-soak-c0-warm-s0-r0: {status or 'missing'}: ")


# ---- lockstep ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate", "divergent", "passed"),
    [
        ("{kind: lockstep}", 0, True),
        ("{kind: lockstep}", 3, False),
        ("{kind: lockstep, max_divergent: 3}", 3, True),
        ("{kind: lockstep, max_divergent: 2}", 3, False),
    ],
)
def test_lockstep(tmp_path: Path, gate: str, divergent: int, passed: bool) -> None:
    campaign = build_campaign(tmp_path, _card_text(f"  - {gate}", cycles=1), Synth())
    write_json_atomic(campaign.root / "lockstep.json", {"decisions": 900, "divergent": divergent})
    result = only(evaluate_gates(analyze_campaign(campaign.root)))
    assert result.passed is passed
    assert result.reason == f"900 decisions, {divergent} divergent"


def test_lockstep_fails_closed_without_a_result(tmp_path: Path) -> None:
    result = only(verdict_of(tmp_path, "  - {kind: lockstep}", cycles=1))
    assert not result.passed
    assert "no lockstep result" in result.reason and "harness simulate --lockstep" in result.reason


@pytest.mark.parametrize("divergent", [None, "3", True, 2.5])
def test_a_damaged_lockstep_record_is_bad_input_not_a_gate_result(
    tmp_path: Path, divergent: object
) -> None:
    campaign = build_campaign(tmp_path, _card_text("  - {kind: lockstep}", cycles=1), Synth())
    result = {"decisions": 900} | ({} if divergent is None else {"divergent": divergent})
    write_json_atomic(campaign.root / "lockstep.json", result)
    with pytest.raises(RecordError, match=r"lockstep\.json: `divergent` must be a count"):
        evaluate_gates(analyze_campaign(campaign.root))


def test_a_damaged_quality_record_names_its_field(tmp_path: Path) -> None:
    campaign = build_campaign(tmp_path, _card_text("  - {kind: quality, min_pass: 1}"), Synth())
    path = campaign.root / "quality.json"
    write_sealed_json(campaign.root, path, {"prompts": [{"check": {}}]})
    with pytest.raises(RecordError, match=r"quality\.json: `prompts` must be a list"):
        evaluate_gates(analyze_campaign(campaign.root))


# ---- verdict, JUnit and the CLI ------------------------------------------------------------------


MIXED = (
    "  - {kind: exact_outputs}\n"
    "  - {kind: counter, counter: swaps, max: 0}\n"
    "  - {kind: better, metric: decode_tok_s}\n"
    "  - {kind: lockstep}"
)


def test_verdict_json_and_junit(tmp_path: Path) -> None:
    campaign = build_campaign(tmp_path, _card_text(MIXED, cycles=2), Synth(speed=faster(1.5)))
    verdict = evaluate_gates(analyze_campaign(campaign.root))
    write_verdict(verdict, campaign.root)

    data = json.loads((campaign.root / "verdict.json").read_text(), parse_constant=_reject_constant)
    assert data["schema_version"] == 1 and data["campaign"] == "gates"
    assert data["passed"] is False and data["incomplete_runs"] == []
    assert [(g["kind"], g["passed"]) for g in data["gates"]] == [
        ("exact_outputs", True),
        ("counter", True),
        ("better", True),
        ("lockstep", False),
    ]
    assert data["gates"][2]["evidence"]["treat/warm"]["label"] == "better"

    root = ET.parse(campaign.root / "verdict.junit.xml").getroot()
    assert root.tag == "testsuites"
    (suite,) = list(root)
    assert suite.get("name") == "harness.gates"
    assert suite.get("tests") == "4" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases] == [
        "gate.exact_outputs",
        "gate.counter",
        "gate.better",
        "gate.lockstep",
    ]
    assert cases[2].get("name") == "better decode_tok_s"
    failures = [c for c in cases if c.find("failure") is not None]
    assert [c.get("classname") for c in failures] == ["gate.lockstep"]
    failure = failures[0].find("failure")
    assert failure is not None and "no lockstep result" in (failure.get("message") or "")
    assert failure.text == verdict.gates[3].reason
    passing = cases[0].find("system-out")
    assert passing is not None and "outputs match control" in (passing.text or "")


def _reject_constant(name: str) -> None:
    raise AssertionError(f"verdict.json holds {name}, which is not JSON")


def test_a_card_without_gates_never_passes(tmp_path: Path) -> None:
    verdict = verdict_of(tmp_path, "  []", Synth(speed=faster(1.5)))
    assert verdict.gates == [] and not verdict.passed


def test_verdict_lists_incomplete_runs(tmp_path: Path) -> None:
    synth = Synth(status=lambda run: {"0001": "failed", "0004": None}.get(run["run_id"][:4], "ok"))
    verdict = verdict_of(
        tmp_path, "  - {kind: counter, counter: failed_runs, max: 2}", synth, cycles=2
    )
    assert verdict.incomplete_runs == ["0001-treat-c0-warm-s1-r0", "0004-treat-c1-warm-s0-r0"]
    assert only(verdict).passed  # two incomplete runs are within this gate's bound


def test_a_verdict_with_incomplete_runs_never_passes(tmp_path: Path) -> None:
    # The gate tolerates two failed runs, but the campaign is still incomplete.
    synth = Synth(status=lambda run: "failed" if run["run_id"].startswith("0001") else RUN_OK)
    verdict = verdict_of(tmp_path, "  - {kind: counter, counter: failed_runs, max: 2}", synth)
    assert only(verdict).passed and not verdict.passed
    assert verdict.exit_code() == 3
    write_verdict(verdict, tmp_path)
    assert json.loads((tmp_path / "verdict.json").read_text())["passed"] is False
    cases = ET.parse(tmp_path / "verdict.junit.xml").getroot().findall(".//testcase")
    complete = [c for c in cases if c.get("classname") == "campaign.complete"]
    assert len(complete) == 1
    failure = complete[0].find("failure")
    assert failure is not None and "0001-treat-c0-warm-s1-r0" in (failure.text or "")


@pytest.mark.slow
def test_cli_gate_exit_codes(tmp_path: Path) -> None:
    # One subprocess per exit code: each one also renders the HTML report, which takes seconds.
    gates = "  - {kind: better, metric: decode_tok_s}\n  - {kind: counter, counter: swaps, max: 0}"

    def incomplete(run: Run) -> str | None:
        return {"0002": None, "0005": "failed"}.get(run["run_id"][:4], RUN_OK)

    cases = {
        "pass": (Synth(speed=faster(1.5)), 0, "verdict: PASS"),
        "fail": (Synth(speed=faster(0.7)), 1, "worse"),
        "incomplete": (Synth(speed=faster(1.5), status=incomplete), 3, "runs not complete"),
    }
    for name, (synth, code, shown) in cases.items():
        campaign = build_campaign(tmp_path / name, _card_text(gates, cycles=2), synth)
        result = run_cli("gate", str(campaign.root))
        assert result.code == code, f"{name}: {result.stdout}\n{result.stderr}"
        assert shown in result.stdout, result.stdout
        assert "Traceback" not in result.stderr
        verdict = json.loads((campaign.root / "verdict.json").read_text())
        assert verdict["passed"] is (code == 0)
        assert (campaign.root / "verdict.junit.xml").is_file()
    verdict = json.loads((campaign.root / "verdict.json").read_text())
    assert verdict["incomplete_runs"] == ["0002-treat-c0-warm-s2-r0", "0005-control-c1-warm-s1-r0"]


@pytest.mark.slow
def test_cli_gate_never_exits_0_with_incomplete_runs(tmp_path: Path) -> None:
    failed_run = Synth(status=lambda run: "failed" if run["run_id"].startswith("0001") else RUN_OK)
    cases = {
        # Every gate passes on the runs that completed: still not a pass, runs are missing (3).
        "incomplete": ("  - {kind: exact_outputs, vs: control, cells: [control]}", 3),
        # A gate that fails on complete data is a failure (1), whatever else is missing.
        "also-failed": ("  - {kind: counter, counter: swaps, max: 0, cells: [control]}\n"
                        "  - {kind: lockstep}", 1),
    }  # fmt: skip
    for name, (gates, code) in cases.items():
        campaign = build_campaign(tmp_path / name, _card_text(gates, cycles=2), failed_run)
        result = run_cli("gate", str(campaign.root))
        assert result.code == code, f"{name}: {result.stdout}\n{result.stderr}"
        assert "verdict: FAIL" in result.stdout
        assert "0001-treat-c0-warm-s1-r0" in result.stdout, result.stdout
        assert json.loads((campaign.root / "verdict.json").read_text())["passed"] is False


def test_cli_gate_on_a_folder_that_is_not_a_campaign_is_bad_input(tmp_path: Path) -> None:
    result = run_cli("gate", str(tmp_path))
    assert result.code == 2
    assert "not a campaign directory (no plan.json)" in result.stderr
