"""The seeds' tables, pinned on fixed run records of the shipped seed cards.

Each folder under tests/data/campaigns/*-shaped/ is one real campaign of a shipped card on the
reference runtime, kept as written (tests/make_fixtures.py made them; their README says how).
Here each is gated as a user gates a finished campaign, ``harness gate DIR`` (analysis, verdict
and report), and the tables are held to the directions the seeds report. The cards themselves
still run end to end in tests/test_campaigns.py, at the smallest scale that runs every stage;
what those runs measured lives here, where it cannot move with the machine's load.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import DATA, run_cli


@dataclass(frozen=True)
class Gated:
    """A fixture campaign after ``harness gate``: its folder, exit code and output."""

    root: Path
    code: int
    output: str

    def table(self, name: str) -> pd.DataFrame:
        return pd.read_parquet(self.root / "analysis" / f"{name}.parquet")

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads((self.root / "analysis" / "summary.json").read_text())
        return summary

    def gates(self) -> dict[str, dict[str, Any]]:
        verdict = json.loads((self.root / "verdict.json").read_text())
        return {gate["name"]: gate for gate in verdict["gates"]}


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Gated]:
    """``harness gate`` on a copy of a fixture, once per fixture and module."""
    done: dict[str, Gated] = {}

    def gate(name: str) -> Gated:
        if name not in done:
            root = tmp_path_factory.mktemp(name) / name
            shutil.copytree(DATA / "campaigns" / name, root)
            result = run_cli("gate", "--allow-unsealed", str(root))  # recorded before sealing
            done[name] = Gated(root, result.code, result.stdout + result.stderr)
        return done[name]

    return gate


def assert_timing_gate_honest(gate: dict[str, Any]) -> None:
    """A timing gate passes as *better*, or fails without claiming *worse*, saying why."""
    labels = {str(e["label"]) for e in gate["evidence"].values()}
    assert labels, gate
    if gate["passed"]:
        assert labels == {"better"}, gate
        return
    assert labels <= {"better", "inconclusive", "confounded"}, gate
    if "inconclusive" in labels:
        assert "would be needed" in str(gate["reason"]), gate


def assert_exit_follows_verdict(gated: Gated) -> None:
    verdict = json.loads((gated.root / "verdict.json").read_text())
    assert gated.code == (0 if verdict["passed"] else 1), gated.output


def test_seed_map_records_yield_the_frozen_map_table(gated: Callable[[str], Gated]) -> None:
    campaign = gated("seed-map-shaped")
    assert_exit_follows_verdict(campaign)
    runs = campaign.table("runs")
    assert (runs["status"] == "ok").all() and len(runs) == 12
    cells = campaign.table("cells").set_index("cell")
    for column in ("c1_tok_s", "first_request_tok_s", "hit_rate"):
        assert cells[column].notna().all(), column
    assert cells.loc["seed", "hit_rate"] > cells.loc["stale", "hit_rate"]
    domains = campaign.table("domains")
    assert {"agent", "en-prose"} <= set(domains["domain"])
    # Seed 000 §5: the frozen seed map is faster in aggregate and on the first request after
    # boot, and its statistics are the aggregate comparison's.
    (table,) = campaign.summary()["seed_tables"]["frozen_map"]
    rows = {r["label"]: r for r in table["rows"]}
    aggregate = rows["aggregate C1 (decode tok/s, geomean)"]
    assert aggregate["ratio"] > 1.1 and aggregate["comparison"]["label"] != "worse"
    assert rows["first request after boot"]["ratio"] > 1
    assert {"agent C1", "en-prose C1"} <= set(rows)
    gates = campaign.gates()
    assert gates["exact outputs 49/50"]["passed"], gates
    assert gates["quality 0/12"]["passed"], gates  # no regression against the stale map
    assert gates["counter new_swapout_pages <= 0"]["passed"], gates
    assert_timing_gate_honest(gates["better c1_tok_s"])


def test_hotlist_records_yield_the_policy_table(gated: Callable[[str], Gated]) -> None:
    # One fixed cycle in each cache state (the card is sequential): 16 runs of 4 held-out
    # conversations.
    campaign = gated("hotlist-shaped")
    cells = campaign.table("cells")
    assert set(cells["cache_state"]) == {"warm", "cold"}
    for column in ("decode_tok_s", "hit_rate", "expert_loads", "bytes_read", "tpot_p50_ms"):
        assert cells[column].notna().all(), column
    for state in ("warm", "cold"):
        mine = cells[cells["cache_state"] == state].set_index("cell")
        # Seed 004's direction: the stale legacy priorities lock in; adaptive and trained miss less.
        assert mine.loc["adaptive", "hit_rate"] > mine.loc["legacy", "hit_rate"], state
        assert mine.loc["trained", "hit_rate"] > mine.loc["legacy", "hit_rate"], state
    policy = campaign.summary()["seed_tables"]["policy"]
    assert {(r["cell"], r["cache_state"]) for r in policy} == {
        (c, s) for c in ("legacy", "adaptive", "trained") for s in ("warm", "cold")
    }
    # No shift in this workload: the recovery section says so instead of an empty T90 table.
    record = (campaign.root / "record.md").read_text(encoding="utf-8")
    if "## Recovery after" in record:
        section = record.split("## Recovery after", 1)[1].split("\n## ", 1)[0]
        assert "No domain shift in this workload, so no T90" in section
        assert "T90 median" not in section
    # One cycle gives no interval: the TPOT gates cannot promote, and say so; outputs and the
    # swap-out counter still pass. The campaign fails, with exit 1.
    assert campaign.code == 1, campaign.output
    gates = campaign.gates()
    assert gates["exact outputs all"]["passed"], gates
    assert gates["counter new_swapout_pages <= 0"]["passed"], gates
    for name in ("better tpot_p50_ms", "better tpot_p95_ms", "survives warm, cold"):
        assert not gates[name]["passed"] and "1 cycle" in str(gates[name]["reason"]), gates[name]


def test_ladder_records_yield_the_cell_table(gated: Callable[[str], Gated]) -> None:
    # One repeat per block (the card has the seed's three): 12 runs.
    campaign = gated("ladder-shaped")
    # The card gates only on outputs and swap-out (seed 000 §4 reports recovery, it does not
    # promote on it): identical outputs across queue rates, so it passes.
    assert campaign.code == 0, campaign.output
    shifts = campaign.table("shifts")
    directions = set(zip(shifts["from_phase"], shifts["to_phase"], strict=True))
    assert directions == {("agent", "prose"), ("prose", "agent-again")}
    cells = campaign.table("cells").set_index("cell")
    assert cells["churn_per_min"].notna().all()
    assert cells["c1_tok_s"].notna().all()
    # The stale companion boot misses more than the seed-map boot it is compared with.
    assert cells.loc["stale-b0", "cold_share"] > cells.loc["b0-shipped", "cold_share"]
    ladder = campaign.summary()["seed_tables"]["recovery"]
    assert ladder["directions"] == [["agent", "prose"], ["prose", "agent-again"]]
    rows = {r["cell"]: r for r in ladder["rows"]}
    assert set(rows) == set(cells.index)
    for row in rows.values():
        assert len(row["t90"]) == 2 and all(t["runs"] > 0 for t in row["t90"])
