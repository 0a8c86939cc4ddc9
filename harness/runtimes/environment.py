"""What a campaign's box is: host, OS, CPU, memory, GPU and runtime version, captured once.

Written to ``boxes/<box>.json`` of the campaign before its first run, so the report can say
what the numbers were measured on. An SSH box's capture also says where the driver ran
(``drive``) and the round-trip time of its tunnel beside that of the SSH channel
(``tunnel_rtt``): what a tunnelled drive adds to every TTFT.
"""

from __future__ import annotations

import time
from typing import Any

from harness.boxes.base import Box, quote_path
from harness.boxes.ssh import SshBox
from harness.card import LoadedCard
from harness.errors import BoxError
from harness.runtimes.boot import runtime_version
from harness.version import __version__


def capture_environment(box: Box, loaded: LoadedCard) -> dict[str, Any]:
    """Host, OS, CPU, memory, GPU, runtime version and the swap-out counter, once per campaign."""

    def text(command: str) -> str:
        return box.sh(command + " 2>/dev/null", check=False, timeout_s=60).stdout.strip()

    out = {
        "box": box.name,
        "kind": box.spec.kind,
        "platform": box.spec.platform,
        "host": text("uname -a"),
        "os": text("cat /etc/os-release || sw_vers"),
        "cpu": text("lscpu || sysctl -n machdep.cpu.brand_string"),
        "cpus": text("nproc || sysctl -n hw.ncpu"),
        "memory": text("grep MemTotal /proc/meminfo || sysctl -n hw.memsize"),
        "gpu": text(
            "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv "
            "|| system_profiler SPDisplaysDataType"
        ),
        "python": text(f"{quote_path(box.spec.python_path())} --version"),
        "harness_version": __version__,
        "runtime": runtime_version(box, loaded.runtime, box.spec.python_path()),
        "swapout_pages_at_start": box.swapout_pages(),
        "captured_at": time.time(),
    }
    if isinstance(box, SshBox):
        out["drive"] = box.spec.drive or "tunnel"
        try:
            out["tunnel_rtt"] = box.round_trips()
        except BoxError as exc:  # a capture records what it could not measure, and goes on
            out["tunnel_rtt"] = {"error": str(exc)}
    return out
