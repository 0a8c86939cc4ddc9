"""``harness bench overhead``: what the campaign runner costs per run, beyond boot and drive.

A tiny refbox campaign (2 cells, A B B A, 2 phases of 1 request, 8 tokens) runs on the local box
through :class:`harness.execute.run.CampaignRunner`, unchanged. The benchmark wraps the runner's
steps with timers for the length of the campaign (and restores them after), so each run's wall
time splits into boot (start until ready), the workload drive (warm-up included) and everything
else: uploads, cache state, counters, stop, collect, the parquet and JSON records, the journal.

Timers nest: each step is charged its own time only (a write inside ``_write_counters`` counts
as ``write_json_atomic``), and nothing inside boot or the drive is split further. What no timer
covers is the runner's own code (``other``).

Target: overhead < 1 s per run on the local box. The baseline is the useful work of the same run
(boot + drive); the once-per-campaign setup (environment capture) is reported apart.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.benchmarks import Figure
from harness.card import load_card
from harness.errors import HarnessError
from harness.execute import drive_step
from harness.execute import run as run_module
from harness.execute.campaign import new_campaign_dir
from harness.formats.records import Journal
from harness.plan.build import build_plan
from harness.runtimes.boot import RunningRuntime

__all__ = ["RunTimes", "measure_overhead", "overhead_figures", "run_bench"]

_TARGET_S = 1.0
# Steps charged to boot or the drive; every other timed step is orchestration overhead.
_BOOT, _DRIVE, _RUN, _SETUP = "boot", "drive", "run", "campaign setup"

_POOL = """\
{"id": "en-held-1", "domain": "en-prose", "split": "heldout", "prompt": "The keeper lit the lamp."}
{"id": "py-held-1", "domain": "python", "split": "heldout", "prompt": "def add(a, b):"}
"""

_CARD = """\
campaign: overhead
box: local
runtime: refbox
prompts:
  pools: [pool.jsonl]
  heldout: {{split: heldout}}
workload:
  max_tokens: 8
  warmup_requests: 1
  request_timeout_s: 30
  phases:
    - {{name: prose, domains: [en-prose], requests: 1}}
    - {{name: code, domains: [python], requests: 1, shift: true}}
cells:
  control:
    env:
      REFBOX_LAYERS: "2"
      REFBOX_EXPERTS: "8"
      REFBOX_HOT_SLOTS: "4"
      REFBOX_EXPERT_BYTES: "4096"
  wide:
    env:
      REFBOX_LAYERS: "2"
      REFBOX_EXPERTS: "8"
      REFBOX_HOT_SLOTS: "8"
      REFBOX_EXPERT_BYTES: "4096"
control: control
design: {{order: abba, cycles: {cycles}, repeats: 1, cache_states: [warm], retries: 0}}
analysis: {{window_s: 0.5, converged_span_s: 1, hold_s: 0}}
gates:
  - {{kind: exact_outputs, min_match: all}}
"""


@dataclass
class RunTimes:
    """One run's wall time and the time charged to each step, in seconds."""

    total_s: float = 0.0
    steps_s: dict[str, float] = field(default_factory=dict)
    shell_commands: int = 0  # box commands outside boot and drive (each one a subprocess or ssh)
    shell_s: float = 0.0

    @property
    def boot_s(self) -> float:
        """Start of the runtime until its readiness probe passed."""
        return self.steps_s.get(_BOOT, 0.0)

    @property
    def drive_s(self) -> float:
        """The workload drive, warm-up included."""
        return self.steps_s.get(_DRIVE, 0.0)

    @property
    def overhead_s(self) -> float:
        """Everything that is neither boot nor drive."""
        return self.total_s - self.boot_s - self.drive_s

    def overhead_steps_s(self) -> dict[str, float]:
        """The overhead split by step; the runner's untimed code is ``other``."""
        out = {k: v for k, v in self.steps_s.items() if k not in (_BOOT, _DRIVE, _RUN)}
        out["other"] = self.steps_s.get(_RUN, 0.0)
        return out


class _Ledger:
    """Charges each timed call its own time (callees excluded) to the current run."""

    def __init__(self) -> None:
        self.runs: list[RunTimes] = []
        self.setup_s = 0.0
        self._current: RunTimes | None = None
        self._stack: list[list[Any]] = []  # [label, start, time spent in timed callees]
        self._thread = threading.get_ident()  # helper threads (the run monitor) are not timed

    def wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` with its time charged to ``label``."""

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread:
                return function(*args, **kwargs)
            inside = {frame[0] for frame in self._stack}
            if label == _RUN:
                self._current = RunTimes()
            elif self._current is None or inside & {_BOOT, _DRIVE}:
                return function(*args, **kwargs)
            frame: list[Any] = [label, time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return function(*args, **kwargs)
            finally:
                self._stack.pop()
                elapsed = time.perf_counter() - frame[1]
                current = self._current
                current.steps_s[label] = current.steps_s.get(label, 0.0) + elapsed - frame[2]
                if self._stack:
                    self._stack[-1][2] += elapsed
                if label == _RUN:
                    current.total_s = elapsed
                    self.runs.append(current)
                    self._current = None

        return timed

    def count_shell(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (the box's ``sh``) counted, not charged: its callers keep the time."""

        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            current = self._current
            if (
                threading.get_ident() != self._thread
                or current is None
                or {frame[0] for frame in self._stack} & {_BOOT, _DRIVE}
            ):
                return function(*args, **kwargs)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                current.shell_commands += 1
                current.shell_s += time.perf_counter() - start

        return counted

    def wrap_setup(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` timed as once-per-campaign setup."""

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.setup_s += time.perf_counter() - start

        return timed


@contextlib.contextmanager
def _patched(owner: object, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """Set ``owner.name`` for the block; afterwards restore exactly what was there."""
    own = vars(owner)
    had_own = name in own
    original = own.get(name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)  # an instance attribute that shadowed the class's method


def _targets(runner: Any) -> list[tuple[object, str, str, bool]]:
    """(owner, attribute, step label, required) of every step the benchmark times.

    Module functions are patched where the runner looks them up (``harness.execute.run``);
    methods on the runner and its box are shadowed on those instances only; classes are patched
    for the campaign and restored. Optional steps that the runner no longer has are skipped
    (their time shows as ``other``); without ``boot`` or the drive step's ``drive`` there is no
    figure. What a run sends is timed on its drive step (``runner.driving``, harness.execute.
    drive_step), whose module looks up its own counters, parquet writer and phases.
    """
    targets: list[tuple[object, str, str, bool]] = [
        (run_module, "boot", _BOOT, True),
        (runner.driving, "drive", _DRIVE, True),
        (runner, "_run_with_retries", _RUN, True),
        (run_module, "counters", "counters (HTTP)", False),
        (drive_step, "counters", "counters (HTTP)", False),
        (run_module, "write_parquet", "write parquet", False),
        (drive_step, "write_parquet", "write parquet", False),
        (run_module, "write_json_atomic", "write json (fsync)", False),
        (run_module, "build_phases", "build phases", False),
        (drive_step, "build_phases", "build phases", False),
        (run_module, "boot_spec", "boot spec", False),
        (runner, "_upload_files", "upload knob files", False),
        (runner, "_evict", "cache state", False),
        (runner.records, "write_counters", "write counters", False),
        (runner.records, "_collect", "collect ring/log", False),
        (runner, "_start_monitor", "start monitor", False),
        (runner.records, "_write_monitor", "write monitor", False),
        (runner.driving, "_checkpoint", "checkpoint", False),
        (RunningRuntime, "stop", "stop runtime (signal, wait for exit)", False),
        (RunningRuntime, "post_live", "live knobs", False),
        (RunningRuntime, "log_tail", "log tail", False),
        (Journal, "append", "journal (fsync)", False),
        (runner.box, "free_port", "free port", False),
        (runner.box, "mkdirs", "mkdirs", False),
        (runner.box, "swapout_pages", "swap counter", False),
        (runner.box, "group_alive", "group-alive probes (ps)", False),
    ]
    monitor = getattr(run_module, "RunMonitor", None)
    if isinstance(monitor, type):
        targets += [(monitor, "stop", "stop monitor", False)]
    return targets


def measure_overhead(cycles: int = 1) -> tuple[list[RunTimes], float]:
    """Run the tiny campaign; each run's times and the once-per-campaign setup time."""
    ledger = _Ledger()
    with tempfile.TemporaryDirectory(prefix="harness-bench-overhead-") as folder:
        root = Path(folder)
        (root / "pool.jsonl").write_text(_POOL, encoding="utf-8")
        card_path = root / "overhead.yaml"
        card_path.write_text(_CARD.format(cycles=cycles), encoding="utf-8")
        loaded = load_card(card_path)
        plan = build_plan(loaded)
        campaign = new_campaign_dir(loaded, plan, root / "reports")
        runner = run_module.CampaignRunner(loaded, plan, campaign)
        with contextlib.ExitStack() as patches:
            for owner, name, label, required in _targets(runner):
                if not hasattr(owner, name):
                    if required:
                        raise HarnessError(
                            f"the campaign runner has no {name!r} any more; update "
                            "harness/benchmarks/overhead.py to its new step names"
                        )
                    continue
                patches.enter_context(
                    _patched(owner, name, ledger.wrap(label, getattr(owner, name)))
                )
            if hasattr(run_module, "capture_environment"):
                setup = ledger.wrap_setup(run_module.capture_environment)
                patches.enter_context(_patched(run_module, "capture_environment", setup))
            # Every box operation goes through sh(), so the count shows what the steps cost.
            patches.enter_context(_patched(runner.box, "sh", ledger.count_shell(runner.box.sh)))
            outcome = runner.execute()
        if outcome.failed:
            reasons = [
                str((campaign.run_record(r) or {}).get("reason", "")) for r in outcome.failed
            ]
            raise HarnessError(f"overhead campaign: {len(outcome.failed)} runs failed: {reasons}")
    return ledger.runs, ledger.setup_s


def run_bench(quick: bool = False) -> list[Figure]:
    """Per-run orchestration overhead of a tiny refbox campaign; ``quick`` runs 1 ABBA cycle."""
    return overhead_figures(*measure_overhead(cycles=1 if quick else 3))


def overhead_figures(runs: list[RunTimes], setup_s: float) -> list[Figure]:
    """The figures of measured runs: the median overhead, its share, the top 5 steps, setup."""
    if not runs:
        raise HarnessError("the overhead campaign recorded no runs")
    overhead = [r.overhead_s for r in runs]
    median_s = statistics.median(overhead)
    boot_s = statistics.median(r.boot_s for r in runs)
    drive_s = statistics.median(r.drive_s for r in runs)
    total_s = statistics.median(r.total_s for r in runs)
    figures = [
        Figure(
            name=f"orchestration overhead per run, median of {len(runs)}",
            value=median_s,
            unit="s",
            baseline=(
                f"run {total_s:.3f} s = boot {boot_s:.3f} s + drive {drive_s:.3f} s + overhead; "
                f"max overhead {max(overhead):.3f} s"
            ),
            target=f"< {_TARGET_S:g} s",
            passed=median_s < _TARGET_S,
        ),
        Figure(
            name="overhead share of run wall time",
            value=median_s / total_s * 100.0,
            unit="%",
            baseline=f"boot {boot_s / total_s * 100:.0f} %, drive {drive_s / total_s * 100:.0f} %",
        ),
    ]
    steps: dict[str, list[float]] = {}
    for r in runs:
        for name, seconds in r.overhead_steps_s().items():
            steps.setdefault(name, []).append(seconds)
    ranked = sorted(steps.items(), key=lambda item: -statistics.median(item[1]))
    for name, values in ranked[:5]:
        step_s = statistics.median(values)
        figures.append(
            Figure(
                name=f"overhead step: {name}",
                value=step_s,
                unit="s",
                baseline=f"{step_s / median_s * 100:.0f} % of the overhead (median per run)",
            )
        )
    figures.append(
        Figure(
            name="box shell commands per run (overhead only)",
            value=statistics.median(r.shell_commands for r in runs),
            unit="commands",
            baseline=f"{statistics.median(r.shell_s for r in runs):.3f} s in them (median per run)",
        )
    )
    figures.append(
        Figure(
            name="campaign setup, once (environment capture)",
            value=setup_s,
            unit="s",
            baseline=f"{setup_s / len(runs):.3f} s spread over {len(runs)} runs",
        )
    )
    return figures
