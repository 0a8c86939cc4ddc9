"""Opening a box: the :class:`~harness.boxes.base.Box` of a box spec, local or SSH."""

from __future__ import annotations

from harness.boxes.base import Box
from harness.boxes.local import LocalBox
from harness.boxes.ssh import SshBox
from harness.errors import BoxError
from harness.profiles.box import BoxSpec

__all__ = ["open_box"]


def open_box(name: str, spec: BoxSpec) -> Box:
    """The box for a spec."""
    if spec.kind == "local":
        return LocalBox(name, spec)
    if spec.kind == "slurm":
        # Its cohorts run as jobs on the cluster's nodes (execute/slurm); no shell to open.
        raise BoxError(
            f"box {name} is a slurm box: its cohorts run as Slurm jobs, not commands over a shell; "
            "run it through a campaign, or check it with `harness box check`"
        )
    return SshBox(name, spec, known_hosts=[spec.known_hosts] if spec.known_hosts else [])
