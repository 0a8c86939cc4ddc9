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

__all__ = ["RESET_PREFIX", "slice_after_last_reset"]

# How the engine writes a reset line (compact separators, "kind" first): found without parsing
# every step line, which is most of a large file.
RESET_PREFIX = b'{"kind":"reset"'
_HEADER_PREFIX = b'{"kind":"header"'


def slice_after_last_reset(path: Path) -> int | None:
    """Rewrite ``path`` to its header and the records after its last ``reset``; returns the
    reset's step, or None (the file left as it is) when it has no reset or is not a reference
    runtime trace."""
    header: dict[str, Any] | None = None
    reset: dict[str, Any] | None = None
    after = 0
    with open(path, "rb") as handle:
        first = handle.readline()
        if not first.startswith(_HEADER_PREFIX):
            return None
        header = json.loads(first)
        for line in iter(handle.readline, b""):
            if line.startswith(RESET_PREFIX) and line.endswith(b"\n"):
                reset = json.loads(line)
                after = handle.tell()
    if reset is None:
        return None
    step = int(reset["step"])
    head = {**header, "knobs": reset["knobs"], "hot": reset["hot"], "after_reset_step": step}
    tmp = path.with_name(path.name + ".tmp")
    with open(path, "rb") as source, open(tmp, "wb") as out:
        out.write(json.dumps(head, separators=(",", ":")).encode() + b"\n")
        source.seek(after)
        shutil.copyfileobj(source, out, 1 << 20)
    os.replace(tmp, path)
    return step
