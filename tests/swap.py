"""Real swap-out on this machine: a small swap file and a process that swaps continuously.

A memory cgroup capped well below what its one process touches makes the kernel page that
process out to swap, so ``pswpout`` in /proc/vmstat grows while the rest of the machine, far
from any memory pressure, is untouched. Needs root, ``swapon`` on a file, and a cgroup memory
controller (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``); tests skip where a sandbox
refuses one of them. Everything is undone on exit: the process stopped by its PID, the cgroup
removed, the swap file switched off and deleted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")
SWAPPER = """
import os, sys, time
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
block = bytearray(48 << 20)
while True:
    for i in range(0, len(block), 4096):
        block[i] = (block[i] + 1) & 255
    time.sleep(0.05)
"""


def pswpout() -> int:
    for line in Path("/proc/vmstat").read_text(encoding="utf-8").splitlines():
        if line.startswith("pswpout "):
            return int(line.split()[1])
    return 0


def _cgroup(name: str) -> tuple[Path, Path]:
    """A fresh memory cgroup capped at 16 MiB: its folder and its ``cgroup.procs``."""
    if (CGROUP_V1 / "memory.limit_in_bytes").is_file():
        group = CGROUP_V1 / name
        limit = "memory.limit_in_bytes"
    elif "memory" in (CGROUP_V2 / "cgroup.controllers").read_text(encoding="utf-8").split():
        group = CGROUP_V2 / name
        limit = "memory.max"
    else:
        raise OSError("no cgroup memory controller")
    group.mkdir()
    (group / limit).write_text(str(16 << 20), encoding="utf-8")
    return group, group / "cgroup.procs"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:  # no util-linux here: a refusal like any other
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]} not installed")


@contextlib.contextmanager
def swapping(folder: Path) -> Iterator[int]:
    """A process swapping out until the block ends; yields its PID once pages have gone out."""
    if os.geteuid() != 0:
        pytest.skip("real swap-out needs root (swapon, a memory cgroup)")
    swapfile = folder / "swapfile"
    with swapfile.open("wb") as out:
        out.write(b"\0" * (64 << 20))  # written, not sparse: swapon refuses a file with holes
    swapfile.chmod(0o600)
    made = _run("mkswap", str(swapfile))
    on = _run("swapon", str(swapfile)) if made.returncode == 0 else made
    if on.returncode != 0:
        swapfile.unlink()
        pytest.skip(f"this machine refuses a swap file: {on.stderr.strip() or on.stdout.strip()}")
    group: Path | None = None
    swapper: subprocess.Popen[bytes] | None = None
    try:
        try:
            group, procs = _cgroup(f"harness-swap-{os.getpid()}")
        except OSError as exc:
            pytest.skip(f"no memory cgroup to cap a process in: {exc}")
        before = pswpout()
        swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(procs)])
        deadline = time.monotonic() + 30
        while pswpout() == before:
            if swapper.poll() is not None or time.monotonic() > deadline:
                pytest.skip("a process capped at 16 MiB touching 48 MiB did not swap here")
            time.sleep(0.1)
        yield swapper.pid
    finally:
        if swapper is not None:
            swapper.kill()
            swapper.wait(timeout=30)
        if group is not None:
            for _ in range(50):  # the cgroup is removable once its last process is reaped
                with contextlib.suppress(OSError):
                    group.rmdir()
                    break
                time.sleep(0.1)
        _run("swapoff", str(swapfile))
        swapfile.unlink()
