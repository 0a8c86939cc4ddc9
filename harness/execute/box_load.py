"""Read the box's load and time a reference step on it: before a run boots and after it ends.

One box command per reading: the box's own Python (the one that runs the reference runtime, or
``python3`` over SSH) prints its 1-minute load average and CPU count (``os.getloadavg``,
``os.cpu_count``: Linux and macOS alike), the tasks runnable beside itself (``/proc/loadavg``'s
fourth field, Linux only, sampled six times across the step and the median kept), and the time
of a fixed pure-Python loop (:data:`REFERENCE`, the fastest of five repeats, ~20 ms each on a
2-core x86 box: the machine's speed, less a stray interruption). ``run.json`` keeps both under
``runtime.box_load`` (``before``, ``after``); :mod:`harness.analyze.box_load` reads them. A
reading that fails is ``{"error": why}``, never a failed run: the load is evidence about the
measurement, not the measurement.

Why the runnable count and not only the load average: the 1-minute average before a run still
holds most of the previous run's own work (it decays as e^(-t/60 s)), so it cannot tell other
tenants from the harness; the tasks runnable before the boot, the reading's own left out, can.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from harness.boxes.base import Box
from harness.errors import HarnessError

# The reference step's identity: readings of different steps are never compared. Changing the
# loop below is a new name.
REFERENCE = "python-loop-150k-min-of-5"

# One quoted argument of one box command; it reads nothing but /proc/loadavg and writes nothing.
_SCRIPT = """\
import json, os, time
def runnable():
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0]) - 1
    except (OSError, ValueError, IndexError):
        return None
counts, times = [], []
for _ in range(5):
    counts.append(runnable())
    start, x = time.perf_counter(), 0
    for i in range(150000):
        x = (x + i * i) % 1000003
    times.append((time.perf_counter() - start) * 1e3)
counts.append(runnable())
seen = sorted(c for c in counts if c is not None)
print(json.dumps({"load_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
    "runnable": seen[len(seen) // 2] if seen else None, "reference_ms": min(times)}))
"""

_FIELDS = ("load_1m", "cpus", "runnable", "reference_ms")


def read_box_load(box: Box, python: str) -> dict[str, Any]:
    """One reading of the box's load and speed with ``python`` on it: ``load_1m``, ``cpus``,
    ``runnable`` (None where the box has no /proc), ``reference_ms`` and ``reference``; or
    ``{"error": why}`` when it could not be read."""
    command = f"{shlex.quote(python)} -c {shlex.quote(_SCRIPT)}"
    try:
        result = box.sh(command, timeout_s=10, check=False)
    except (OSError, HarnessError) as exc:
        # The box's message, not the script it echoes back.
        return {"error": f"not read: {str(exc).partition(': ' + command[:20])[0][:300]}"}
    if result.code != 0:
        why = (result.stderr.strip().splitlines() or [f"exit {result.code}"])[-1]
        return {"error": f"not read: {python} on the box: {why}"[:300]}
    try:
        values = json.loads(result.stdout.strip().splitlines()[-1])
        reading = {key: values[key] for key in _FIELDS}
    except (ValueError, KeyError, IndexError, TypeError):
        return {"error": f"not read: unexpected output {result.stdout[:120]!r}"}
    reading["reference"] = REFERENCE
    return reading


__all__ = ["REFERENCE", "read_box_load"]
