"""One harness per campaign directory: an exclusive OS lock on the directory itself.

``flock`` on the open directory, not a marker file: the kernel drops it when its holder exits
however it exits (SIGKILL included), so a killed harness never leaves a directory stuck, and
deleting a file lets no second harness in. ``<dir>/.lock`` holds who took it (pid, host,
command, since) so that the second command can say who is in the way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from harness.errors import InfrastructureError

LOCK_FILE = ".lock"


class CampaignLocked(InfrastructureError):
    """Another harness holds the campaign directory (exit 3: wait for it, or stop it)."""


def _holder(handle: int) -> str:
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
        data = json.loads(os.pread(handle, 4096, 0).decode("utf-8"))
        if isinstance(data, dict):
            since = datetime.fromtimestamp(float(data.get("since", 0)), UTC)
            return (
                f"pid {data.get('pid')} on {data.get('host')}, `{data.get('command')}`, "
                f"since {since:%Y-%m-%d %H:%M:%S} UTC"
            )
    return "a process that has not said who it is yet"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise InfrastructureError(
            f"{path}: cannot open the campaign lock: {os.strerror(exc.errno or 0)}"
        ) from None


@contextlib.contextmanager
def campaign_lock(root: Path, command: str | None = None) -> Iterator[None]:
    """Hold ``root``'s lock for the block; :class:`CampaignLocked` naming the holder if taken.

    The lock is on the directory itself; ``.lock`` only says who holds it. Deleting the file
    (or replacing it) therefore lets no second harness in."""
    try:
        directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise InfrastructureError(
            f"{root}: cannot open the campaign directory to lock it: {os.strerror(exc.errno or 0)}"
        ) from None
    try:
        try:
            fcntl.flock(directory, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "a process that has not said who it is yet"
            with contextlib.suppress(InfrastructureError):
                handle = _open(root / LOCK_FILE)
                holder = _holder(handle)
                os.close(handle)
            raise CampaignLocked(
                f"{root}: another harness is using this campaign directory: {holder}; "
                "wait for it to end (or stop it), then run this again"
            ) from None
        handle = _open(root / LOCK_FILE)
        try:
            who = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": command or " ".join(["harness", *sys.argv[1:]]),
                "since": time.time(),
            }
            with contextlib.suppress(OSError):  # who holds it is a courtesy; the flock is the lock
                os.ftruncate(handle, 0)
                os.pwrite(handle, json.dumps(who).encode("utf-8"), 0)
            yield
        finally:
            os.close(handle)
    finally:
        os.close(directory)  # closing drops the flock


@contextlib.contextmanager
def locked_campaign(root: Path) -> Iterator[None]:
    """A campaign directory held for a command that writes into it (analysis, verdict, report):
    refused while another harness runs or reads it, so no one reads half of what one writes."""
    from harness.formats.records import open_campaign  # records loads pandas; a lock needs none

    open_campaign(root)  # not a campaign directory: said before a lock file is made in it
    with campaign_lock(root):
        yield


__all__ = ["LOCK_FILE", "CampaignLocked", "campaign_lock", "locked_campaign"]
