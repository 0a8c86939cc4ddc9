"""Stop signals for an asyncio drive: the signal cancels the drive's task, and
:class:`~harness.boxes.interrupts.Interrupted` is raised once the event loop has wound down.

Raised where it lands, the interrupt would land in whichever task's callback was running (an
HTTP client's body writer) and end up in that task, printed at exit as "Task exception was never
retrieved". Apart from :mod:`harness.boxes.interrupts` so that a command which drives nothing
(``harness --help``, ``validate``) never imports asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from harness.boxes.interrupts import CANCELLERS, Interrupted

T = TypeVar("T")

__all__ = ["run_async"]


class _Drive:
    """An event loop :func:`run_async` runs in one thread, its main task, and the stop it got."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop = loop
        self.task = task
        self.signum: int | None = None

    def cancel(self, signum: int) -> bool:
        """Cancel the drive for ``signum``; always True (there was one)."""
        self.signum = signum
        # Thread-safe and signal-safe: it queues the cancel and wakes the loop through its pipe.
        with contextlib.suppress(RuntimeError):  # the loop closed already: run_async raises it
            self.loop.call_soon_threadsafe(self.task.cancel)
        return True


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, where a stop signal cancels ``coro`` and then raises
    :class:`Interrupted` (in a fleet's worker thread, the interrupt
    :func:`~harness.boxes.interrupts.interrupt_worker` forwards does the same)."""
    ident = threading.get_ident()
    drives: dict[int, _Drive] = {}

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        drive = drives[ident] = _Drive(asyncio.get_running_loop(), task)
        CANCELLERS[ident] = drive.cancel
        return await coro

    try:
        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            running = drives.get(ident)
            if running is not None and running.signum is not None:
                raise Interrupted(running.signum) from None
            raise
    finally:
        CANCELLERS.pop(ident, None)
        running = drives.pop(ident, None)
    if running is not None and running.signum is not None:
        raise Interrupted(running.signum)  # it came as the drive finished
    return result
