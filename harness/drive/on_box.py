"""The workload driver's entry point on a box (``drive: on-box``): a job in on stdin, results out.

The harness ships its own package as a zip (:mod:`.drive_remote`) and runs it with the box's
``python``; this module is what that zip's ``__main__`` calls. It imports only the driver
(:mod:`harness.drive.client` and what it needs: :mod:`harness.errors`, :mod:`.tunnel`), so the
box needs Python 3.11 and aiohttp, nothing else of the harness's dependencies.

One JSON object a line, each way::

    box -> {"hello": {"pid", "pgid", "python", "aiohttp", "harness"}}   or {"error", "missing"}
    harness -> {"ping": 0}          box -> {"pong": <the box's perf_counter>}
    harness -> {"job": {"spec", "phases", "phase_live", "live_path", "live_headers", "origin",
                        "mark_first"}}
    box -> {"result": {...}, "seq": n}   one per request, as it completes
    box -> {"end": {"order": [seq...], "first_after_boot": [seq...], "hung": null or message}}
    box -> {"error": message, "kind": "live" or "crash"}   instead of "end", on a failure

The ping lets the harness translate its time origin into the box's ``perf_counter``, so a run
driven in pieces keeps one time axis whatever the two clocks say. The end of stdin at any moment
(the harness was interrupted, killed, or lost the connection) cancels the drive and exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import IO, Any

EXIT_MISSING = 3
EXIT_CANCELLED = 130

Emit = Callable[[dict[str, Any]], None]


class _LiveRejected(Exception):
    """The runtime refused a phase's live knob (not a connection failure: a wrong request)."""


def main() -> int:
    """Run one drive as the harness asks on stdin; the exit status says how it ended."""
    out = sys.stdout

    def emit(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, separators=(",", ":")) + "\n")
        out.flush()

    try:
        import aiohttp
    except ImportError as exc:
        emit({"error": f"cannot import aiohttp: {exc}", "missing": "aiohttp"})
        return EXIT_MISSING
    from harness.version import PACKAGE_DIR

    hello = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "python": sys.version.split()[0],
        "aiohttp": aiohttp.__version__,
        "harness": str(PACKAGE_DIR / "__init__.py"),
    }
    emit({"hello": hello})
    stdin = sys.stdin.buffer
    if not stdin.readline():
        return 0  # a check only (the harness asked for the hello and closed)
    emit({"pong": time.perf_counter()})
    line = stdin.readline()
    if not line:
        return 0
    job = json.loads(line)["job"]
    try:
        return asyncio.run(_run(job, emit, stdin))
    except asyncio.CancelledError:
        return EXIT_CANCELLED
    except Exception as exc:  # a bug or a bad job: say what, with the traceback on stderr
        traceback.print_exc()
        emit({"error": f"{type(exc).__name__}: {exc}", "kind": "crash"})
        return 1


def _watch_stdin(
    stdin: IO[bytes], loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]
) -> None:
    """Cancel the drive when stdin ends: nobody is left to read its results."""
    fd = stdin.fileno()
    while os.read(fd, 65536):
        pass
    loop.call_soon_threadsafe(task.cancel)


async def _run(job: dict[str, Any], emit: Emit, stdin: IO[bytes]) -> int:
    import aiohttp

    from harness.drive.client import DriveSpec, PhasePlan, RequestResult, RuntimeHung, WorkItem
    from harness.drive.client import drive as run_drive

    task = asyncio.current_task()
    assert task is not None
    watcher = threading.Thread(
        target=_watch_stdin, args=(stdin, asyncio.get_running_loop(), task), daemon=True
    )
    watcher.start()
    spec = DriveSpec(**job["spec"])
    phases = [
        PhasePlan(
            name=phase["name"],
            index=phase["index"],
            items=tuple(WorkItem(**_item(item)) for item in phase["items"]),
            duration_s=phase["duration_s"],
        )
        for phase in job["phases"]
    ]
    live = {id(phase): body for phase, body in zip(phases, job["phase_live"], strict=True)}
    live_path = job["live_path"]
    live_headers = dict(job.get("live_headers") or {})  # the boot's admin token
    seqs: dict[int, int] = {}

    def on_result(result: RequestResult) -> None:
        seqs[id(result)] = len(seqs)
        emit({"result": dataclasses.asdict(result), "seq": seqs[id(result)]})

    async def on_phase(phase: PhasePlan) -> None:
        body = live.get(id(phase))
        if body is None or live_path is None:
            return
        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    spec.base_url + live_path, json=body, timeout=timeout, headers=live_headers
                ) as response,
            ):
                if response.status != 200:
                    text = await response.text()
                    try:
                        shown: Any = json.loads(text) if text else None
                    except json.JSONDecodeError:
                        shown = text
                    raise _LiveRejected(
                        f"live knobs {body} rejected: HTTP {response.status}: {shown}"
                    )
        except (aiohttp.ClientError, OSError, TimeoutError):
            return  # a dead runtime: the phase's requests fail and say why, as in the harness

    hung = None
    try:
        results = await run_drive(
            spec,
            phases,
            on_phase=on_phase,
            on_result=on_result,
            origin=job["origin"],
            mark_first=job["mark_first"],
        )
    except RuntimeHung as exc:
        results, hung = exc.results, exc.message
    except _LiveRejected as exc:
        emit({"error": str(exc), "kind": "live"})
        return 1
    for result in results:
        if id(result) not in seqs:
            on_result(result)  # every result goes through on_result; this keeps the order whole
    emit(
        {
            "end": {
                "order": [seqs[id(r)] for r in results],
                "first_after_boot": [seqs[id(r)] for r in results if r.first_after_boot],
                "hung": hung,
            }
        }
    )
    return 0


def _item(raw: dict[str, Any]) -> dict[str, Any]:
    """A work item's fields from JSON (its messages back to a tuple)."""
    if raw.get("messages") is not None:
        raw = {**raw, "messages": tuple(raw["messages"])}
    return raw
