"""Runtimes a killed harness left running: journalled at boot, stopped on resume if still theirs.

A process group is identified by its PGID and the start time ``ps`` reports for it, so a resume
never signals a recycled PID that now names another process.
"""

from __future__ import annotations

import contextlib

from harness.boxes.base import Box
from harness.errors import HarnessError
from harness.formats.records import Journal


def orphan_identity(box: Box, pid: int) -> str:
    """The start time ``ps`` reports for ``pid`` ('' when gone): with the PID, an identity that a
    recycled PID does not share."""
    result = box.sh(f"ps -o lstart= -p {int(pid)} 2>/dev/null", check=False)
    return result.stdout.strip()


def journal_boot(journal: Journal, box: Box, box_name: str, run_id: str, pgid: int) -> None:
    """Journal a started runtime's group with its identity, so a resume can stop it."""
    identity = ""
    with contextlib.suppress(HarnessError, OSError):
        identity = orphan_identity(box, pgid)
    journal.append("boot", run_id=run_id, pgid=pgid, identity=identity, box=box_name)


def kill_orphan(box: Box, pgid: int, identity: str) -> bool:
    """SIGKILL a runtime group left by a killed harness, if ``pgid`` still is that runtime."""
    if not identity or orphan_identity(box, pgid) != identity:
        return False
    box.signal_group(pgid, "KILL")
    return box.wait_group_gone(pgid, 5.0)
