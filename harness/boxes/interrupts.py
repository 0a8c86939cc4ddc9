"""Stop signals: SIGTERM, SIGHUP and SIGINT end a harness command the way Ctrl-C does, once.

CI time limits, ``timeout``, Slurm and systemd stop a job with SIGTERM (SIGHUP when its terminal
goes away). Python's default for both is to die on the spot, which left the runtime the harness
had booted running. While :func:`stop_signals` is active, the first of the three raises
:class:`Interrupted` in the main thread. It is a ``KeyboardInterrupt``, so every path that
handles Ctrl-C (stop the runtime, journal the run interrupted) handles it too, and the command
exits 128 + the signal number: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, as a shell reports a process
killed by that signal.

Later signals are noted on stderr and ignored: a second SIGTERM from an impatient scheduler must
not cut the shutdown it interrupts (stopping the runtime, writing the run's records) in two.
Code that must not be cut in two either (starting a runtime and journalling its process group)
runs under :func:`deferred`: a signal arriving inside it is raised when it ends. A signal that is
ignored when the command starts (``nohup``, a background job's SIGINT) stays ignored.

An asyncio drive runs under :func:`harness.boxes.async_interrupts.run_async`, where the signal
cancels the drive's task instead (registered in :data:`CANCELLERS`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(self.name)

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """What the command exits with: 128 + the signal number, as a shell reports it."""
        return 128 + self.signum


def describe(exc: KeyboardInterrupt) -> str:
    """How a run was interrupted, for its reason: ``SIGTERM``, or ``Ctrl-C`` for a plain one."""
    if isinstance(exc, Interrupted):
        return "SIGINT, Ctrl-C" if exc.signum == signal.SIGINT else exc.name
    return "Ctrl-C"


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal number; 130 for a KeyboardInterrupt raised by Python's own handler."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


class _Guard:
    """What the handler knows: whether it raised already, and what a critical section holds."""

    def __init__(self) -> None:
        self.raised: int | None = None  # the signal that was raised; later ones are ignored
        self.pending: int | None = None  # one that arrived inside a critical section
        self.depth = 0  # critical sections open

    def reset(self) -> None:
        """Forget earlier signals: a new command starts."""
        self.raised = self.pending = None
        self.depth = 0


_GUARD = _Guard()


def _handler(signum: int, frame: FrameType | None) -> None:
    guard = _GUARD
    if guard.raised is not None or guard.pending is not None:
        # os.write, not sys.stderr: the handler may run while the main thread is inside a
        # write to stderr, and the buffered writer refuses reentrant calls.
        message = (
            f"harness: {signal.Signals(signum).name} again; still stopping the runtime and "
            "recording the run (SIGKILL abandons that; `harness run --resume DIR` then stops "
            "what is left)\n"
        )
        with contextlib.suppress(OSError):  # stderr went with the terminal (SIGHUP)
            os.write(2, message.encode())
        return
    if guard.depth:
        guard.pending = signum
        return
    guard.raised = signum
    if _cancel_drive(threading.get_ident(), signum):
        return
    raise Interrupted(signum)


@contextmanager
def stop_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, SIGTERM, SIGHUP and SIGINT raise :class:`Interrupted`, the first only.

    ``signals`` adds to them where a scheduler stops with another one (a Slurm job is warned of
    its time limit with SIGUSR2).

    Outside the main thread (where signals cannot be handled) the block runs unchanged. The
    previous handlers come back when it ends, unless a signal stopped the command: then the
    process is about to exit 128 + that signal, and a later one (a scheduler sending SIGINT
    after SIGTERM) must not kill it first and change what it exits with, so they are ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    _GUARD.reset()
    for signum in signals:
        if signal.getsignal(signum) == signal.SIG_IGN:
            continue
        previous[signum] = signal.signal(signum, _handler)
    try:
        yield
    finally:
        stopped = _GUARD.raised is not None or _GUARD.pending is not None
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if stopped else handler)
        _GUARD.reset()


class _WorkerGuard:
    """A fleet worker thread's critical sections and the interrupt waiting for their end."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None


_WORKERS: dict[int, _WorkerGuard] = {}
_WORKERS_LOCK = threading.Lock()
_ASYNC_CLASSES: dict[int, type[Interrupted]] = {}


def _async_class(signum: int) -> type[Interrupted]:
    # CPython raises an asynchronous exception by calling its class with no arguments.
    if signum not in _ASYNC_CLASSES:

        class _Raised(Interrupted):
            def __init__(self, *_: object) -> None:
                super().__init__(signum)

        _Raised.__name__ = _Raised.__qualname__ = "Interrupted"
        _ASYNC_CLASSES[signum] = _Raised
    return _ASYNC_CLASSES[signum]


def interrupt_worker(thread: threading.Thread, signum: int) -> None:
    """Raise :class:`Interrupted` in a fleet's worker thread, as the signal does in the main one.

    Signals reach only the main thread; this carries one to a worker so the worker stops its
    runtime and records its run the way the main thread would. It is raised at once, or when
    the worker's critical section (:func:`deferred`) ends. A worker blocked inside a C call
    (a socket read) sees it when that call returns.
    """
    ident = thread.ident
    if ident is None:
        return  # never started
    with _WORKERS_LOCK:
        guard = _WORKERS.setdefault(ident, _WorkerGuard())
        if guard.depth:
            guard.pending = guard.pending or signum
            return
        if _cancel_drive(ident, signum):
            return
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(_async_class(signum))
        )


@contextmanager
def _worker_deferred() -> Iterator[None]:
    ident = threading.get_ident()
    try:
        with _WORKERS_LOCK:
            guard = _WORKERS.setdefault(ident, _WorkerGuard())
            guard.depth += 1
        yield
    finally:
        with _WORKERS_LOCK:
            guard = _WORKERS[ident]
            guard.depth -= 1
            pending = guard.pending if guard.depth == 0 else None
            if pending is not None:
                guard.pending = None
        if pending is not None:
            raise Interrupted(pending)


@contextmanager
def deferred() -> Iterator[None]:
    """A critical section: a stop signal arriving inside it is raised when it ends.

    Only the first signal is ever raised; one that arrives while the block runs replaces any
    exception the block itself raises, since the user asked to stop. In a fleet's worker thread
    the interrupt the main thread forwards (:func:`interrupt_worker`) waits the same way.
    """
    if threading.current_thread() is not threading.main_thread():
        with _worker_deferred():
            yield
        return
    guard = _GUARD
    guard.depth += 1
    try:
        yield
    finally:
        guard.depth -= 1
        if guard.depth == 0 and guard.pending is not None and guard.raised is None:
            signum, guard.pending = guard.pending, None
            guard.raised = signum
            raise Interrupted(signum)


# Thread id -> how to cancel the asyncio drive running there (registered by
# harness.boxes.async_interrupts, so a command that drives nothing never imports asyncio).
# Plain dict operations, no lock: the signal handler reads it in the thread that may be
# registering, and a lock it waited on there would never be released.
CANCELLERS: dict[int, Callable[[int], bool]] = {}


def _cancel_drive(ident: int, signum: int) -> bool:
    """Cancel the asyncio drive running in thread ``ident``, if any; whether there was one."""
    cancel = CANCELLERS.get(ident)
    return cancel is not None and cancel(signum)
