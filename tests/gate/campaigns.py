"""Campaign directories built on disk for the gate tests, without booting anything.

Each is written the way ``harness run`` writes one — ``new_campaign_dir`` for the card, plan
and quality suite, then per run ``run.json``, ``requests.parquet``, ``chunks.parquet``,
``counters.json`` and (for soaks) ``ring.parquet`` read back from a real ring file — with
timings chosen so the statistics have a known answer; :func:`verdict_of` analyses and gates it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analyze.campaign import analyze_campaign
from harness.card import load_card
from harness.card.phase_length import washout_requests
from harness.drive.client import RequestResult
from harness.execute.campaign import new_campaign_dir
from harness.execute.frames import chunks_frame, requests_frame
from harness.formats.records import (
    RUN_OK,
    CampaignDir,
    RunRecord,
    write_json_atomic,
    write_parquet,
)
from harness.formats.ring import RingGeometry, RingWriter
from harness.formats.ring_read import read_ring
from harness.gate.evaluate import GateResult, Verdict, evaluate_gates
from harness.plan.build import build_plan
from tests.conftest import DATA

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
    box: Callable[[Run], str] = lambda run: "local"  # the box the run ran on (a fleet: several)
    tokens: int = TOKENS  # completion tokens of a scored request
    # Log-normal spread of a scored request's decode gaps (0: even); drawn per cycle and
    # prompt, so a cycle's blocks share it and only their speeds differ.
    gap_sd: float = 0.0


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


def card_text(
    gates: str,
    *,
    cycles: int = 1,
    states: str = "[warm]",
    cells: tuple[str, ...] = ("control", "treat"),
    order: str = "abba",
    boxes: str = "fixed",
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
        f"analysis: {{window_s: 0.5, converged_span_s: 1, hold_s: 0, boxes: {boxes}}}\n"
        f"gates:\n{gates}\n"
    )


def _request(
    prompt_id: str,
    speed: float,
    text: str,
    *,
    warmup: bool,
    phase: str,
    tokens: int = TOKENS,
    weights: np.ndarray | None = None,
) -> RequestResult:
    decode_s = (tokens - 1) / speed
    e2el = TTFT_S + decode_s
    if weights is None:
        gaps = [TTFT_S + decode_s * k / (tokens - 1) for k in range(tokens)]
    else:  # uneven gaps over the same decode time: the TPOT stays, the ITL tail spreads
        shares = np.concatenate([[0.0], np.cumsum(weights) / np.sum(weights)])
        gaps = [TTFT_S + decode_s * float(share) for share in shares]
    return RequestResult(
        prompt_id=prompt_id,
        domain=DOMAINS.get(prompt_id, "python"),
        phase=phase,
        phase_index=-1 if warmup else (-2 if phase == "quality" else 0),
        warmup=warmup,
        ok=True,
        ttft_s=TTFT_S,
        e2el_s=e2el,
        completion_tokens=tokens,
        prompt_tokens=12,
        chunk_times_s=gaps,
        chunk_chars=[1] * tokens,
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


def _gap_weights(synth: Synth, run: Run, position: int) -> np.ndarray | None:
    """A scored request's relative decode gaps (None: even), the same for a cycle's blocks."""
    if not synth.gap_sd:
        return None
    rng = np.random.default_rng((int(run["cycle"]), position))
    weights: np.ndarray = np.exp(rng.normal(0.0, synth.gap_sd, size=synth.tokens - 1))
    return weights


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
            for position, (prompt_id, factor) in enumerate(
                zip(HELDOUT, PROMPT_FACTOR, strict=True)
            ):
                noisy = speed * factor * math.exp(rng.normal(0.0, synth.noise_sd))
                text = synth.output(run, prompt_id)
                results.append(
                    _request(prompt_id, noisy, text, warmup=False, phase="main",
                             tokens=synth.tokens, weights=_gap_weights(synth, run, position))
                )  # fmt: skip
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
            box=synth.box(run),
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
    campaign = build_campaign(root, card_text(gates, **card), synth or Synth())
    return evaluate_gates(analyze_campaign(campaign.root))


def only(verdict: Verdict) -> GateResult:
    """The single gate of a one-gate card."""
    assert len(verdict.gates) == 1
    return verdict.gates[0]


def faster(ratio: float) -> Callable[[Run], float]:
    """Treatment ``ratio`` times the control's speed."""
    return lambda run: 100.0 * (ratio if run["cell"] != "control" else 1.0)


# ---- exact outputs ---------------------------------------------------------------------------
