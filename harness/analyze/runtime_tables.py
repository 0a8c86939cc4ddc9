"""A runtime's own evidence per cell: its counters and its routing (docs/design.md#runtime-side).

* **Counters**: for every catalog counter some run recorded (``route_selections``, vLLM's
  ``vllm:*`` counters, ...), the median over completed runs of its before/after delta, per cell
  and cache state. Counters are deterministic for a fixed workload (tokens, cache hits), so a
  difference here is the change, not noise. With SGLang's Paged Experts, which counts nothing,
  ``replayed_hit_rate`` (and its ``replayed_hits`` / ``replayed_misses``): its LRU replayed by
  the harness over the recorded passes, labelled replayed, never the measured ``hit_rate``.
* **Routing**: per cell, the completed runs' ``route-counts.json`` (each run's own routing, from
  the runtime's route-count dump) summed; per layer, the selections and the shares of the most
  used experts, the share the top quarter of experts takes, and the check that every layer
  counted the same number of selections (each routed token picks top_k experts in every layer).

Empty when no run recorded either, so other runtimes' reports are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.analyze.cell_values import cell_keys, cell_value
from harness.card import Card
from harness.catalog import PROMETHEUS_COUNTERS
from harness.errors import MapError
from harness.formats.maps import read_count_dump
from harness.formats.records import CampaignDir

ROUTE_COUNTER = "route_selections"
FULL_GPU_COUNTER = "full_gpu_selections"  # KT: passes run wholly on the GPU
# Paged Experts' LRU replayed over the recorded passes: named "replayed" wherever shown.
REPLAYED = ("replayed_hit_rate", "replayed_hits", "replayed_misses")
TOP_EXPERTS = 4  # experts named per layer in the routing table


@dataclass(frozen=True)
class CounterRow:
    """One (cell, cache state): the median delta of each recorded counter."""

    cell: str
    cache_state: str
    control: bool
    values: dict[str, float | None]


@dataclass(frozen=True)
class LayerRouting:
    """One layer of one cell's summed routing."""

    layer: int
    selections: int
    top: tuple[tuple[int, float], ...]  # (expert, share), most used first
    top_quarter_share: float  # share of the most used ceil(E/4) experts


@dataclass(frozen=True)
class CellRouting:
    """One cell's routing, summed over its completed runs."""

    cell: str
    runs: int
    experts: int
    layers: tuple[LayerRouting, ...]

    @property
    def balanced(self) -> bool:
        """Every layer counted the same selections (top_k per routed token in each)."""
        return len({layer.selections for layer in self.layers}) <= 1


@dataclass(frozen=True)
class RuntimeTables:
    """The counter and routing tables of one campaign (empty where nothing was recorded)."""

    counters: tuple[CounterRow, ...]
    counter_names: tuple[str, ...]
    routing: tuple[CellRouting, ...]

    def __bool__(self) -> bool:
        return bool(self.counters or self.routing)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``harness analyze --json``'s ``runtime`` object)."""
        return {
            "counters": [
                {"cell": r.cell, "cache_state": r.cache_state, "control": r.control, **r.values}
                for r in self.counters
            ],
            "routing": [
                {
                    "cell": c.cell,
                    "runs": c.runs,
                    "experts": c.experts,
                    "balanced": c.balanced,
                    "layers": [
                        {
                            "layer": layer.layer,
                            "selections": layer.selections,
                            "top": [[e, s] for e, s in layer.top],
                            "top_quarter_share": layer.top_quarter_share,
                        }
                        for layer in c.layers
                    ],
                }
                for c in self.routing
            ],
        }

    def frames(self) -> dict[str, pd.DataFrame]:
        """``analysis/runtime_counters.parquet`` and ``analysis/routing.parquet``."""
        counters = pd.DataFrame(self.to_json()["counters"])
        routing = pd.DataFrame(
            [
                {
                    "cell": c.cell,
                    "layer": layer.layer,
                    "selections": layer.selections,
                    "top_quarter_share": layer.top_quarter_share,
                }
                for c in self.routing
                for layer in c.layers
            ]
        )
        return {"runtime_counters": counters, "routing": routing}


def counter_rows(card: Card, cells: pd.DataFrame) -> tuple[list[CounterRow], list[str]]:
    """Median counter deltas per cell; only counters some completed run recorded."""
    # The policy table shows the residency counters; these are the runtime's own.
    wanted = (ROUTE_COUNTER, FULL_GPU_COUNTER, *REPLAYED, *PROMETHEUS_COUNTERS)
    names = [name for name in wanted if name in cells.columns and cells[name].notna().any()]
    if not names:
        return [], []
    rows = [
        CounterRow(
            cell,
            state,
            cell == card.control,
            {name: cell_value(cells, cell, state, name) for name in names},
        )
        for cell, state in cell_keys(card)
    ]
    return rows, names


def cell_routing(campaign: CampaignDir, card: Card, runs: pd.DataFrame) -> list[CellRouting]:
    """Each cell's completed runs' route counts, summed; cells without any are left out."""
    out = []
    ok = runs[runs["status"] == "ok"]
    for cell in card.cells:
        total: np.ndarray[Any, Any] | None = None
        used = 0
        for run_id in ok[ok["cell"] == cell]["run_id"]:
            path = campaign.run_dir(str(run_id)) / "route-counts.json"
            if not path.is_file():
                continue
            try:
                counts = read_count_dump(path)
            except MapError:
                continue  # a damaged file is left out; the run's counters still stand
            if total is not None and counts.shape != total.shape:
                continue
            total = counts if total is None else total + counts
            used += 1
        if total is None:
            continue
        experts = int(total.shape[1])
        quarter = max(1, -(-experts // 4))
        layers = []
        for index, row in enumerate(total):
            selections = int(row.sum())
            order = np.argsort(-row, kind="stable")
            shares = row / selections if selections else np.zeros_like(row, dtype=float)
            top = tuple((int(e), float(shares[e])) for e in order[:TOP_EXPERTS])
            layers.append(
                LayerRouting(index, selections, top, float(np.sort(shares)[::-1][:quarter].sum()))
            )
        out.append(CellRouting(cell, used, experts, tuple(layers)))
    return out


def build_runtime_tables(
    campaign: CampaignDir, card: Card, runs: pd.DataFrame, cells: pd.DataFrame
) -> RuntimeTables:
    """Both tables of one campaign."""
    rows, names = counter_rows(card, cells)
    return RuntimeTables(tuple(rows), tuple(names), tuple(cell_routing(campaign, card, runs)))
