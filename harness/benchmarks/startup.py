"""``harness bench startup``: how long the CLI takes to start, against the libraries it must load.

Every verb registers without importing its stage, so a command pays only for what it runs.
Timed side by side, in rounds (so the machine's drift reaches every command alike), each a
fresh interpreter as a user starts it: the baseline ``python -c "import pydantic, yaml"`` (the
card loader's two libraries, the least a card-reading command can load), ``harness --help``,
``harness --version`` (which every campaign runs on its box to record the runtime's version)
and ``harness validate campaigns/demo.yaml``. Figures are medians over the rounds, as ratios to
the baseline's median. Targets: ``--help`` ≤ 1.5×, ``validate`` ≤ 3×.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.benchmarks import Figure

_BASELINE = "import pydantic, yaml"
_DEMO = Path(__file__).resolve().parents[2] / "campaigns" / "demo.yaml"


def _commands() -> dict[str, list[str]]:
    harness = [sys.executable, "-m", "harness"]
    commands = {
        "baseline": [sys.executable, "-c", _BASELINE],
        "--help": [*harness, "--help"],
        "--version": [*harness, "--version"],
    }
    if _DEMO.is_file():
        commands["validate"] = [*harness, "validate", str(_DEMO)]
    return commands


def _environment() -> dict[str, str]:
    """This environment, less PYTHONDONTWRITEBYTECODE: a user's Python caches bytecode, so the
    untimed first start writes it; without it every start would compile the harness's modules
    from source while the baseline's libraries load from their installed caches."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False, env=_environment())
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]!r}")
    return elapsed


def run_bench(quick: bool = False) -> list[Figure]:
    """Median start-up times over rounds (5 quick, 15 full), each as a ratio to the baseline."""
    commands = _commands()
    rounds = 5 if quick else 15
    times: dict[str, list[float]] = {name: [] for name in commands}
    for argv in commands.values():  # one untimed start each: the OS caches the files
        _seconds(argv)
    for _ in range(rounds):
        for name, argv in commands.items():
            times[name].append(_seconds(argv))
    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["baseline"]
    targets = {"--help": 1.5, "validate": 3.0}
    figures: list[Figure] = []
    for name in commands:
        if name == "baseline":
            continue
        ratio = median[name] / base
        target = targets.get(name)
        shown = "harness validate campaigns/demo.yaml" if name == "validate" else f"harness {name}"
        figures.append(
            Figure(
                name=f"{shown}: start-up over the baseline",
                value=ratio,
                unit="x",
                baseline=f'{median[name] * 1e3:.0f} ms vs python -c "{_BASELINE}" '
                f"{base * 1e3:.0f} ms (medians of {rounds})",
                target=f"<= {target:g}x" if target else "",
                passed=ratio <= target if target else None,
            )
        )
    return figures
