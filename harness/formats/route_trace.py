"""A shared boot's route trace cut down to one run: the records after the run's ``reset``.

The reference runtime writes one ``--route-trace`` per boot (``harness.refbox.engine``
documents the records). On a shared boot (``design.boot`` per-cycle or per-campaign) that file
holds every run the boot carried, each one after a ``reset`` record. A run keeps only its own
part, headed like a boot of its own: the boot's header with the reset's knobs and hot sets. So
the run's trace replays in ``harness simulate`` as a fresh boot's does (a reset restores the boot
state: fresh adaptive state, the run's map), and a long shared boot's run folders stay the size
of per-block ones instead of each holding the whole boot so far.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from harness.formats.safe_write import atomic_binary_writer

__all__ = ["slice_after_last_reset", "write_run_part"]

# How the engine writes these lines (compact separators, "kind" first): a reset is found without
# parsing every step line, which is most of a large file.
_RESET_PREFIX = b'{"kind":"reset"'
_HEADER_PREFIX = b'{"kind":"header"'


def write_run_part(source: Path, dest: Path) -> int | None:
    """Write to ``dest`` what a run keeps of the boot's trace ``source``: the header (with the
    last reset's knobs and hot sets) and the records after that reset. Returns the reset's step;
    None when there is no reset or ``source`` is not a reference runtime trace, and then
    ``dest`` is a plain copy."""
    head, after = _last_reset(source)
    return _write_part(source, dest, head, after)


def slice_after_last_reset(path: Path) -> int | None:
    """Cut ``path`` in place to what a run keeps of it (:func:`write_run_part`); a file with no
    reset is left as it is."""
    head, after = _last_reset(path)
    return None if head is None else _write_part(path, path, head, after)


def _write_part(source: Path, dest: Path, head: dict[str, Any] | None, after: int) -> int | None:
    """``head`` (when there is one), then ``source`` from byte ``after`` on, into ``dest``
    (which may be ``source``: it is replaced only once written whole)."""
    with open(source, "rb") as handle, atomic_binary_writer(dest) as out:
        if head is not None:
            out.write(json.dumps(head, separators=(",", ":")).encode() + b"\n")
        handle.seek(after)
        shutil.copyfileobj(handle, out, 1 << 20)
    return None if head is None else int(head["after_reset_step"])


def _last_reset(source: Path) -> tuple[dict[str, Any] | None, int]:
    """The header a run's part starts with (the last reset's knobs and hot sets) and the offset
    of the records after that reset; (None, 0) when there is no reset to cut at."""
    reset: dict[str, Any] | None = None
    after = 0
    with open(source, "rb") as handle:
        first = handle.readline()
        if first.startswith(_HEADER_PREFIX):
            for line in iter(handle.readline, b""):
                if line.startswith(_RESET_PREFIX) and line.endswith(b"\n"):
                    reset = json.loads(line)
                    after = handle.tell()
    if reset is None:
        return None, 0
    head = {**json.loads(first), "knobs": reset["knobs"], "hot": reset["hot"]}
    head["after_reset_step"] = int(reset["step"])
    return head, after
