"""The ``harness`` command: a router. It builds the parser from each stage's verbs
(``<package>/commands.py``), dispatches, and maps what went wrong to an exit code.

Expected failures (:class:`HarnessError`) are printed without a traceback and mapped to exit codes:
0 pass, 1 a gate failed, 2 bad input or usage, 3 infrastructure. ``--debug`` shows tracebacks.
Stopped by a signal, a command exits 128 + its number: 130 Ctrl-C (SIGINT), 143 SIGTERM,
129 SIGHUP (:mod:`harness.boxes.interrupts`), after stopping any runtime it booted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO, cast

from harness import __version__
from harness.analyze.commands import register as analyze_verbs
from harness.benchmarks.commands import register as bench_verbs
from harness.boxes.interrupts import describe, exit_code, stop_signals
from harness.errors import EXIT_INFRASTRUCTURE, HarnessError
from harness.execute.commands import register as execute_verbs
from harness.formats.commands import register as ring_verbs
from harness.gate.commands import register as gate_verbs
from harness.history.commands import register as history_verbs
from harness.importers.commands import register as import_verbs
from harness.plan.commands import register as plan_verbs
from harness.refbox.commands import register as refbox_verbs
from harness.report.commands import register as report_verbs
from harness.runtimes.ds4.commands import register as ds4_verbs
from harness.runtimes.llamacpp.commands import register as llamacpp_verbs
from harness.runtimes.vllm.commands import register as vllm_verbs
from harness.sim.commands import register as sim_verbs

Handler = Callable[[argparse.Namespace, TextIO], int]

# Each stage registers its own verbs, in pipeline order (the order ``--help`` lists them).
# Registering imports no stage: each handler imports its stage when it runs.
VERBS: tuple[Callable[[Any], None], ...] = (
    plan_verbs,  # validate, plan
    execute_verbs,  # run, box check, collect
    analyze_verbs,  # analyze, compare
    gate_verbs,
    report_verbs,
    history_verbs,
    import_verbs,
    sim_verbs,  # simulate, fit-map
    llamacpp_verbs,
    vllm_verbs,
    ds4_verbs,
    bench_verbs,
    ring_verbs,
    refbox_verbs,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark and A/B campaigns for two-tier mixture-of-experts runtimes.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    for register in VERBS:
        register(verbs)
    return parser


def _print_error(exc: HarnessError) -> None:
    for line in exc.lines():
        _stderr(f"{line}\n")


class _Courtesy(io.TextIOBase):
    """What a command prints, given up once the reader is gone: a hung-up terminal (SIGHUP) or
    a closed pipe must not turn into a traceback, or change the exit code, of a command whose
    records on disk are the truth."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self._target: TextIO | None = target
        self._encoding = getattr(target, "encoding", None) or "utf-8"

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only on io.TextIOBase
        return self._encoding

    def write(self, text: str) -> int:
        if self._target is not None:
            try:
                self._target.write(text)
            except OSError:
                self._target = None
        return len(text)

    def flush(self) -> None:
        if self._target is not None:
            try:
                self._target.flush()
            except OSError:
                self._target = None

    def isatty(self) -> bool:
        return self._target is not None and self._target.isatty()

    def fileno(self) -> int:
        if self._target is None:
            raise OSError("output closed")
        return self._target.fileno()


def os_error_text(exc: OSError) -> str:
    """``PATH: what the errno means``, and what to do; every path the error names."""
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    meaning = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    if exc.errno == errno.EEXIST:
        meaning += " (and is not a folder)"  # what a mkdir over a file says
    where = " → ".join(paths) if paths else "a file the harness writes"
    return (
        f"{where}: {meaning}; nothing already written was lost (records are replaced whole): "
        "fix it (free space, a writable folder, a folder where a folder belongs) and run the "
        "command again (a campaign: harness run --resume DIR)"
    )


def _stderr(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting, so tests can call it."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    handler: Handler = args.handler
    # The reference runtime handles its own signals in its event loop.
    signals = stop_signals() if args.verb != "refbox" else contextlib.nullcontext()
    try:
        with signals:
            return handler(args, cast(TextIO, _Courtesy(out or sys.stdout)))
    except HarnessError as exc:
        if args.debug:
            traceback.print_exc()
        _print_error(exc)
        return exc.exit_code
    except OSError as exc:
        # What our readers and writers did not turn into a HarnessError is the machine's: a
        # full disk, a read-only file system, a file where a folder goes. Exit 3, not 1 (a
        # release gate reads 1 as "the candidate failed"); atomic writes kept what was there.
        if args.debug:
            traceback.print_exc()
        _stderr(os_error_text(exc) + "\n")
        return EXIT_INFRASTRUCTURE
    except KeyboardInterrupt as exc:
        _stderr(f"interrupted ({describe(exc)})\n")
        return exit_code(exc)


def entry() -> None:
    """Console-script entry point."""
    code = main()
    try:
        sys.stdout.flush()
    except OSError:
        # The reader is gone; Python would fail the flush at exit again and exit 120.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)


if __name__ == "__main__":
    entry()
