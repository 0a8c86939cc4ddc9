"""Where a sweep's tasks run: in this process, in local processes, or on a Dask cluster.

A task is one point on one trace (:class:`~harness.sim.sweep.evaluate.PointTask`); a point's row set
is complete when its traces are. Tasks are that fine so two processes stay busy to the end (27
points on 2 cores would leave one idle for the 27th). Every runner returns the same rows, in
task order, whatever order they finished in: the replay is deterministic and its result does not
depend on its thread count (``tests/sim/test_sim_replay.py``), so where a task ran cannot change it.

* **in process** (``jobs=1``): one task after another, each replay on every CPU's thread.
* **processes** (``jobs=N``): this process on a thread and N − 1 spawned workers, taking tasks
  from one queue; the traces are written once to ``.npy`` files that every worker maps
  copy-on-write (the page cache holds one copy, nothing is pickled per task), and each replay
  runs on one thread, the points being the parallelism.
* **Dask** (``scheduler="tcp://HOST:8786"``): the traces are scattered once to every worker
  (``broadcast``, so a worker lost mid-sweep leaves a replica behind), each task submitted
  against them, results gathered as they finish. A lost worker's tasks rerun elsewhere (the
  scheduler's own recovery); the rows are checked complete before they are returned.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import BadInput, InfrastructureError
from harness.sim.sweep.evaluate import PointTask, evaluate
from harness.sim.traces import Trace

__all__ = ["Progress", "SweepError", "default_jobs", "lean_trace", "run_tasks", "text_progress"]

Row = dict[str, Any]
Progress = Callable[[int, int], None]  # (tasks done, tasks in all)

_ARRAYS = ("experts", "steps", "prefill", "phase")
_SHARED: list[Trace] = []  # a worker process's traces, mapped by _load_shared
_RESUBMITS = 3  # times a task whose result was lost with its worker is submitted again
CONNECT_TIMEOUT_S = 30.0  # how long the Dask client keeps trying to reach the scheduler


class SweepError(InfrastructureError):
    """A sweep's tasks could not all be run (a cluster lost, a worker error)."""


def lean_trace(trace: Trace) -> Trace:
    """The trace's routing arrays only: what a replay reads, without the header or recorded
    decisions a worker does not need (the settings were resolved from them already)."""
    return Trace(
        path=trace.path,
        format=trace.format,
        experts=trace.experts,
        steps=trace.steps,
        prefill=trace.prefill,
        phase=trace.phase,
        experts_count=trace.experts_count,
    )


def _save_shared(traces: Sequence[Trace], folder: Path) -> None:
    for index, trace in enumerate(traces):
        for name in _ARRAYS:
            np.save(folder / f"{index}.{name}.npy", getattr(trace, name))
        (folder / f"{index}.meta").write_text(
            f"{trace.experts_count}\n{trace.format}\n{trace.path}\n", encoding="utf-8"
        )


def _load_shared(folder: str, count: int) -> None:
    """Pool initializer: map the traces the parent saved (shared page cache)."""
    _SHARED.clear()
    for index in range(count):
        # Copy-on-write maps: shared pages until written (never, here), and writable arrays,
        # which numba types as the parent's arrays are typed, so its cached machine code
        # serves them (a read-only array is another type: a compile in every worker).
        arrays = [
            np.asarray(np.load(Path(folder) / f"{index}.{name}.npy", mmap_mode="c"))
            for name in _ARRAYS
        ]
        experts_count, fmt, path = (
            (Path(folder) / f"{index}.meta").read_text(encoding="utf-8").splitlines()
        )
        experts, steps, prefill, phase = arrays
        _SHARED.append(Trace(path, fmt, experts, steps, prefill, phase, int(experts_count)))


def _run_shared(task: PointTask) -> Row:
    return evaluate(task, _SHARED[task.trace_index])


def _in_process(
    tasks: Sequence[PointTask], traces: Sequence[Trace], progress: Progress
) -> list[Row]:
    rows = []
    for done, task in enumerate(tasks, start=1):
        rows.append(evaluate(task, traces[task.trace_index]))
        progress(done, len(tasks))
    return rows


def _processes(
    tasks: Sequence[PointTask], traces: Sequence[Trace], jobs: int, progress: Progress
) -> list[Row]:
    """``jobs`` processes in all: this one, replaying on a thread, and ``jobs - 1`` spawned.

    A spawned worker needs seconds to import and load its compiled kernels before its first
    replay; this process has both already, so it replays from the first second and the workers
    join as they come up. Tasks are handed out from one queue, a few at a time to the pool, so
    whoever is free takes the next and no one is left holding a backlog at the end.
    """
    single = [replace(t, threads=1) for t in tasks]
    rows: list[Row | None] = [None] * len(tasks)
    queue = deque(range(len(single)))
    lock = threading.Lock()
    failure: list[BaseException] = []

    def take() -> int | None:
        with lock:
            return queue.popleft() if queue and not failure else None

    def replay_here() -> None:
        try:
            while (index := take()) is not None:
                task = single[index]
                rows[index] = evaluate(task, traces[task.trace_index])
        except BaseException as exc:  # handed to the main thread, which raises it
            failure.append(exc)

    with tempfile.TemporaryDirectory(prefix="harness-sweep-") as folder:
        _save_shared(traces, Path(folder))
        local = threading.Thread(target=replay_here, name="sweep-local", daemon=True)
        local.start()
        workers = jobs - 1
        # spawn, not fork: this process holds replay threads, and a forked copy of a
        # multi-threaded process can deadlock.
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=get_context("spawn"),
            initializer=_load_shared,
            initargs=(folder, len(traces)),
        ) as pool:
            futures: dict[Future[Row], int] = {}

            def refill() -> None:
                while len(futures) < 2 * workers and (index := take()) is not None:
                    futures[pool.submit(_run_shared, single[index])] = index

            refill()
            shown = 0
            while futures or local.is_alive():
                finished, _ = wait(list(futures), timeout=0.2, return_when=FIRST_COMPLETED)
                for future in finished:
                    rows[futures.pop(future)] = future.result()
                if failure:
                    raise failure[0]
                refill()
                done = sum(row is not None for row in rows)
                if done != shown:
                    shown = done
                    progress(done, len(tasks))
        local.join()
    if failure:
        raise failure[0]
    return _complete(rows)


def _complete(rows: Sequence[Row | None]) -> list[Row]:
    missing = [i for i, row in enumerate(rows) if row is None]
    if missing:
        raise SweepError(f"{len(missing)} sweep task(s) returned no result; run the sweep again")
    return [row for row in rows if row is not None]


def _dask(
    tasks: Sequence[PointTask],
    traces: Sequence[Trace],
    scheduler: str,
    progress: Progress,
    on_result: Callable[[int], None] | None,
) -> list[Row]:
    try:
        from distributed import Client  # type: ignore[import-untyped,unused-ignore]
        from distributed import as_completed as dask_completed
    except ImportError:  # pragma: no cover - a dependency of the package
        raise BadInput(
            "--scheduler needs the `distributed` package: pip install distributed"
        ) from None
    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as exc:
        raise SweepError(
            f"--scheduler {scheduler}: cannot reach the Dask scheduler ({exc}); "
            "start one with `dask scheduler` and workers with `dask worker ADDRESS`"
        ) from None
    rows: list[Row | None] = [None] * len(tasks)
    try:
        if not client.scheduler_info().get("workers"):
            client.wait_for_workers(1, timeout=60)
        scattered = client.scatter(list(traces), broadcast=True)  # type: ignore[no-untyped-call]

        def submit(index: int) -> Any:
            task = tasks[index]
            return client.submit(evaluate, task, scattered[task.trace_index], pure=False, retries=2)

        futures = {submit(i): i for i in range(len(tasks))}
        resubmitted = [0] * len(tasks)
        pending = dask_completed(list(futures))  # type: ignore[no-untyped-call]
        done = 0
        for future in pending:
            index = futures.pop(future)
            try:
                rows[index] = future.result()
            except Exception:
                # A worker that died takes with it the results it had not handed over, and
                # maybe the last replica of a trace (the scheduler's memory manager trims the
                # broadcast copies): the task's future reads as cancelled. Scatter a lost trace
                # again and submit the task again. An error of the task itself raises.
                if future.status == "error" or resubmitted[index] >= _RESUBMITS:
                    raise
                resubmitted[index] += 1
                trace = tasks[index].trace_index
                if scattered[trace].status != "finished":
                    scattered[trace] = client.scatter(  # type: ignore[no-untyped-call]
                        traces[trace], broadcast=True, hash=False
                    )
                again = submit(index)
                futures[again] = index
                pending.add(again)  # type: ignore[no-untyped-call]
                continue
            done += 1
            progress(done, len(tasks))
            if on_result is not None:
                on_result(done)
    except (OSError, TimeoutError) as exc:
        raise SweepError(f"--scheduler {scheduler}: the cluster failed mid-sweep ({exc})") from None
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return _complete(rows)


def run_tasks(
    tasks: Sequence[PointTask],
    traces: Sequence[Trace],
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    progress: Progress | None = None,
    on_result: Callable[[int], None] | None = None,
) -> list[Row]:
    """Every task's row, in task order; ``jobs`` local processes, or a Dask ``scheduler``.

    ``on_result(done)`` is called after each Dask result (the test kills a worker there)."""
    report = progress or (lambda done, total: None)
    lean = [lean_trace(t) for t in traces]
    if scheduler:
        return _dask(tasks, lean, scheduler, report, on_result)
    if jobs < 1:
        raise BadInput(f"--jobs must be at least 1, got {jobs}")
    if jobs == 1 or len(tasks) == 1:
        return _in_process(tasks, lean, report)
    return _processes(tasks, lean, min(jobs, len(tasks)), report)


def default_jobs() -> int:
    """One process per CPU this process may use."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def text_progress(stream: Any = sys.stderr) -> Progress:
    """A one-line progress bar on a terminal, a line per tenth of the tasks otherwise."""
    tty = bool(getattr(stream, "isatty", lambda: False)())
    shown = {"tenth": -1}

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks"
        if tty:
            stream.write("\r" + bar + ("\n" if done == total else ""))
            stream.flush()
        elif 10 * done // max(total, 1) > shown["tenth"]:
            shown["tenth"] = 10 * done // max(total, 1)
            stream.write(bar + "\n")

    return show
