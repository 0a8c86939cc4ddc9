"""A sweep on a real Dask cluster on 127.0.0.1: the same rows as the local run, and a worker
killed mid-sweep loses no point. The scheduler and workers are the `dask` CLI's processes,
started here and stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pandas as pd
import pytest

from harness.card import load_card
from harness.sim.sweep.grid import run_sweep
from harness.sim.sweep.spec import grid_points, parse_axes
from harness.sim.trace_files import load_trace
from tests.conftest import REPO
from tests.sim.test_sweep import _setup

DASK = Path(sys.executable).parent / "dask"


def _free_port() -> int:
    """A port nothing listens on (for the unreachable-scheduler case only)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=20)


def _logs(logs: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(logs.iterdir())
    )


def _scheduler_address(scheduler: subprocess.Popen[bytes], scheduler_file: Path, logs: Path) -> str:
    """The address the scheduler bound: it picks its own port (no race with a port chosen here
    and taken by another test's server before the scheduler binds it) and writes it to a file."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if scheduler.poll() is not None:
            pytest.fail(f"the dask scheduler exited ({scheduler.returncode}):\n{_logs(logs)}")
        if scheduler_file.exists():
            try:
                return str(json.loads(scheduler_file.read_text())["address"])
            except (ValueError, KeyError):
                pass  # written but not yet whole
        time.sleep(0.2)
    pytest.fail(f"the dask scheduler wrote no address in 120 s:\n{_logs(logs)}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A scheduler and two single-threaded workers (no nanny: a killed worker stays dead)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # workers import this checkout's harness
    logs = tmp_path / "dask-logs"
    logs.mkdir()
    scheduler_file = tmp_path / "scheduler.json"
    started: list[subprocess.Popen[bytes]] = []
    files: list[IO[bytes]] = []

    def start(name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (logs / f"{name}.log").open("wb")
        files.append(log)
        process = subprocess.Popen([str(DASK), *args], env=env, stdout=log, stderr=log)
        started.append(process)
        return process

    try:
        scheduler = start(
            "scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--scheduler-file", str(scheduler_file), "--no-dashboard",
        )  # fmt: skip
        address = _scheduler_address(scheduler, scheduler_file, logs)
        flags = ("--host", "127.0.0.1", "--nthreads", "1", "--no-nanny", "--no-dashboard")
        workers = [
            start(f"worker{i}", "worker", address, *flags, "--name", f"w{i}") for i in range(2)
        ]
        from distributed import Client

        with Client(address, timeout=120) as client:
            try:
                client.wait_for_workers(2, timeout=180)
            except TimeoutError:
                pytest.fail(f"two dask workers did not join in 180 s:\n{_logs(logs)}")
        yield address, workers
    finally:
        for process in reversed(started):
            _stop(process)
        for log in files:
            log.close()


@pytest.mark.slow
def test_dask_sweep_equals_local_and_survives_a_lost_worker(
    tmp_path: Path, cluster: tuple[str, list[subprocess.Popen[bytes]]]
) -> None:
    address, workers = cluster
    card, paths = _setup(tmp_path)
    loaded = load_card(card)
    traces = [load_trace(p) for p in paths]
    points = grid_points(
        parse_axes(["drain_every=4,8,16,32,64", "swaps_per_layer=1,2,4", "hysteresis=0,0.5"])
    )
    local = run_sweep(loaded, traces, points, jobs=1)
    on_dask = run_sweep(loaded, traces, points, scheduler=address)
    pd.testing.assert_frame_equal(local.rows, on_dask.rows)
    pd.testing.assert_frame_equal(local.ladder, on_dask.ladder)

    from distributed import Client

    victim = workers[0]
    killed: list[int] = []
    with Client(address, timeout=30) as watcher:

        def kill_when_busy(done: int) -> None:
            # After the first result, wait until the victim holds a task, then kill it.
            if killed:
                return
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                processing = watcher.processing()
                busy = [w for w, keys in processing.items() if keys]
                mine = [w for w in busy if watcher.scheduler_info()["workers"][w]["name"] == "w0"]
                if mine:
                    break
                time.sleep(0.01)
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=20)
            killed.append(done)

        survived = run_sweep(loaded, traces, points, scheduler=address, on_result=kill_when_busy)
        assert killed and killed[0] < len(points) * len(traces)
        assert len(watcher.scheduler_info()["workers"]) == 1  # the victim is gone
    pd.testing.assert_frame_equal(local.rows, survived.rows)


@pytest.mark.slow  # the client retries the connection for its whole (shortened) timeout first
def test_an_unreachable_scheduler_is_an_infrastructure_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.sim.sweep.workers as sweep_run
    from harness.sim.sweep.workers import SweepError

    monkeypatch.setattr(sweep_run, "CONNECT_TIMEOUT_S", 2.0)  # the client retries this long
    card, paths = _setup(tmp_path)
    with pytest.raises(SweepError, match="cannot reach the Dask scheduler"):
        run_sweep(
            load_card(card),
            [load_trace(paths[0])],
            grid_points([]),
            scheduler=f"tcp://127.0.0.1:{_free_port()}",
        )
