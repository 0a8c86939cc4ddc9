"""One gate's outcome (shared by :mod:`harness.gate` and the gates in modules of their own)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GateResult"]


@dataclass
class GateResult:
    """One gate's outcome, with the reason and the evidence a reviewer needs."""

    kind: str
    name: str
    passed: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    # Failed only because runs it needs are missing or failed: resuming may settle it (exit 3),
    # where a failure on complete data is a verdict (exit 1).
    incomplete: bool = False
