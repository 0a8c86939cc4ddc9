"""Read what the box remembers: a runtime profile's ``box_state`` probes, three times a block.

Each probe (heat, a temperature, the page cache holding the expert files) is read on the box
before the block's warm-up and washout (``start``), as its scored requests begin (``scored``)
and as they end (``end``); ``run.json`` keeps them under ``runtime.box_state`` with the
requests of the block's own traffic before it scored (``runtime.own_requests``), and the
analysis asks whether the state had settled (harness.stats.box_state). A probe that cannot be
read is no reading, never a failed run: the state is evidence, not the measurement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.boxes.base import Box
from harness.errors import HarnessError
from harness.profiles.schema import PROBE_PLACEHOLDER, RuntimeProfile, StateProbe
from harness.stats.box_state import POINTS
from harness.stats.cycles import finite


def _fill(template: str, knobs: Mapping[str, Any]) -> str | None:
    """``template`` with every {knob} (or place) replaced by the cell's setting; None where one
    is unset."""
    names = PROBE_PLACEHOLDER.findall(template)
    if any(knobs.get(n) is None for n in names):
        return None
    return PROBE_PLACEHOLDER.sub(lambda m: str(knobs[m.group(1)]), template)


def _number(text: str, key: str | None) -> float | None:
    try:
        value: Any = json.loads(text)[key] if key is not None else float(text.split()[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return finite(value)


def read_probe(box: Box, probe: StateProbe, knobs: Mapping[str, Any]) -> float | None:
    """One reading of ``probe`` for a cell with the knobs it ``needs``; None when it has no
    reading."""
    if probe.file is not None:
        path = _fill(probe.file, knobs)
        if path is None:
            return None
        try:
            # One round trip where the file is there (read_text says '' for a missing one).
            text = box.read_text(path)
            if not text and not box.exists(path):
                return probe.missing
            return _number(text, probe.key)
        except (OSError, HarnessError):
            return None
    assert probe.command is not None
    command = _fill(probe.command, knobs)
    if command is None:
        return None
    try:
        result = box.sh(command, timeout_s=10, check=False)
    except (OSError, HarnessError):
        return None
    return _number(result.stdout, None) if result.code == 0 else None


class BoxStateReader:
    """The probes of one run: read at each point, then written into its record."""

    def __init__(
        self,
        box: Box,
        profile: RuntimeProfile,
        knobs: Mapping[str, Any],
        places: Mapping[str, str] | None = None,
    ) -> None:
        self.box = box
        self.probes = [p for p in profile.box_state if p.reads(knobs)]
        self.knobs = {**(places or {}), **knobs}
        self.readings: dict[str, dict[str, float | None]] = {}

    def read(self, point: str) -> None:
        """Read every probe at ``point`` (one of harness.stats.box_state.POINTS)."""
        assert point in POINTS
        for probe in self.probes:
            self.readings.setdefault(probe.name, {})[point] = read_probe(
                self.box, probe, self.knobs
            )

    def same_as(self, point: str, earlier: str) -> None:
        """``point`` read at the same moment as ``earlier`` (a command run scores from its start):
        its readings copied, not read again."""
        assert point in POINTS and earlier in POINTS
        for readings in self.readings.values():
            readings[point] = readings.get(earlier)

    def record(self, runtime: dict[str, Any], own_requests: int) -> None:
        """Keep the readings taken (and the block's own traffic before it scored) in
        ``runtime`` (a run record's ``runtime``)."""
        if not self.probes:
            return
        for probe in self.probes:
            if probe.tolerance and probe.name in self.readings:
                self.readings[probe.name]["tolerance"] = probe.tolerance
        runtime["box_state"] = self.readings
        runtime["own_requests"] = own_requests


__all__ = ["POINTS", "BoxStateReader", "read_probe"]
