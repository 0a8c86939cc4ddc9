"""``harness bench faults``: does every planted fault reach a label that blocks it, campaign after
campaign, and does a clean change never?

Issue 55's figures. Each campaign is a real ``harness run`` on the reference runtime (one
cycle, two boots a cell, 20 held-out prompts, 2 layers of 8 experts with 4 hot), its weights
seed and design seed varied from campaign to campaign, with eight treatments against a frozen
control:

* ``adaptive``: an adaptive policy, a clean change (it takes effect and keeps the outputs);
* ``empty``: 8 hot slots under ``fault: empty-hot`` (reported as set, none resident);
* ``ignored``: an adaptive policy under ``fault: ignore-policy`` (reported, never run);
* ``swapped``: ``fault: swap-weights`` (every 5th expert loaded gets its neighbour's weights);
* ``fine``: cold experts at 12 bits, declared ``lossy: {margin: 0.2}``;
* ``coarse``: cold experts at 3 bits, declared the same;
* ``fine_kl`` and ``coarse_kl``: cold experts at 6 and 3 bits, declared ``lossy: {metric: kl,
  margin: 0.003}`` (nats, from the top 5 log-probabilities every request asks for: at 6 bits the
  refbox's mean KL is about 0.0002, at 3 bits about 0.01).

Figures, each the share of campaigns (target 1 for the faults and the clean change, 0.95 for
the lossy pair), beside the baseline the same campaigns give with the statistics alone (the
comparisons' ``raw_label``: what the harness said before these checks existed):

* each fault labelled *not engaged* or *corrupt* on every comparison, and none *better*,
  *worse* or *within noise*;
* the clean change labelled neither;
* each lossy pair *equivalent* and *not equivalent*.

Full size: 20 campaigns, two at a time (the labels checked do not read timing). ``--quick``: 1,
which ``tests/analyze/test_faults.py`` runs and then reads whole (record, report, verdict).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.analyze.campaign import analyze_campaign
from harness.benchmarks import Figure

_POOL = Path(__file__).resolve().parents[2] / "campaigns" / "prompts" / "mixed.jsonl"
# Held-out prompts a campaign sends: 20 that all agree put the agreement's lower bound at 0.83
# (harness.stats.bounded), so a lossless-looking lossy cell can show a margin of 0.2; 8 could
# show none under 0.37.
_PROMPTS = 20
_BASE = {"expert_bytes": 0, "policy": "frozen", "hot_slots": 4, "drain_every": 8}
_CELLS: dict[str, dict[str, object]] = {
    "frozen": {},
    "adaptive": {"policy": "adaptive"},
    "empty": {"hot_slots": 8, "fault": "empty-hot"},
    "ignored": {"policy": "adaptive", "fault": "ignore-policy"},
    "swapped": {"fault": "swap-weights"},
    "fine": {"cold_bits": 12},
    "coarse": {"cold_bits": 3},
    "fine_kl": {"cold_bits": 6},
    "coarse_kl": {"cold_bits": 3},
}
_LOSSY = {
    "fine": {"margin": 0.2},
    "coarse": {"margin": 0.2},
    "fine_kl": {"metric": "kl", "margin": 0.003},
    "coarse_kl": {"metric": "kl", "margin": 0.003},
}
_FAULTS = ("empty", "ignored", "swapped")
_BLOCKED = {"not engaged", "corrupt"}
_DECIDED = {"better", "worse", "within noise"}


def card_text(seed: int, pool: Path) -> str:
    """The campaign card of one seed (weights and design), every treatment against ``frozen``."""
    cells = {}
    for name, knobs in _CELLS.items():
        cell: dict[str, object] = {
            "env": {"REFBOX_LAYERS": "2", "REFBOX_EXPERTS": "8"},
            "knobs": {**_BASE, "seed": seed, **knobs},
        }
        if name in _LOSSY:
            cell["lossy"] = _LOSSY[name]
        cells[name] = cell
    card = {
        "campaign": f"faults-{seed}",
        "box": "local",
        "runtime": "refbox",
        "prompts": {"pools": [str(pool)], "heldout": {"split": "heldout"}},
        "workload": {"max_tokens": 12, "warmup_requests": 1, "passes": 1, "logprobs": 5},
        "cells": cells,
        "control": "frozen",
        "design": {"order": "abba", "cycles": 1, "cache_states": ["warm"], "seed": seed},
        "gates": [{"kind": "better", "metric": "decode_tok_s"}],
    }
    return yaml.safe_dump(card, sort_keys=False)


def _card(folder: Path, seed: int, pool: Path) -> Path:
    card = folder / f"faults-{seed}.yaml"
    card.write_text(card_text(seed, pool), encoding="utf-8")
    return card


@dataclass(frozen=True)
class _Outcome:
    labels: dict[str, set[str]]  # cell -> its comparisons' labels
    raw: dict[str, set[str]]  # cell -> what the statistics alone said
    equivalence: dict[str, str]  # lossy cell -> its endpoint's verdict


def _campaign(folder: Path, seed: int, pool: Path) -> _Outcome:
    card = _card(folder, seed, pool)
    reports = folder / f"reports-{seed}"
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
    verdicts = {r.cell: r.verdict for r in analysis.equivalence}
    return _Outcome(labels, raw, verdicts)


def _share(hits: list[bool]) -> float:
    return sum(hits) / len(hits) if hits else float("nan")


FIRST_SEED = 7200


def run_bench(quick: bool = False, folder: Path | None = None) -> list[Figure]:
    """Run the campaigns (in ``folder``, default a new temporary one: ``reports-<seed>``) and
    count, per planted change, the campaigns whose labels block it."""
    count = 1 if quick else 20
    folder = folder or Path(tempfile.mkdtemp(prefix="harness-bench-faults-"))
    heldout = [x for x in _POOL.read_text(encoding="utf-8").splitlines() if '"heldout"' in x]
    pool = folder / "pool.jsonl"
    pool.write_text("\n".join(heldout[:_PROMPTS]) + "\n", encoding="utf-8")
    with ThreadPoolExecutor(max_workers=2) as workers:
        outcomes = list(
            workers.map(lambda s: _campaign(folder, s, pool), range(FIRST_SEED, FIRST_SEED + count))
        )
    figures = []
    for cell in _FAULTS:
        blocked = [
            bool(o.labels.get(cell))
            and o.labels[cell] <= _BLOCKED
            and not o.labels[cell] & _DECIDED
            for o in outcomes
        ]
        decided = [bool(o.raw.get(cell, set()) & _DECIDED) for o in outcomes]
        figures.append(
            Figure(
                name=f"{cell}: campaigns labelled not engaged or corrupt",
                value=_share(blocked),
                unit=f"of {count}",
                baseline=f"statistics alone decided {_share(decided):.2f} of them (better, "
                "worse or within noise)",
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
    pairs = [("fine", "equivalent"), ("coarse", "not equivalent")]
    pairs += [("fine_kl", "equivalent"), ("coarse_kl", "not equivalent")]
    for cell, want in pairs:
        hits = [o.equivalence.get(cell) == want for o in outcomes]
        better = [bool(o.raw.get(cell, set()) & {"better"}) for o in outcomes]
        figures.append(
            Figure(
                name=f"{cell}: campaigns whose equivalence endpoint reads {want}",
                value=_share(hits),
                unit=f"of {count}",
                baseline=f"the speed endpoint alone read better in {_share(better):.2f}",
                target=">= 0.95",
                passed=_share(hits) >= 0.95,
            )
        )
    (folder / "outcomes.json").write_text(
        json.dumps([{k: sorted(v) for k, v in o.labels.items()} for o in outcomes], indent=1),
        encoding="utf-8",
    )
    return figures
