"""The ``harness`` command: a router. It builds the parser from each stage's verbs
(``<package>/commands.py``), dispatches, and maps what went wrong to an exit code.

Expected failures (:class:`HarnessError`) are printed without a traceback and mapped to exit codes:
0 pass, 1 a gate failed, 2 bad input or usage, 3 infrastructure. Anything else (a bug) is an
"internal error", exit 3 too: never 1, which a release gate reads as a verdict. ``--debug``
shows tracebacks.
Stopped by a signal, a command exits 128 + its number: 130 Ctrl-C (SIGINT), 143 SIGTERM,
129 SIGHUP (:mod:`harness.boxes.interrupts`), after stopping any runtime it booted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import io
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TextIO, cast

from harness.boxes.interrupts import describe, exit_code, stop_signals
from harness.errors import EXIT_INFRASTRUCTURE, HarnessError
from harness.version import __version__

Handler = Callable[[argparse.Namespace, TextIO], int]

# Each stage registers its own verbs (``<stage>/commands.py``'s ``register``), in pipeline order
# (the order ``--help`` lists them), with the verbs each registers: a command line naming one
# verb imports only its module, so ``harness validate`` pays for no other stage's parser
# (tests/test_cli.py checks the names against what each module registers).
# Registering imports no stage: each handler imports its stage when it runs.
VERBS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harness.plan.commands", ("validate", "plan")),
    ("harness.execute.commands", ("run", "box", "collect")),
    ("harness.analyze.commands", ("analyze", "compare")),
    ("harness.gate.commands", ("gate",)),
    ("harness.report.commands", ("report",)),
    ("harness.history.commands", ("history",)),
    ("harness.bisect.commands", ("bisect",)),
    ("harness.importers.commands", ("import",)),
    ("harness.sim.commands", ("simulate", "fit-cost", "fit-map")),
    ("harness.runtimes.llamacpp.commands", ("make-gguf", "llama-trace")),
    ("harness.runtimes.vllm.commands", ("make-vllm-model",)),
    ("harness.runtimes.ds4.commands", ("make-ds4-model",)),
    ("harness.benchmarks.commands", ("bench",)),
    ("harness.formats.commands", ("ring",)),
    ("harness.refbox.commands", ("refbox",)),
)


def named_verb(arguments: Sequence[str]) -> str | None:
    """The verb a command line names (its first word after the global options), if it is one."""
    for word in arguments:
        if word == "--debug":
            continue
        return word if any(word in names for _, names in VERBS) else None
    return None


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every verb, or of ``verb`` alone."""
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark and A/B campaigns for two-tier mixture-of-experts runtimes.",
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    verbs = parser.add_subparsers(
        dest="verb", metavar="VERB", required=True, help="the command (`harness VERB --help`)"
    )

    for module, names in VERBS:
        if verb is None or verb in names:
            importlib.import_module(module).register(verbs)
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
    parser = build_parser(named_verb(arguments))
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
    except Exception as exc:  # the last resort: a bug must not read as a verdict
        # Python's own exit for an uncaught exception is 1, which a release gate reads as "the
        # candidate failed". A harness bug reached no verdict: say so, and exit 3.
        if args.debug:
            traceback.print_exc()
        _stderr(
            f"internal error: {type(exc).__name__}: {exc}\n"
            "  this is a harness bug, not a verdict (exit 3): rerun with --debug for the "
            "traceback and report it; completed runs are kept\n"
        )
        return EXIT_INFRASTRUCTURE


def entry() -> None:
    """Console-script entry point."""
    from harness.threads import one_blas_thread

    one_blas_thread()  # before any stage imports numpy
    code = main()
    try:
        sys.stdout.flush()
    except OSError:
        # The reader is gone; Python would fail the flush at exit again and exit 120.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)


if __name__ == "__main__":
    entry()
