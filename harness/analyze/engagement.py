"""Did each cell's change take effect on its boots? The profile's engagement signatures, checked.

docs/design.md#engagement. A knob that parsed and was logged as configured can still do nothing
(a cache requested and never allocated, a policy accepted and never run); its cell then reads
*within noise*, the one answer a release gate should never act on there. A runtime profile
declares per knob what a boot shows when a change of it took effect
(:class:`harness.profiles.schema.EngagementSignature`: a run-table metric or counter above a
floor, or outside the control's boots' range). For every cell, the knobs whose effective value
(``run.json``'s ``knobs``, defaults included) differs from the control's are checked on every
completed boot of the cell; one boot that does not show it (or does not record the metric: fail
closed) makes the cell *not engaged*, and every comparison of that cell carries that label and
the signature and boots that failed. Changed knobs with no signature, and changed env, files and
live settings, are listed as *engagement not verified*.

The signatures are read from the runtime profile frozen into the campaign directory; an
imported or simulated campaign has none, and nothing is checked or claimed for it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.analyze.compare import CellComparison
from harness.analyze.metrics import prometheus_sum
from harness.card import Card
from harness.card.frozen import frozen_paths
from harness.card.resolve import load_runtime_profile
from harness.errors import HarnessError
from harness.formats.records import read_counters, read_json
from harness.profiles.schema import EngagementSignature, RuntimeProfile, switch_state
from harness.stats.labels import Label


@dataclass(frozen=True)
class EngagementRow:
    """One signature of one changed knob, over one cell's boots."""

    cell: str
    knob: str
    value: str
    signature: str
    boots: int
    failed: tuple[str, ...]  # run ids whose boot did not show it

    @property
    def engaged(self) -> bool:
        return not self.failed and self.boots > 0

    def words(self) -> str:
        """``hot_slots=8: hit_rate > 0 not shown on 3 of 3 boots (0001-…, …)``."""
        shown = ", ".join(self.failed[:3]) + (", …" if len(self.failed) > 3 else "")
        if self.boots == 0:
            return f"{self.knob}={self.value}: {self.signature} on no completed boot"
        return (
            f"{self.knob}={self.value}: {self.signature} not shown on {len(self.failed)} of "
            f"{self.boots} boots ({shown})"
        )


@dataclass(frozen=True)
class Engagement:
    """Every cell's checked signatures and what could not be checked."""

    rows: tuple[EngagementRow, ...] = ()
    unverified: dict[str, tuple[str, ...]] = field(default_factory=dict)  # cell -> changes

    def failed(self, cell: str) -> list[EngagementRow]:
        return [r for r in self.rows if r.cell == cell and not r.engaged]

    def not_engaged_text(self, cell: str) -> str | None:
        """Why the cell is not engaged, in one clause; None when it is (or nothing checked)."""
        failed = self.failed(cell)
        if not failed:
            return None
        return "not engaged: " + "; ".join(r.words() for r in failed)

    def unverified_text(self, cell: str) -> str | None:
        """ "engagement not verified: …" for the cell's changes no signature covers."""
        changes = self.unverified.get(cell)
        if not changes:
            return None
        return f"engagement not verified: no signature for {', '.join(changes)}"

    def apply(self, comparisons: list[CellComparison]) -> list[CellComparison]:
        """The comparisons with every not-engaged cell's relabelled."""
        out = []
        for item in comparisons:
            why = self.not_engaged_text(item.cell)
            if why is not None:
                changed = dataclasses.replace(
                    item.comparison, label=Label.NOT_ENGAGED, not_engaged=why
                )
                item = dataclasses.replace(item, comparison=changed)
            out.append(item)
        return out

    def records(self) -> list[dict[str, object]]:
        """Flat rows for ``analysis.json`` and ``verdict.json``."""
        return [
            {**dataclasses.asdict(r), "failed": list(r.failed), "engaged": r.engaged}
            for r in self.rows
        ]


def frozen_profile(root: Path) -> RuntimeProfile | None:
    paths = frozen_paths(root, "runtime")
    if not paths:
        return None
    try:
        return load_runtime_profile(paths[0])
    except HarnessError:
        return None  # a profile this harness can no longer read: nothing is claimed


def run_knobs(root: Path, run_id: str) -> dict[str, str]:
    """A run's effective knobs as a card writes them: a switch reads ``true``/``false`` (what a
    signature's ``when`` and ``unless`` name), not Python's ``True``."""
    data = read_json(root / "runs" / run_id / "run.json")
    knobs = data.get("knobs")
    if not isinstance(knobs, dict):
        return {}
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in knobs.items()}


def changed_knobs(knobs: dict[str, str], control: dict[str, str]) -> list[str]:
    """The knobs whose effective value differs from the control's, sorted."""
    return sorted(k for k in set(knobs) | set(control) if knobs.get(k) != control.get(k))


def _shown(sig: EngagementSignature, value: float, control: list[float]) -> bool:
    if not math.isfinite(value):
        return False
    if sig.above is not None:
        return value > sig.above
    finite = [v for v in control if math.isfinite(v)]
    return bool(finite) and not min(finite) <= value <= max(finite)


def _value(root: Path, runs: pd.DataFrame, run_id: str, metric: str) -> float:
    """The run table's value, else the run's own counter delta: a profile's log counter
    (llama.cpp's offloaded layers, vLLM's offloaded weights) is no run-table column."""
    if metric in runs.columns:
        cell = runs.loc[runs["run_id"] == run_id, metric]
        number = pd.to_numeric(cell, errors="coerce")
        if len(number) and math.isfinite(float(number.iloc[0])):
            return float(number.iloc[0])
    path = root / "runs" / run_id / "counters.json"
    if not path.is_file():
        return math.nan
    try:
        delta = read_counters(path).get("delta") or {}
    except HarnessError:
        return math.nan  # a damaged file shows nothing: fail closed
    value = prometheus_sum(delta, metric)
    return math.nan if value is None else value


def check_engagement(root: Path, card: Card, runs: pd.DataFrame) -> Engagement | None:
    """Each treatment cell's changed knobs against the profile's signatures (None: no frozen
    profile, or no control to compare with)."""
    profile = frozen_profile(root)
    if profile is None or card.control is None or runs.empty:
        return None
    done = runs[runs["status"].eq("ok")]
    ids = {cell: [str(r) for r in done.loc[done["cell"].eq(cell), "run_id"]] for cell in card.cells}
    control_ids = ids.get(card.control, [])
    if not control_ids:
        return None
    control_knobs = run_knobs(root, control_ids[0])
    rows: list[EngagementRow] = []
    unverified: dict[str, tuple[str, ...]] = {}
    for cell in card.treatments:
        if not ids.get(cell):
            continue
        knobs = run_knobs(root, ids[cell][0])
        changed = changed_knobs(knobs, control_knobs)
        loose: list[str] = []
        for name in changed:
            spec = profile.knobs.get(name)
            value = knobs.get(name, "(unset)")
            if spec is not None and spec.switch and (state := switch_state(value)) is not None:
                value = "true" if state else "false"  # `on`, `1`, True: as a signature names it
            signatures = [s for s in spec.engaged if s.applies(value)] if spec else []
            if not signatures:
                loose.append(name)
                continue
            for sig in signatures:
                control = [_value(root, runs, r, sig.metric) for r in control_ids]
                failed = tuple(
                    r
                    for r in ids[cell]
                    if not _shown(sig, _value(root, runs, r, sig.metric), control)
                )
                rows.append(EngagementRow(cell, name, value, sig.text(), len(ids[cell]), failed))
        if loose:
            unverified[cell] = tuple(loose)
    return Engagement(tuple(rows), unverified)


__all__ = [
    "Engagement",
    "EngagementRow",
    "changed_knobs",
    "check_engagement",
    "frozen_profile",
    "run_knobs",
]
