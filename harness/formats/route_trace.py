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
import os
import shutil
from pathlib import Path
from typing import Any

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
    reset: dict[str, Any] | None = None
    after = 0
    with open(source, "rb") as handle:
        first = handle.readline()
        if first.startswith(_HEADER_PREFIX):
            for line in iter(handle.readline, b""):
                if line.startswith(_RESET_PREFIX) and line.endswith(b"\n"):
                    reset = json.loads(line)
                    after = handle.tell()
    dest.parent.mkdir(parents=True, exist_ok=True)
    if reset is None:
        shutil.copyfile(source, dest)
        return None
    step = int(reset["step"])
    head = {**json.loads(first), "knobs": reset["knobs"], "hot": reset["hot"]}
    head["after_reset_step"] = step
    with open(source, "rb") as handle, open(dest, "wb") as out:
        out.write(json.dumps(head, separators=(",", ":")).encode() + b"\n")
        handle.seek(after)
        shutil.copyfileobj(handle, out, 1 << 20)
    return step


def slice_after_last_reset(path: Path) -> int | None:
    """Cut ``path`` in place to what a run keeps of it (:func:`write_run_part`); a file with no
    reset is left as it is."""
    tmp = path.with_name(path.name + ".tmp")
    step = write_run_part(path, tmp)
    if step is None:
        tmp.unlink()
        return None
    os.replace(tmp, path)
    return step
