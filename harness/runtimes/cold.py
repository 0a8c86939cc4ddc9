"""The cold cache state: a runtime's files dropped from the page cache before a run boots.

A profile's ``cache_files`` name what a cold run must read from storage again (model weights,
the reference runtime's slow tier). Some runtimes write those files at their first boot, so a
cold run with no boot before it on its box (cold first in ``design.cache_states``, or a Slurm
job's fresh folder) would find nothing to evict. It then boots the cell once and stops it —
a *priming* boot, journalled like any other so a killed harness's resume stops it — and evicts
what that boot wrote. A run is never let run warm in place of cold: nothing to evict even after
priming fails it, and so does a box that cannot drop its page cache.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.boxes.base import Box
from harness.errors import InfrastructureError
from harness.formats.records import Journal
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import BootSpec, boot, render
from harness.runtimes.orphans import BOOT_MARK, journal_boot

__all__ = ["BOOT_MARK", "evict_for_cold_run"]


def _prime(
    box: Box, profile: RuntimeProfile, spec: BootSpec, journal: Journal, run_id: str, where: str
) -> None:
    """Boot ``spec`` once, until ready, and stop it: the files it writes at boot now exist."""
    journal.append("cache_priming", run_id=run_id, box=where, run_dir=spec.run_dir)
    spec.env[BOOT_MARK] = spec.run_dir
    journal.append("boot_starting", run_id=run_id, box=where, mark=spec.run_dir)

    def started(pgid: int) -> None:
        journal_boot(journal, box, where, run_id, pgid)

    runtime = boot(box, profile, spec, started)  # stops the group itself if the boot fails
    if runtime.stop():
        journal.append("boot_stopped", run_id=run_id, pgid=runtime.pgid)


def evict_for_cold_run(
    box: Box,
    profile: RuntimeProfile,
    run_dir: str,
    make_spec: Callable[[int, str], BootSpec],
    *,
    cache_dir: str,
    python: str,
    journal: Journal,
    run_id: str,
    box_name: str,
) -> list[str]:
    """Drop the profile's ``cache_files`` from the box's page cache; the files evicted.

    ``make_spec(port, run_dir)`` is the run's cell as a boot: a priming boot, when one is
    needed, runs it in a folder of its own (``<run_dir>/prime``) on a fresh port.
    """
    context = {
        "run_dir": run_dir,
        "python": python,
        "cache_dir": cache_dir,
        "port": 0,
        "bind_host": box.bind_host,
    }
    patterns = [render(p, context) for p in profile.cache_files]
    files = box.glob(patterns)
    primed = False
    if not files and profile.driver is None and patterns:
        priming = make_spec(box.free_port(), f"{run_dir}/prime")
        _prime(box, profile, priming, journal, run_id, box_name)
        primed = True
        files = box.glob(patterns)
    if not files:
        after = " even after a priming boot of the cell" if primed else ""
        raise InfrastructureError(
            f"cold run could not evict: no file matched {', '.join(patterns) or '(none)'} (the "
            f"profile's cache_files) on box {box_name}{after}; fix the profile's cache_files so "
            "they name the files the runtime reads at boot"
        )
    if not box.evict_from_page_cache(files):
        raise InfrastructureError(
            f"box {box_name}: cannot drop {len(files)} runtime files from the page cache "
            "(cold state); on macOS allow `sudo -n purge`"
        )
    return files
