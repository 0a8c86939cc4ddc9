"""What a sweep varies: ``--sweep KNOB=v1,v2,…`` (a grid) or ``KNOB=LOW:HIGH`` (``--sample N``).

A point is a set of overrides on the sweep's base cell (the card's control unless ``--base``):
policy knobs replace the cell's knob, env or live setting of that name, and ``rowmap`` or
``hotlist`` replaces the map the cell boots. :func:`point_cell` turns a point into the
:class:`~harness.card.Cell` a card would hold, so the simulator resolves it exactly as it
resolves the card's own cells.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.card import Cell
from harness.errors import BadInput

__all__ = [
    "FILE_KNOBS",
    "SWEEP_KNOBS",
    "Axis",
    "Point",
    "grid_points",
    "parse_axes",
    "point_cell",
    "sample_points",
]

INT_SWEEP = ("drain_every", "swaps_per_layer", "hot_slots", "cache_records", "moe_cache_mib",
             "n_cpu_moe")  # fmt: skip
FLOAT_SWEEP = ("promote_threshold", "hysteresis", "decay_half_life_steps")
TEXT_SWEEP = ("hotlist_priority",)
FILE_KNOBS = ("rowmap", "hotlist")
SWEEP_KNOBS = INT_SWEEP + FLOAT_SWEEP + TEXT_SWEEP + FILE_KNOBS
KnobValue = int | float | str


@dataclass(frozen=True)
class Axis:
    """One ``--sweep``: a list of values, or a numeric range to sample from."""

    knob: str
    values: tuple[KnobValue, ...] = ()
    low: float | None = None
    high: float | None = None

    @property
    def is_range(self) -> bool:
        """A ``LOW:HIGH`` range (only ``--sample`` draws from it)."""
        return self.low is not None


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its id and the overrides on the base cell (empty: the control)."""

    id: str
    overrides: tuple[tuple[str, KnobValue], ...]

    def label(self) -> str:
        """``drain_every=32 swaps_per_layer=2`` (file knobs by file name)."""
        if not self.overrides:
            return "control"
        return " ".join(
            f"{k}={Path(str(v)).name if k in FILE_KNOBS else v}" for k, v in self.overrides
        )


def _number(knob: str, text: str) -> KnobValue:
    try:
        return int(text) if knob in INT_SWEEP else float(text)
    except ValueError:
        kind = "an integer" if knob in INT_SWEEP else "a number"
        raise BadInput(f"--sweep {knob}: {text!r} is not {kind}") from None


def parse_axes(specs: list[str], cwd: Path | None = None) -> list[Axis]:
    """``KNOB=v1,v2`` or ``KNOB=LOW:HIGH`` per spec; map files resolved against ``cwd``."""
    axes: list[Axis] = []
    seen: set[str] = set()
    for spec in specs:
        knob, sep, rest = spec.partition("=")
        knob = knob.strip()
        if not sep or not rest.strip():
            raise BadInput(f"--sweep {spec!r}: write KNOB=v1,v2,... or KNOB=LOW:HIGH")
        if knob not in SWEEP_KNOBS:
            raise BadInput(
                f"--sweep {spec!r}: unknown knob {knob!r}; known: {', '.join(SWEEP_KNOBS)}"
            )
        if knob in seen:
            raise BadInput(f"--sweep {knob}: given twice; list every value in one --sweep")
        seen.add(knob)
        if ":" in rest and knob not in FILE_KNOBS + TEXT_SWEEP:
            low_text, _, high_text = rest.partition(":")
            low, high = float(_number(knob, low_text)), float(_number(knob, high_text))
            if not low <= high:
                raise BadInput(f"--sweep {spec!r}: LOW must not exceed HIGH")
            axes.append(Axis(knob, low=low, high=high))
            continue
        texts = [t.strip() for t in rest.split(",") if t.strip()]
        values: list[KnobValue] = []
        for text in texts:
            if knob in FILE_KNOBS:
                path = Path(text).expanduser()
                path = path if path.is_absolute() else (cwd or Path.cwd()) / path
                if not path.is_file():
                    raise BadInput(f"--sweep {knob}: {text}: no such file")
                values.append(str(path.resolve()))
            elif knob in TEXT_SWEEP:
                values.append(text)
            else:
                values.append(_number(knob, text))
        if len(set(values)) != len(values):
            raise BadInput(f"--sweep {knob}: a value is listed twice")
        axes.append(Axis(knob, tuple(values)))
    return axes


def _point(index: int, overrides: list[tuple[str, KnobValue]]) -> Point:
    return Point(f"p{index:03d}", tuple(overrides))


def grid_points(axes: list[Axis]) -> list[Point]:
    """The control, then every combination of the axes' values (the first axis slowest)."""
    ranges = [a.knob for a in axes if a.is_range]
    if ranges:
        raise BadInput(
            f"--sweep {ranges[0]}: a LOW:HIGH range needs --sample N; a grid lists values"
        )
    points = [Point("control", ())]
    for index, combo in enumerate(itertools.product(*(a.values for a in axes)), start=1):
        points.append(_point(index, list(zip((a.knob for a in axes), combo, strict=True))))
    return points


def sample_points(axes: list[Axis], count: int, seed: int) -> list[Point]:
    """The control, then ``count`` points drawn at random (seeded): uniform in a range (integer
    knobs rounded), uniform over a list's values. Duplicates are drawn again, a bounded number
    of times, so a small space yields fewer points rather than repeats."""
    if count < 1:
        raise BadInput(f"--sample must be at least 1, got {count}")
    rng = np.random.default_rng(seed)
    points = [Point("control", ())]
    seen: set[tuple[tuple[str, KnobValue], ...]] = set()
    for _ in range(count * 20):
        if len(points) > count:
            break
        overrides: list[tuple[str, KnobValue]] = []
        for axis in axes:
            if axis.is_range:
                assert axis.low is not None and axis.high is not None
                drawn = float(rng.uniform(axis.low, axis.high))
                value: KnobValue = round(drawn) if axis.knob in INT_SWEEP else round(drawn, 6)
            else:
                value = axis.values[int(rng.integers(len(axis.values)))]
            overrides.append((axis.knob, value))
        key = tuple(overrides)
        if key in seen:
            continue
        seen.add(key)
        points.append(_point(len(points), overrides))
    return points


def point_cell(base: Cell, point: Point, description: str = "") -> Cell:
    """The base cell with the point's overrides: a knob replaces the base's knob, ``REFBOX_``
    env and live setting of that name (live would otherwise win); a map replaces the file."""
    knobs = dict(base.knobs)
    env = dict(base.env)
    live = dict(base.live)
    files = dict(base.files)
    for knob, value in point.overrides:
        if knob in FILE_KNOBS:
            files.pop("rowmap", None)
            files.pop("hotlist", None)
            files[knob] = str(value)
            continue
        knobs[knob] = value
        env.pop(f"REFBOX_{knob.upper()}", None)
        live.pop(knob, None)
    return base.model_copy(
        update={
            "knobs": knobs,
            "env": env,
            "live": live,
            "files": files,
            "description": description or base.description,
        }
    )
