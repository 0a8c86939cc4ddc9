"""Reading a shift phase's recovery while it runs, for ``until_recovered`` phases.

The runner asks :meth:`RecoveryWatch.measured` between requests of a phase's extension: it
drains the runtime's ring since its last read (the same drain the soak monitor uses, on this
machine or over SSH) and applies the analysis's own test
(:func:`harness.analyze.recovery.recovery_measured`), so a phase cut here reads as measured
when the run is analysed.
"""

from __future__ import annotations

import pandas as pd

from harness.analyze.recovery import recovery_measured, step_clock
from harness.boxes.base import Box
from harness.boxes.local import LocalBox
from harness.card.schema import AnalysisSpec
from harness.errors import HarnessError
from harness.execute.soak import drain_local, drain_remote

__all__ = ["RecoveryWatch"]


class RecoveryWatch:
    """The ring of one run so far, and whether the current shift's recovery is measured."""

    def __init__(self, box: Box, python: str, ring_path: str, spec: AnalysisSpec) -> None:
        self.box = box
        self.python = python
        self.ring_path = ring_path
        self.spec = spec
        self.after = 0
        self.frames: list[pd.DataFrame] = []
        self.checks = 0

    def _drain(self) -> None:
        if isinstance(self.box, LocalBox):
            result = drain_local(self.ring_path, self.after)
        else:
            result = drain_remote(self.box, self.python, self.ring_path, self.after)
        self.after = result.after_sequence
        if len(result.frame):
            self.frames.append(result.frame)

    def measured(self, phase_index: int) -> bool:
        """Whether the shift into ``phase_index`` has recovered and held, read now. A ring that
        cannot be read (not there yet, torn) says no: the extension's cap still ends the phase."""
        self.checks += 1
        try:
            self._drain()
        except (FileNotFoundError, HarnessError):
            return False
        if not self.frames:
            return False
        frame = (
            pd.concat(self.frames, ignore_index=True) if len(self.frames) > 1 else self.frames[0]
        )
        self.frames = [frame]
        try:
            return recovery_measured(
                frame, phase_index, self.spec.window_s,
                converged_span_s=self.spec.converged_span_s, hold_s=self.spec.hold_s,
                steps=step_clock(self.spec),
            )  # fmt: skip
        except HarnessError:
            return False
