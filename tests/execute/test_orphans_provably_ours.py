"""A journal line alone kills nothing: `run --resume` and `collect` stop a group a killed harness
left only when its processes carry that boot's mark (HARNESS_BOOT_DIR, journalled with
`boot_starting`). Before, a planted `boot` line copying another group's PGID and `ps` start time
had that group SIGKILLed. Real processes here, each in a group of its own, stopped by PGID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.boxes.local import LocalBox
from harness.formats.records import Journal
from harness.profiles.box import BoxSpec
from harness.runtimes.orphans import BOOT_MARK, orphan_identity, stop_orphans


@contextlib.contextmanager
def _group(env: dict[str, str] | None = None) -> Iterator[int]:
    """A `sleep` in a process group of its own; killed by its PGID on the way out."""
    process = subprocess.Popen(
        ["sleep", "120"], start_new_session=True, env={**os.environ, **(env or {})}
    )
    try:
        yield process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _alive(pid: int) -> bool:
    return LocalBox("local", BoxSpec()).group_alive(pid)


def test_a_planted_boot_line_kills_nothing_and_a_marked_orphan_is_stopped(tmp_path: Path) -> None:
    box = LocalBox("local", BoxSpec())
    mark = str(tmp_path / "runs" / "0000-x")
    with _group() as stranger, _group({BOOT_MARK: mark}) as ours:
        journal = Journal(tmp_path / "journal.jsonl")
        # The adversary's line: a stranger's PGID and start time, as `ps` reports them.
        journal.append("boot", run_id="0001-y", pgid=stranger,
                       identity=orphan_identity(box, stranger), box="local")  # fmt: skip
        # A boot of ours with a mark that is not the stranger's either.
        journal.append("boot_starting", run_id="0002-z", box="local", mark=str(tmp_path / "z"))
        journal.append("boot", run_id="0002-z", pgid=stranger,
                       identity=orphan_identity(box, stranger), box="local")  # fmt: skip
        # Our own orphan: marked at boot with the mark its boot journalled.
        journal.append("boot_starting", run_id="0000-x", box="local", mark=mark)
        journal.append("boot", run_id="0000-x", pgid=ours,
                       identity=orphan_identity(box, ours), box="local")  # fmt: skip
        killed = stop_orphans(journal, box, "local", "local", f"{tmp_path}/runs/")
        assert killed == [ours]
        assert _alive(stranger), "a journal line alone must not kill a process group"
        assert not _alive(ours)


@pytest.mark.parametrize("identity", ["", "Thu Jan  1 00:00:00 1970"])
def test_an_orphan_whose_start_time_differs_is_left_alone(tmp_path: Path, identity: str) -> None:
    box = LocalBox("local", BoxSpec())
    mark = str(tmp_path / "runs" / "0000-x")
    with _group({BOOT_MARK: mark}) as pid:
        journal = Journal(tmp_path / "journal.jsonl")
        journal.append("boot_starting", run_id="0000-x", box="local", mark=mark)
        journal.append("boot", run_id="0000-x", pgid=pid, identity=identity, box="local")
        assert stop_orphans(journal, box, "local", "local", f"{tmp_path}/runs/") == []
        assert _alive(pid)


@pytest.mark.parametrize("pgid", ["abc", "123", 1.5, True, None, 0, 1, -1])
def test_a_mistyped_boot_line_is_skipped_not_a_traceback(tmp_path: Path, pgid: object) -> None:
    # A boot line whose pgid no harness wrote (a typo, a string, a float, a boolean, a group id
    # that is no runtime's) names nothing to stop: skipped, and the marked orphan beside it is
    # still stopped. Before, int("abc") raised ValueError out of run --resume (a traceback,
    # exit 1, which a CI reads as a failed gate).
    box = LocalBox("local", BoxSpec())
    mark = str(tmp_path / "runs" / "0000-x")
    with _group({BOOT_MARK: mark}) as ours:
        journal = Journal(tmp_path / "journal.jsonl")
        journal.append("boot_starting", run_id="0001-y", box="local", mark=str(tmp_path / "y"))
        journal.append("boot", run_id="0001-y", pgid=pgid, identity="", box="local")
        journal.append("boot_starting", run_id="0000-x", box="local", mark=mark)
        journal.append("boot", run_id="0000-x", pgid=ours,
                       identity=orphan_identity(box, ours), box="local")  # fmt: skip
        assert stop_orphans(journal, box, "local", "local", f"{tmp_path}/runs/") == [ours]
        assert not _alive(ours)


def test_a_mark_outside_this_campaigns_folder_kills_nothing(tmp_path: Path) -> None:
    # The mark is journalled, so a line appended to the journal could name another campaign's
    # runtime by its mark (its HARNESS_BOOT_DIR) and have it killed as an orphan of this one.
    # Only marks inside this campaign's folder on the box count now.
    box = LocalBox("local", BoxSpec())
    other = str(tmp_path / "other-campaign" / "runs" / "0000-x")
    with _group({BOOT_MARK: other}) as theirs:
        journal = Journal(tmp_path / "journal.jsonl")
        journal.append("boot_starting", run_id="0000-x", box="local", mark=other)
        sneaky = f"{tmp_path}/runs/../other-campaign/runs/0000-x"
        journal.append("boot_starting", run_id="0001-y", box="local", mark=sneaky)
        assert stop_orphans(journal, box, "local", "local", f"{tmp_path}/runs/") == []
        assert _alive(theirs)
