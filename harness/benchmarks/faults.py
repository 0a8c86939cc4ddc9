"""``harness bench faults``: does every planted fault reach a label that blocks it, campaign after
campaign, and does a clean change never?

Issue 55's figures. Each campaign is a real ``harness run`` on the reference runtime (one
cycle, two boots a cell, 2 layers of 8 experts with 4 hot, 12 bytes an output), its weights
seed and design seed varied from campaign to campaign. Per seed, two cards against a frozen
control. The faults' card (20 held-out prompts):

* ``adaptive``: an adaptive policy, a clean change (it takes effect and keeps the outputs);
* ``empty``: 8 hot slots under ``fault: empty-hot`` (reported as set, none resident);
* ``ignored``: an adaptive policy under ``fault: ignore-policy`` (reported, never run);
* ``swapped``: ``fault: swap-weights`` (every 5th expert loaded gets its neighbour's weights);
* ``nudged``: ``fault: scale-logits`` (every logit times 1.1: each greedy output kept, only the
  log-probabilities the card asks for show it).

The lossy modes' card (60 prompts, each asking for its top 5 log-probabilities), modes whose
divergence is fixed by construction (:mod:`harness.refbox.lossy`), whatever the weights:

* ``fine`` and ``coarse``: 0.5% and 10% of bytes flipped to the runner-up (mean prefix
  agreement 0.968 and 0.538), declared ``lossy: {margin: 0.2}``;
* ``fine_kl`` and ``coarse_kl``: 0.0005 and 0.3 of each distribution moved onto its runner-up
  (a KL of at most 0.0005 nats, and at least 0.047), declared ``lossy: {metric: kl, margin:
  0.003}``.

Figures, each the share of campaigns (target 1 for the faults and the clean change, 0.95 for
the lossy pair), beside the baseline the same campaigns give with the statistics alone (the
comparisons' ``raw_label``: what the harness said before these checks existed):

* each fault labelled *not engaged* or *corrupt* on every comparison, and none *better*,
  *worse* or *within noise*;
* the clean change labelled neither;
* each lossy pair *equivalent* and *not equivalent*, with the endpoint's measured means beside
  what the construction puts them at.

Full size: 20 seeds (40 campaigns), two at a time (the labels checked do not read timing).
``--quick``: 1 seed, which ``tests/analyze/test_faults.py`` runs and then reads whole (record,
report, verdict).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.analyze.campaign import analyze_campaign
from harness.analyze.equivalence import EquivalenceRow
from harness.benchmarks import Figure
from harness.refbox.lossy import flip_agreement, mixed_kl

_POOL = Path(__file__).resolve().parents[2] / "campaigns" / "prompts" / "mixed.jsonl"
# The faults' campaigns send 20 held-out prompts; the lossy modes' 60, which the interval for
# shares (harness.stats.bounded) needs to tell a mean agreement of 0.97 (0.5% of bytes flipped)
# from a floor of 0.8 in 99.5% of campaigns, and 0.54 (10%) from it in all (simulated from the
# flips' geometric law); at 20 prompts, 46% and 73%.
_FAULT_PROMPTS = 20
_LOSSY_PROMPTS = 60
_MAX_TOKENS = 12
_BASE = {"expert_bytes": 0, "policy": "frozen", "hot_slots": 4, "drain_every": 8}
_FAULT_CELLS: dict[str, dict[str, object]] = {
    "frozen": {},
    "adaptive": {"policy": "adaptive"},
    "empty": {"hot_slots": 8, "fault": "empty-hot"},
    "ignored": {"policy": "adaptive", "fault": "ignore-policy"},
    "swapped": {"fault": "swap-weights"},
    "nudged": {"fault": "scale-logits"},
}
_LOSSY_CELLS: dict[str, dict[str, object]] = {
    "frozen": {},
    "fine": {"flip_pct": 0.5},
    "coarse": {"flip_pct": 10},
    "fine_kl": {"runner_up_mass": 0.0005},
    "coarse_kl": {"runner_up_mass": 0.3},
}
_LOSSY = {
    "fine": {"margin": 0.2},
    "coarse": {"margin": 0.2},
    "fine_kl": {"metric": "kl", "margin": 0.003},
    "coarse_kl": {"metric": "kl", "margin": 0.003},
}


# What each lossy mode's construction puts the endpoint at (harness.refbox.lossy), whatever the
# weights: a mean prefix agreement over 12-byte outputs, a per-position KL's bounds in nats.
def _truth(knobs: dict[str, object]) -> str:
    if "flip_pct" in knobs:
        return f"agreement {flip_agreement(float(str(knobs['flip_pct'])), _MAX_TOKENS):.3f}"
    mass = float(str(knobs["runner_up_mass"]))
    return f"KL in [{mixed_kl(0.5, mass):.2g}, {-math.log(1 - mass):.2g}]"


TRUTH = {cell: _truth(knobs) for cell, knobs in _LOSSY_CELLS.items() if knobs}
_FAULTS = ("empty", "ignored", "swapped", "nudged")
_BLOCKED = {"not engaged", "corrupt"}
_DECIDED = {"better", "worse", "within noise"}


def card_text(seed: int, pool: Path, *, lossy: bool = False) -> str:
    """The campaign card of one seed (weights and design): the faults' treatments against
    ``frozen``, or (``lossy``) the lossy modes'."""
    cells = {}
    for name, knobs in (_LOSSY_CELLS if lossy else _FAULT_CELLS).items():
        cell: dict[str, object] = {
            "env": {"REFBOX_LAYERS": "2", "REFBOX_EXPERTS": "8"},
            "knobs": {**_BASE, "seed": seed, **knobs},
        }
        if name in _LOSSY:
            cell["lossy"] = _LOSSY[name]
        cells[name] = cell
    card = {
        "campaign": f"{'lossy' if lossy else 'faults'}-{seed}",
        "box": "local",
        "runtime": "refbox",
        "prompts": {"pools": [str(pool)], "heldout": {"split": "heldout"}},
        "workload": {
            "max_tokens": _MAX_TOKENS,
            "warmup_requests": 1,
            "passes": 1,
            "logprobs": 5,
        },
        "cells": cells,
        "control": "frozen",
        # The lossy modes' endpoint reads outputs, not speed: no washout requests before a block.
        "design": {
            "order": "abba",
            "cycles": 1,
            "cache_states": ["warm"],
            "seed": seed,
            **({"washout": 0} if lossy else {}),
        },
        "gates": [{"kind": "better", "metric": "decode_tok_s"}],
    }
    return yaml.safe_dump(card, sort_keys=False)


@dataclass(frozen=True)
class _Outcome:
    labels: dict[str, set[str]]  # cell -> its comparisons' labels
    raw: dict[str, set[str]]  # cell -> what the statistics alone said
    equivalence: dict[str, EquivalenceRow]  # lossy cell -> its endpoint
    text_caught: set[str]  # cells a boot of which differed from the control's in its text


def _campaign(folder: Path, seed: int, pool: Path, lossy: bool) -> _Outcome:
    card = folder / f"{'lossy' if lossy else 'faults'}-{seed}.yaml"
    card.write_text(card_text(seed, pool, lossy=lossy), encoding="utf-8")
    reports = folder / f"reports-{card.stem}"
    argv = [sys.executable, "-m", "harness", "run", str(card), "--reports", str(reports)]
    done = subprocess.run([*argv, "--quiet"], capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{card.name}: harness run exited {done.returncode}: {done.stderr}")
    [root] = [p.parent for p in reports.glob("*/*/verdict.json")]
    analysis = analyze_campaign(root, predictions=False)
    labels: dict[str, set[str]] = {}
    raw: dict[str, set[str]] = {}
    for item in analysis.comparisons:
        labels.setdefault(item.cell, set()).add(str(item.comparison.label))
        raw.setdefault(item.cell, set()).add(str(item.comparison.raw_label))
    corrupt = analysis.canaries.corrupt if analysis.canaries else ()
    text = {c.cell for c in corrupt if c.unit != "log-probability"}
    return _Outcome(labels, raw, {r.cell: r for r in analysis.equivalence}, text)


def _pool(folder: Path, name: str, count: int) -> Path:
    """A pool of ``count`` prompts of mixed.jsonl, held-out ones first, all marked held out."""
    rows = [json.loads(x) for x in _POOL.read_text(encoding="utf-8").splitlines() if x.strip()]
    rows.sort(key=lambda r: r.get("split") != "heldout")
    pool = folder / name
    lines = [json.dumps({**r, "split": "heldout"}) for r in rows[:count]]
    pool.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return pool


def _share(hits: list[bool]) -> float:
    return sum(hits) / len(hits) if hits else float("nan")


FIRST_SEED = 7200


def run_bench(quick: bool = False, folder: Path | None = None) -> list[Figure]:
    """Run the campaigns (in ``folder``, default a new temporary one: ``reports-<card>``) and
    count, per planted change, the campaigns whose labels block it."""
    count = 1 if quick else 20
    folder = folder or Path(tempfile.mkdtemp(prefix="harness-bench-faults-"))
    pools = {
        False: _pool(folder, "faults-pool.jsonl", _FAULT_PROMPTS),
        True: _pool(folder, "lossy-pool.jsonl", _LOSSY_PROMPTS),
    }
    jobs = [(s, lossy) for s in range(FIRST_SEED, FIRST_SEED + count) for lossy in (False, True)]
    with ThreadPoolExecutor(max_workers=2) as workers:
        done = list(workers.map(lambda j: _campaign(folder, j[0], pools[j[1]], j[1]), jobs))
    outcomes, lossy_outcomes = done[0::2], done[1::2]
    figures = [*_fault_figures(outcomes, count), *_lossy_figures(lossy_outcomes, count)]
    (folder / "outcomes.json").write_text(
        json.dumps([{k: sorted(v) for k, v in o.labels.items()} for o in done], indent=1),
        encoding="utf-8",
    )
    return figures


def _fault_figures(outcomes: list[_Outcome], count: int) -> list[Figure]:
    figures = []
    for cell in _FAULTS:
        blocked = [
            bool(o.labels.get(cell))
            and o.labels[cell] <= _BLOCKED
            and not o.labels[cell] & _DECIDED
            for o in outcomes
        ]
        decided = [bool(o.raw.get(cell, set()) & _DECIDED) for o in outcomes]
        text = [cell in o.text_caught for o in outcomes]
        figures.append(
            Figure(
                name=f"{cell}: campaigns labelled not engaged or corrupt",
                value=_share(blocked),
                unit=f"of {count}",
                baseline=f"statistics alone decided {_share(decided):.2f} of them (better, "
                "worse or within noise)"
                + (f"; outputs' text alone caught {_share(text):.2f}" if cell == "nudged" else ""),
                target="1",
                passed=all(blocked),
            )
        )
    clean = [
        bool(o.labels.get("adaptive"))
        and not o.labels["adaptive"] & (_BLOCKED | {"not equivalent"})
        for o in outcomes
    ]
    figures.append(
        Figure(
            name="adaptive (a clean change): campaigns with none of those labels",
            value=_share(clean),
            unit=f"of {count}",
            target="1",
            passed=all(clean),
        )
    )
    return figures


def _lossy_figures(outcomes: list[_Outcome], count: int) -> list[Figure]:
    figures = []
    pairs = [("fine", "equivalent"), ("coarse", "not equivalent")]
    pairs += [("fine_kl", "equivalent"), ("coarse_kl", "not equivalent")]
    for cell, want in pairs:
        rows = [o.equivalence.get(cell) for o in outcomes]
        hits = [r is not None and r.verdict == want for r in rows]
        means = [r.mean for r in rows if r is not None]
        better = [bool(o.raw.get(cell, set()) & {"better"}) for o in outcomes]
        spread = f"{min(means):.4g}-{max(means):.4g}" if means else "none"
        figures.append(
            Figure(
                name=f"{cell}: campaigns whose equivalence endpoint reads {want}",
                value=_share(hits),
                unit=f"of {count}",
                baseline=f"measured {spread} (construction: {TRUTH[cell]}); the speed endpoint "
                f"alone read better in {_share(better):.2f}",
                target=">= 0.95",
                passed=_share(hits) >= 0.95,
            )
        )
    return figures
