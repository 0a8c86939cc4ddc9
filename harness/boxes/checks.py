"""A preflight finding, and what every box's preflight shares (SSH and local boxes, slurm boxes).

The checks themselves live with what they check: :mod:`harness.execute.preflight` for a box and
its runtime, :mod:`harness.execute.slurm.preflight` for a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.profiles.schema import RuntimeProfile

__all__ = ["MIN_PYTHON", "Check", "uses_python"]

MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class Check:
    """One preflight finding: what was checked, whether it passed, what was seen, and the fix."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def uses_python(profile: RuntimeProfile) -> bool:
    """Whether the runtime's boot or version command runs the box's Python (``{python}``)."""
    templates = [
        *profile.boot.command,
        *profile.boot.env.values(),
        *(profile.version.command or []),
    ]
    return any("{python}" in item for item in templates)
