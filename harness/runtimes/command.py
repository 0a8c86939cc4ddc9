"""The command driver: a runtime measured by its own benchmark binary, one process per run.

The command is started like a boot (its own process group, knobs as env or flags, stderr to
``server.log``) inside a small ``sh`` wrapper that sends its stdout to a file and writes its exit
status, so the runner can tell a crash from a result. It is waited for up to the driver's time
limit, then stopped as the profile says. Its table (stdout, or the file the profile names) is
parsed by header name (:mod:`harness.formats.bench_table`) into ``bench.parquet``, one row per
result row, one column per mapped metric; the raw table is kept beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.boxes.base import Box, quote_path
from harness.boxes.interrupts import deferred
from harness.errors import RecordError, RuntimeBootError
from harness.formats.bench_table import map_result_rows, parse_result_rows
from harness.formats.records import write_parquet
from harness.profiles.schema import CommandDriver, RuntimeProfile
from harness.runtimes.boot import BootSpec, RunningRuntime, render

# `sh -c WRAPPER sh OUT RC argv…`: run argv with stdout to OUT, then record its exit status in RC.
_WRAPPER = 'out=$1; rc=$2; shift 2; "$@" >"$out"; echo $? >"$rc"'
POLL_S = 0.2


@dataclass
class CommandRun:
    """A started command: the runtime-like handle the runner stops, and where it writes."""

    runtime: RunningRuntime
    stdout_path: str
    status_path: str
    result_path: str


def start_command(
    box: Box,
    profile: RuntimeProfile,
    spec: BootSpec,
    on_started: Callable[[int], None] | None = None,
) -> CommandRun:
    """Start the driver's command in its own process group; nothing to wait for."""
    driver = _driver(profile)
    stdout_path = f"{spec.run_dir}/command.stdout"
    status_path = f"{spec.run_dir}/command.status"
    context = {"run_dir": spec.run_dir, "port": spec.port}
    result_path = render(driver.result_path, context) if driver.result_path else stdout_path
    argv = ["sh", "-c", _WRAPPER, "sh", stdout_path, status_path, *spec.argv]
    box.mkdirs(spec.run_dir)
    if profile.logit_dumps is not None:
        # ds4-bench fopen()s its frontier files inside the folder it is given and never creates
        # it: without this the run dies after the first prefill ("No such file or directory").
        box.mkdirs(render(profile.logit_dumps.path, context))
    with deferred():  # a stop signal here would leave a process nobody knows of
        pgid = box.start_background(argv, spec.env, spec.cwd, spec.log_path)
        if on_started is not None:
            on_started(pgid)
    runtime = RunningRuntime(box=box, profile=profile, spec=spec, pgid=pgid, base_url="")
    return CommandRun(runtime, stdout_path, status_path, result_path)


def wait_command(
    command: CommandRun, timeout_s: float, should_abort: Callable[[], str | None] | None = None
) -> None:
    """Wait for the command to exit; RuntimeBootError past ``timeout_s``, on a non-zero exit or
    when ``should_abort`` names a reason (a guard), with the log tail."""
    runtime = command.runtime
    started = time.monotonic()
    while runtime.box.group_alive(runtime.pgid):
        reason = should_abort() if should_abort is not None else None
        if reason is None and time.monotonic() - started > timeout_s:
            reason = f"past the time limit of {timeout_s:g} s"
        if reason is not None:
            runtime.stop()
            raise RuntimeBootError(
                f"{runtime.profile.name} stopped: {reason}; log tail:\n{runtime.log_tail()}"
            )
        time.sleep(POLL_S)
    text = runtime.box.read_text(command.status_path).strip()
    if text != "0":
        status = f"exit status {text}" if text else "no exit status (killed)"
        raise RuntimeBootError(
            f"{runtime.profile.name} command failed ({status}); log tail:\n{runtime.log_tail()}"
        )


def collect_result(command: CommandRun, local_dir: Path) -> int:
    """Fetch the command's table, keep it raw and as ``bench.parquet``; the rows kept."""
    runtime = command.runtime
    driver = _driver(runtime.profile)
    if not runtime.box.exists(command.result_path):
        raise RecordError(f"the command wrote no result at {command.result_path}")
    raw = local_dir / f"result.{driver.result}"
    runtime.box.get_file(command.result_path, raw)
    where = f"{raw} (from {quote_path(command.result_path)})"
    rows = parse_result_rows(
        raw.read_text(encoding="utf-8", errors="replace"), driver.result, where
    )
    frame = map_result_rows(
        rows, driver.columns, where=where, keep=driver.where, scale=driver.scale(), tier=driver.tier
    )
    write_parquet(frame, local_dir / "bench.parquet")
    return len(frame)


def _driver(profile: RuntimeProfile) -> CommandDriver:
    if profile.driver is None:
        raise RecordError(f"runtime {profile.name} has no command driver")
    return profile.driver
