"""Progress display for ``harness run``: a rich bar, or plain lines with ``--quiet``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from harness.execute.drive import RequestResult
from harness.execute.run import ProgressCallback
from harness.plan import Plan, Run


@contextmanager
def make_progress(plan: Plan, *, quiet: bool, out: TextIO) -> Iterator[ProgressCallback]:
    """A progress callback for the runner; the bar shows runs done, ETA and current tokens/s."""
    console = Console(file=out, highlight=False)
    if quiet:

        def plain(event: str, run: Run | None, info: dict[str, Any]) -> None:
            if event == "end" and run is not None and info.get("status") != "ok":
                console.print(f"run {run.run_id}: {info.get('status')}: {info.get('reason')}")

        yield plain
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[rate]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("runs", total=len(plan.runs), rate="")
        # The rate counts from the first scored request's start: boot and warmup are no decode.
        state: dict[str, float | None] = {"tokens": 0, "start": None}

        def update(event: str, run: Run | None, info: dict[str, Any]) -> None:
            if run is None:
                return
            if event == "start":
                state["tokens"], state["start"] = 0, None
                bar.update(task, description=f"{run.run_id}", rate="booting")
            elif event == "request":
                result: RequestResult = info["result"]
                if result.ok and not result.warmup:
                    now = time.perf_counter()
                    start = state["start"]
                    if start is None:
                        start = state["start"] = now - (result.e2el_s or 0.0)
                    tokens = (state["tokens"] or 0) + (result.completion_tokens or 0)
                    state["tokens"] = tokens
                    elapsed = now - start
                    bar.update(task, rate=f"{tokens / max(elapsed, 1e-9):.0f} tok/s")
            elif event in ("end", "skip"):
                bar.advance(task)
                if event == "end" and info.get("status") != "ok":
                    bar.console.print(f"run {run.run_id}: {info['status']}: {info['reason']}")

        yield update
