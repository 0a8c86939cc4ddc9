"""Progress display for ``harness run``: a rich bar, or plain lines with ``--quiet``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from harness.drive.client import RequestResult
from harness.execute.scope import ProgressCallback
from harness.plan.build import Plan, Run


@contextmanager
def make_progress(plan: Plan, *, quiet: bool, out: TextIO) -> Iterator[ProgressCallback]:
    """A progress callback for the runner; the bar shows runs done, ETA and current tokens/s,
    and a fleet a line per box besides."""
    console = Console(file=out, highlight=False)
    if quiet:

        def plain(event: str, run: Run | None, info: dict[str, Any]) -> None:
            if event == "fleet":
                for name, why in info.get("dropped", {}).items():
                    console.print(f"box {name} dropped: {why}")
            if event == "end" and run is not None and info.get("status") != "ok":
                where = f" on {info['box']}" if "box" in info else ""
                console.print(
                    f"run {run.run_id}{where}: {info.get('status')}: {info.get('reason')}"
                )

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
        # A fleet adds a line per box (its current run, done/total, ETA); the first line stays
        # the whole campaign's.
        lines: dict[str, TaskID] = {}
        # The rate counts from the first scored request's start: boot and warmup are no decode.
        rates: dict[str, dict[str, float | None]] = {}

        def update(event: str, run: Run | None, info: dict[str, Any]) -> None:
            box = str(info.get("box", ""))
            if event == "fleet":
                for name, runs in info["shares"].items():
                    lines[name] = bar.add_task(f"  {name}", total=runs, rate="")
                for name, why in info.get("dropped", {}).items():
                    bar.console.print(f"box {name} dropped: {why}")
                return
            if run is None:
                return
            line = lines.get(box, task)
            state = rates.setdefault(box, {"tokens": 0, "start": None})
            if event == "start":
                state["tokens"], state["start"] = 0, None
                label = f"  {box}: {run.run_id}" if box in lines else run.run_id
                bar.update(line, description=label, rate="booting")
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
                    bar.update(line, rate=f"{tokens / max(elapsed, 1e-9):.0f} tok/s")
            elif event in ("end", "skip"):
                bar.advance(task)
                if line != task:
                    bar.advance(line)
                if event == "end" and info.get("status") != "ok":
                    where = f" on {box}" if box in lines else ""
                    bar.console.print(
                        f"run {run.run_id}{where}: {info['status']}: {info['reason']}"
                    )

        yield update
