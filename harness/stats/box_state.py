"""What the box remembers, read off the box: has a measured state settled before a block scores?

Carry-over is a state of the box (heat, a page cache, a skewed tier) that each arm's traffic
moves towards that arm's own level. Within an interleaved campaign its effect on the metric is
nearly invisible once it outlives a block (both arms run at the same mixed level, and D̄
measures the candidate there, not deployed: ``harness bench sequential``'s traffic bank), but a
probe that reads the state itself (the refbox's heat file, a GPU's temperature, the page cache
holding the expert files) sees it directly. Each block's probe is read three times: before its
washout (``start``), when its scored requests begin (``scored``) and when they end (``end``).

The check: a washout has cleared the state when, for each arm, the state at which its scored
blocks begin does not depend on what ran before the washout. With ``gap_X`` the mean scored
reading of arm X's blocks after the other arm (*switch*) less that after its own (*same*),
and the arms' spread the difference of their *same* means, the state is **unsettled** when some
``gap_X`` differs from 0 beyond the readings' noise (a t-test on the residual SD of the
relaxation fit below, at 2.5% for each arm; readings the fit matches exactly have none) and
is at least ``SETTLED_SHARE`` of the spread and larger than the probe's declared ``tolerance``
(readings that close are one state). A *better*/*worse* label then reads
*carry-over* (it can only withhold). A state that does not depend on the arm has no spread and
no gap, and costs nothing.

The washout that would clear it comes from the readings too: every reading pair is a stretch
of one arm's traffic of known length (the washout's share of a block, the scored block's one
block), over which the state relaxes towards that arm's level; the relaxation per block ``r``
and each arm's level are fitted by least squares (``r`` on a grid), and the washout that brings
a switch's residue under ``SETTLED_SHARE`` is ln(SETTLED_SHARE)/ln(r) blocks.

What it rests on: the traffic bank's probe reads the state exactly (as the reference runtime's
heat file does), and with it every design holds all 20 cases. A noisy probe (a temperature) has
its noise in the fit's residual, which raises the bar for "beyond noise"; that case is not in
the bank yet. The fit is exponential: a page cache's turnover, linear in traffic, is fitted, and
its advised washout read, as if it were one.

Pure: readings in, a frozen result out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from harness.stats.distributions import t_isf

# The residue a washout may leave, as a share of the arms' spread: a state that starts a
# switched block within a tenth of the way to the other arm's level has settled.
SETTLED_SHARE = 0.1
POINTS = ("start", "scored", "end")  # where a block's probes are read, in its record
ROUNDING = 1e-9  # readings are states (a temperature, a share): agreeing to this is agreeing


@dataclass(frozen=True)
class StateReading:
    """One block's readings of one probe: before its washout, as it scores, as it ends."""

    start: float
    scored: float
    end: float
    tolerance: float = 0.0  # readings this close are one state (the probe's `tolerance`)

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.start, self.scored, self.end)):
            raise ValueError("state readings must be finite")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError("a state's tolerance must be finite and >= 0")


@dataclass(frozen=True)
class BlockTraffic:
    """One scored block as the check sees it: its arm ("A" control, "B" the cell), what ran on
    the box before its washout ("A", "B", "X" another cell, "-" nothing), its washout's length
    in blocks, and its readings by probe."""

    arm: str
    before: str
    washout: float
    readings: Mapping[str, StateReading]


@dataclass(frozen=True)
class StateCheck:
    """One probe's verdict on a comparison's blocks."""

    probe: str
    unsettled: bool
    arm: str | None  # the arm whose switched blocks began furthest from their own (A or B)
    gap_share: float | None  # that gap as a share of the arms' spread
    spread: float | None  # the arms' same-block scored levels, B less A
    per_block: float | None  # fitted relaxation left after one block of own traffic
    washout_blocks: float | None  # the washout that would settle it (None: not measurable)

    def words(self, requests_per_block: float | None = None) -> str:
        """What the probe saw, in one clause, and the washout that would clear it."""
        if not self.unsettled or self.gap_share is None:
            return f"box state {self.probe}: settled before every scored block"
        arm = "control" if self.arm == "A" else "candidate"
        clause = (
            f"box state {self.probe}: the {arm}'s blocks after a switch began "
            f"{self.gap_share:.0%} of the way to the other arm's level (settled is under "
            f"{SETTLED_SHARE:.0%})"
        )
        if self.washout_blocks is None:
            return clause + "; no washout this campaign could measure clears it"
        need = f"about {self.washout_blocks:.1f} blocks"
        if requests_per_block:
            need += f" ({math.ceil(self.washout_blocks * requests_per_block)} requests)"
        return (
            clause + f"; {need} of each block's own traffic before it scores would settle it "
            f"(design.washout {max(1, math.ceil(self.washout_blocks)):d}, warm-up included)"
        )


def _switch(arm: str, before: str) -> bool | None:
    if before == "-":
        return None
    return before != arm


def check_probe(blocks: Sequence[BlockTraffic], probe: str, alpha: float = 0.05) -> StateCheck:
    """The settled check of one probe over a comparison's scored blocks."""
    groups: dict[tuple[str, bool], list[float]] = {}
    tolerance = 0.0
    for b in blocks:
        reading = b.readings.get(probe)
        switch = _switch(b.arm, b.before)
        if reading is None or switch is None:
            continue
        groups.setdefault((b.arm, switch), []).append(reading.scored)
        tolerance = max(tolerance, reading.tolerance)
    same = {arm: groups.get((arm, False)) for arm in "AB"}
    if not same["A"] or not same["B"]:
        return StateCheck(probe, False, None, None, None, None, None)
    spread = float(np.mean(same["B"]) - np.mean(same["A"]))
    fit = relaxation(blocks, probe)
    worst: tuple[float, str] | None = None
    for arm in "AB":
        switched, own = groups.get((arm, True)), same[arm]
        if not switched or not own:
            continue
        gap = float(np.mean(switched) - np.mean(own))
        if abs(gap) <= tolerance:
            continue  # one state, as far as the probe can tell (its declared tolerance)
        # Two arms tested: each at α/2, so a noisy probe of a state with no carry-over withholds
        # at most α of the comparisons (at α each it withheld 8–10%).
        if not _beyond_noise(len(switched), len(own), gap, fit, alpha / 2):
            continue
        share = abs(gap) / abs(spread) if abs(spread) > ROUNDING else math.inf
        if worst is None or share > worst[0]:
            worst = (share, arm)
    if worst is None or worst[0] < SETTLED_SHARE:
        return StateCheck(probe, False, None, worst[0] if worst else None, spread, None, None)
    per_block = fit.per_block if fit is not None else None
    needed = None
    if per_block is not None and per_block < 1.0:
        # A state that clears within the grid's first step still needs some traffic.
        needed = math.log(SETTLED_SHARE) / math.log(max(per_block, float(GRID[1])))
    return StateCheck(probe, True, worst[1], worst[0], spread, per_block, needed)


def _beyond_noise(
    n_switched: int, n_own: int, gap: float, fit: Relaxation | None, alpha: float
) -> bool:
    """Whether a gap between two groups' mean readings exceeds the readings' own noise: the
    relaxation fit's residual SD (the state's movement is the model's, not noise); readings
    the model fits exactly (a file the runtime writes) have none."""
    if abs(gap) <= ROUNDING:
        return False
    if fit is None:
        return False  # too few readings to tell noise from state
    if fit.residual_sd <= ROUNDING:
        return True
    if fit.df < 1:
        return False
    se = fit.residual_sd * math.sqrt(1.0 / n_switched + 1.0 / n_own)
    return bool(abs(gap) / se > t_isf(alpha / 2.0, fit.df))


GRID = np.linspace(0.0, 0.999, 1000)


@dataclass(frozen=True)
class Relaxation:
    """The fitted relaxation: what is left of a state's distance from an arm's level after one
    block of that arm's traffic, and the readings' residual SD around the fit (its df)."""

    per_block: float
    residual_sd: float
    df: int


def relaxation(blocks: Sequence[BlockTraffic], probe: str) -> Relaxation | None:
    """The state's relaxation, fitted over every stretch the readings bracket (washout:
    start → scored; scored block: scored → end) as next = level_arm + (previous −
    level_arm)·r^length; None with fewer than four stretches."""
    stretches: list[tuple[int, float, float, float]] = []
    for b in blocks:
        reading = b.readings.get(probe)
        if reading is None:
            continue
        arm = 0 if b.arm == "A" else 1
        if b.washout > 0:
            stretches.append((arm, b.washout, reading.start, reading.scored))
        stretches.append((arm, 1.0, reading.scored, reading.end))
    if len(stretches) < 4:
        return None
    arms = np.asarray([s[0] for s in stretches])
    length = np.asarray([s[1] for s in stretches])
    before = np.asarray([s[2] for s in stretches])
    after = np.asarray([s[3] for s in stretches])
    kept = GRID[:, None] ** length[None, :]  # every candidate r × every stretch
    # after − before·r^L = level·(1 − r^L): least squares for each arm's level, at every r.
    lhs, rhs = after[None, :] - before[None, :] * kept, 1.0 - kept
    sse = np.zeros(GRID.size)
    for arm in (0, 1):
        mine = arms == arm
        if not mine.any():
            continue
        y, x = lhs[:, mine], rhs[:, mine]
        xx = (x * x).sum(axis=1)
        level = np.divide((y * x).sum(axis=1), xx, out=np.zeros_like(xx), where=xx > 0)
        sse += ((y - level[:, None] * x) ** 2).sum(axis=1)
    # The first r within rounding of the least error (ties at exact fits go to the smallest).
    at = int(np.flatnonzero(sse <= sse.min() + 1e-15)[0])
    best = (float(sse[at]), float(GRID[at]))
    df = len(stretches) - 3  # r and two levels
    sd = math.sqrt(best[0] / df) if df > 0 else 0.0
    return Relaxation(best[1], sd if sd > ROUNDING else 0.0, df)


def check_state(blocks: Sequence[BlockTraffic], alpha: float = 0.05) -> list[StateCheck]:
    """Every probe's check, those that found the state unsettled first."""
    probes = sorted({p for b in blocks for p in b.readings})
    checks = [check_probe(blocks, p, alpha) for p in probes]
    return sorted(checks, key=lambda c: not c.unsettled)


__all__ = [
    "POINTS",
    "SETTLED_SHARE",
    "BlockTraffic",
    "Relaxation",
    "StateCheck",
    "StateReading",
    "check_probe",
    "check_state",
    "relaxation",
]
