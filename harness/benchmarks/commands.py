"""``harness bench NAME``: run one benchmark module of this package and print its figures.

Every module here but this one is a benchmark (``vllm_client.py`` is typed ``vllm-client``):
its ``run_bench(quick)`` returns :class:`~harness.benchmarks.Figure` ratios, printed one a line
with their baseline and target, or as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any, TextIO

from harness.errors import EXIT_OK, HarnessError

__all__ = ["bench_names", "register"]

NOT_BENCHMARKS = {"commands"}


def _cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    from harness.benchmarks import Figure

    names = bench_names()
    if args.name not in names:
        raise HarnessError(f"unknown benchmark {args.name!r}; known: {', '.join(names) or 'none'}")
    module = importlib.import_module(f"harness.benchmarks.{args.name.replace('-', '_')}")
    figures: list[Figure] = module.run_bench(quick=args.quick)
    if args.json:
        payload = [figure.__dict__ for figure in figures]
        out.write(json.dumps({"benchmark": args.name, "figures": payload}, indent=2) + "\n")
        return EXIT_OK
    for figure in figures:
        verdict = "" if figure.passed is None else (" ok" if figure.passed else " MISSED")
        target = f"  (target {figure.target}{verdict})" if figure.target else ""
        baseline = f"  vs {figure.baseline}" if figure.baseline else ""
        out.write(f"{figure.name}: {figure.value:.4g} {figure.unit}{baseline}{target}\n")
    return EXIT_OK


def bench_names() -> list[str]:
    """Every benchmark's name, as ``harness bench`` takes it."""
    folder = Path(__file__).resolve().parent
    # Module vllm_client is the benchmark vllm-client: names are typed with dashes.
    return sorted(
        p.stem.replace("_", "-")
        for p in folder.glob("*.py")
        if not p.stem.startswith("_") and p.stem not in NOT_BENCHMARKS
    )


def register(verbs: Any) -> None:
    """Add ``bench`` to the ``harness`` parser."""
    bench = verbs.add_parser("bench", help="run a named benchmark (ratios vs a baseline)")
    bench.add_argument("name", metavar="NAME", help=f"one of: {', '.join(bench_names())}")
    bench.add_argument("--quick", action="store_true", help="smaller sizes, for a fast look")
    bench.add_argument("--json", action="store_true", help="machine-readable figures")
    bench.set_defaults(handler=_cmd_bench)
