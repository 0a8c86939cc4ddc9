"""Runtimes a killed harness left running: journalled at boot, stopped on resume if still theirs.

A process group is identified by its PGID and the start time ``ps`` reports for it, so a resume
never signals a recycled PID that now names another process, and it is killed only when it is
provably ours: its processes carry the ``HARNESS_BOOT_DIR`` variable (:data:`BOOT_MARK`) with
the value ``boot_starting`` journalled for that boot. A journal line copying another group's
PGID and start time (planted, or from another tool) therefore kills nothing. A boot killed
before its group was journalled is found by its mark alone.
"""

from __future__ import annotations

import contextlib

from harness.boxes.base import Box
from harness.errors import HarnessError
from harness.formats.records import Journal

# The environment variable that marks a booted runtime with its run folder on the box.
BOOT_MARK = "HARNESS_BOOT_DIR"


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


def kill_orphan(box: Box, pgid: int, identity: str, mark: str | None) -> bool:
    """SIGKILL a runtime group left by a killed harness, if ``pgid`` still is that runtime: the
    same start time, and its processes marked with the boot's ``mark``."""
    if not identity or not mark or orphan_identity(box, pgid) != identity:
        return False
    if pgid not in box.groups_marked(BOOT_MARK, mark):
        return False
    box.signal_group(pgid, "KILL")
    return box.wait_group_gone(pgid, 5.0)


def stop_orphans(
    journal: Journal, box: Box, box_name: str, default_box: str, within: str
) -> list[int]:
    """SIGKILL every runtime ``journal`` saw booted on ``box_name`` and never saw stopped: by
    its group's identity, or by its mark when it was killed before its group was journalled.
    Each is journalled ``orphan_killed``. ``default_box`` is the box of events that name none
    (a journal written before fleets: the card's only box). Only marks that start with
    ``within`` (this campaign's folder on the box, ending in ``/``; or the name prefix of a
    collection's own boot folders), or name that folder itself, count: a journal line naming
    another folder's mark (another campaign's runtime) kills nothing. Returns the groups it
    killed."""
    killed: list[int] = []
    stopped = set()
    booted = []
    marks: dict[str, str] = {}  # boots started but never journalled with their group
    mark_of: dict[str, str] = {}  # every boot's mark, by run
    for event in journal.events():
        on_this_box = event.get("box", default_box) == box_name
        mark = event.get("mark")
        ours = (
            isinstance(mark, str)
            and (mark.startswith(within) or mark == within.rstrip("/"))
            and "/../" not in mark + "/"
        )
        if event.get("event") == "boot_starting" and on_this_box and ours:
            marks[str(event.get("run_id"))] = str(mark)
            mark_of[str(event.get("run_id"))] = str(mark)
        if event.get("event") == "boot" and on_this_box:
            booted.append(event)
            marks.pop(str(event.get("run_id")), None)
        elif event.get("event") == "boot_stopped":
            stopped.add((event.get("run_id"), event.get("pgid")))
    for run_id, mark in marks.items():
        with contextlib.suppress(HarnessError, OSError):
            for pgid in box.groups_marked(BOOT_MARK, mark):
                box.signal_group(pgid, "KILL")
                box.wait_group_gone(pgid, 5.0)
                journal.append("orphan_killed", run_id=run_id, pgid=pgid)
                killed.append(pgid)
    for event in booted:
        group = journalled_pgid(event.get("pgid"))
        if group is None or (event.get("run_id"), event.get("pgid")) in stopped:
            continue  # a group no harness could have journalled: nothing of ours to stop
        with contextlib.suppress(HarnessError, OSError):
            booted_mark = mark_of.get(str(event.get("run_id")))
            if kill_orphan(box, group, str(event.get("identity", "")), booted_mark):
                journal.append("orphan_killed", run_id=event.get("run_id"), pgid=group)
                killed.append(group)
    return killed


def journalled_pgid(value: object) -> int | None:
    """A journalled process group id, or None when the line cannot name one: not an integer
    (a mistyped or planted "abc", 1e3, true) or not above 1 (0 and 1 are no runtime's group,
    and a negative id would signal every group of the box)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value > 1 else None
