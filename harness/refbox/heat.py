"""Box heat: state the box keeps across boots that relaxes with traffic (fault injection).

A real box remembers what ran on it (a skewed adaptive tier, a page cache, heat), and that
memory fades as other traffic runs. Here it is one number, the heat S in [0, 1], kept in a small
JSON file on the box (``--heat-state``) that every boot naming it shares: read at boot, and
after every completed request moved towards this boot's source X (``--heat-source``) by
:func:`relax_heat`, S <- X + (S - X) * 2^(-1/H), H being ``--heat-half-life-requests``. Every
decode step of a boot runs ``--heat-slowdown-pct`` P% x S slower, by real extra work
(:meth:`Engine._drift <harness.refbox.engine.Engine._drift>`), so a client measures it. A
missing file is a cool box (S = 0); the file is replaced atomically, so a reader never sees half
of one. File: ``{"version": 1, "heat": S, "requests": N}`` (N: the completed requests that moved
it, over every boot).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path

from harness.formats.safe_write import write_text_atomic

__all__ = ["HEAT_STATE_VERSION", "BoxHeat", "HeatSettings", "read_heat", "relax_heat", "write_heat"]

# 1: {"version", "heat", "requests"}.
HEAT_STATE_VERSION = 1


def relax_heat(heat: float, source: float, half_life_requests: float) -> float:
    """The heat after one more completed request: ``source + (heat - source) * 2^(-1/H)``.

    The distance to ``source`` halves every ``half_life_requests`` requests, so after n requests
    of one source it is ``source + (heat - source) * 2^(-n/H)``. The result lies between
    ``heat`` and ``source`` (clamped there against rounding), so heat and source in [0, 1] keep
    it in [0, 1] and the file always reads back.
    """
    relaxed = source + (heat - source) * math.pow(2.0, -1.0 / half_life_requests)
    return min(max(heat, source), max(min(heat, source), relaxed))


def read_heat(path: str) -> tuple[float, int]:
    """The heat and request count in ``path``; ``(0.0, 0)`` when it is missing (a cool box).

    Raises ``OSError`` when it cannot be read and ``ValueError`` when it is not a heat state
    file of this version.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return 0.0, 0
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a heat state file (not JSON)") from exc
    if not isinstance(state, dict) or state.get("version") != HEAT_STATE_VERSION:
        raise ValueError(f"{path}: not a heat state file of version {HEAT_STATE_VERSION}")
    heat, requests = state.get("heat"), state.get("requests")
    if not isinstance(heat, int | float) or isinstance(heat, bool) or not 0.0 <= heat <= 1.0:
        raise ValueError(f"{path}: heat must be a number in 0..1, got {heat!r}")
    if not isinstance(requests, int) or isinstance(requests, bool) or requests < 0:
        raise ValueError(f"{path}: requests must be a non-negative integer, got {requests!r}")
    return float(heat), requests


def write_heat(path: str, heat: float, requests: int) -> None:
    """Replace ``path`` with this heat and request count, atomically (raises ``OSError``)."""
    payload = {"version": HEAT_STATE_VERSION, "heat": heat, "requests": requests}
    write_text_atomic(Path(path), json.dumps(payload) + "\n", make_folder=False)


@dataclass(frozen=True)
class HeatSettings:
    """A boot's heat flags and the state it read at boot."""

    path: str  # --heat-state
    source: float = 0.0  # --heat-source: what this boot's traffic drives the heat towards
    slowdown_pct: float = 0.0  # --heat-slowdown-pct: decode steps this much slower at heat 1
    half_life_requests: float = 32.0  # --heat-half-life-requests
    heat: float = 0.0  # S when the boot read the file
    requests: int = 0  # completed requests the file had counted then

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("source", self.source, 0.0, 1.0),
            ("heat", self.heat, 0.0, 1.0),
            ("slowdown_pct", self.slowdown_pct, 0.0, math.inf),
        ):
            if not low <= value <= high or math.isinf(value):
                raise ValueError(f"heat {name} must be finite and in {low:g}..{high:g}: {value}")
        if not 0.0 < self.half_life_requests < math.inf:
            raise ValueError(f"half_life_requests must be > 0, got {self.half_life_requests}")


class BoxHeat:
    """The box's heat as one boot sees and moves it; thread-safe.

    It belongs to the box, not to the engine's boot state: an engine reset leaves it alone.
    """

    def __init__(self, settings: HeatSettings) -> None:
        """Start from the heat the boot read (``settings.heat``)."""
        self.settings = settings
        self.heat = settings.heat
        self.requests = settings.requests
        self._lock = threading.Lock()

    def step_slowdown_pct(self) -> float:
        """How much slower a decode step runs now: P% x S."""
        return self.settings.slowdown_pct * self.heat

    def request_done(self) -> float:
        """Move the heat one completed request towards the source and write the file; returns
        the new heat (raises ``OSError`` when the file cannot be written)."""
        s = self.settings
        with self._lock:
            self.heat = relax_heat(self.heat, s.source, s.half_life_requests)
            self.requests += 1
            write_heat(s.path, self.heat, self.requests)
            return self.heat
