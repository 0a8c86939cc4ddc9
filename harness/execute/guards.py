"""The runner's rules: checks before a cohort, a watch during each run (the card's ``guards:``).

Seed 004's runner refused to start on battery, beside another runtime process or with under 20%
free memory, and aborted a run on any new swap-out, on wired memory over a bound or past a time
limit; any of these invalidated the whole cohort. Here a cohort is one comparison's mirrored
blocks (:func:`cohort_key`); the checks read the box with plain commands (``pmset``,
``/sys/class/power_supply``, ``ps``, ``/proc/meminfo``, ``memory_pressure``, ``vm_stat``), so an
SSH box needs nothing installed. Every check says what it saw and its bound, for the record.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.boxes.base import Box
from harness.card.schema import Guards
from harness.errors import HarnessError
from harness.formats.textfile import compile_pattern
from harness.plan.build import Run
from harness.plan.build import cohort_key as plan_cohort_key
from harness.profiles.schema import Idle
from harness.runtimes.counters import scrape_counters

# Linux: a supply of type Battery whose status is Discharging, and no Mains supply online.
_POWER_SNIPPET = (
    'for d in /sys/class/power_supply/*; do [ -e "$d/type" ] || continue; '
    'printf "%s %s %s\\n" "$(cat "$d/type")" "$(cat "$d/online" 2>/dev/null || echo -)" '
    '"$(cat "$d/status" 2>/dev/null || echo -)"; done'
)


@dataclass
class GuardCheck:
    """One rule checked: what it saw, its bound, and whether it held."""

    guard: str
    passed: bool
    reason: str
    value: float | str | None = None
    bound: float | str | None = None

    def to_json(self) -> dict[str, Any]:
        """As written to ``cohorts.json``."""
        return asdict(self)


def guards_enabled(guards: Guards, runtime_name: str) -> tuple[bool, str]:
    """Whether the guards run, and why (the default is on for every real runtime)."""
    if guards.enabled is not None:
        return guards.enabled, f"guards.enabled: {str(guards.enabled).lower()} on the card"
    if runtime_name == "refbox":
        return False, "off by default for the reference runtime (a test double)"
    return True, f"on by default for runtime {runtime_name}"


def cohort_key(run: Run) -> str:
    """The cohort a run belongs to: its comparison, cache state and mirrored cycle."""
    return plan_cohort_key(run.comparison, run.cache_state, run.cycle)


def on_ac_power(box: Box) -> GuardCheck:
    """macOS ``pmset -g batt``; Linux power supplies. No supply at all (a server) is not battery."""
    if box.spec.platform == "macos-metal":
        text = box.sh("pmset -g batt", check=False).stdout
        on_battery = "'Battery Power'" in text
        seen = text.splitlines()[0].strip() if text.strip() else "pmset printed nothing"
        reason = "on battery" if on_battery else "on AC power"
        return GuardCheck("ac_power", not on_battery, f"{reason} ({seen})", seen, "AC Power")
    lines = box.sh(_POWER_SNIPPET, check=False).stdout.split("\n")
    supplies = [line.split() for line in lines if line.strip()]
    mains = any(s[0] == "Mains" and s[1:2] == ["1"] for s in supplies)
    draining = any(s[0] == "Battery" and "Discharging" in s[2:] for s in supplies)
    if not supplies:
        return GuardCheck("ac_power", True, "no power supply listed (a server): not on battery")
    on_battery = draining and not mains
    text = "; ".join(" ".join(s) for s in supplies)
    reason = f"on battery ({text})" if on_battery else f"not on battery ({text})"
    return GuardCheck("ac_power", not on_battery, reason, text, "Mains online or not discharging")


def _own_processes() -> set[int]:
    """This process and its ancestors (a harness run's own command line may name a runtime)."""
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    pids.add(os.getppid())
    return pids


def competing_processes(box: Box, patterns: Sequence[str]) -> GuardCheck:
    """Processes whose command line matches a pattern (this harness and its parents excepted)."""
    if not patterns:
        return GuardCheck("competing", True, "no competing-process patterns declared")
    compiled = [compile_pattern(p) for p in patterns]
    own = _own_processes() if box.spec.kind == "local" else set()
    found = []
    for line in box.sh("ps -A -o pid= -o args=", check=False).stdout.splitlines():
        pid_text, _, args = line.strip().partition(" ")
        if not pid_text.isdigit() or int(pid_text) in own:
            continue
        args = args.strip()
        if args.startswith("ps -A") or not args:
            continue
        if any(p.search(args) for p in compiled):
            found.append(f"{pid_text} {args[:120]}")
    if found:
        listed = "; ".join(found[:20])
        return GuardCheck(
            "competing",
            False,
            f"competing process running: {listed}; stop it, or set guards.competing: false",
            listed,
            " | ".join(patterns),
        )
    return GuardCheck("competing", True, "no competing process", None, " | ".join(patterns))


def memory_free(box: Box) -> tuple[float | None, float | None]:
    """(free bytes, total bytes) on the box; None where it cannot tell."""
    if box.spec.platform == "macos-metal":
        total_text = box.sh("sysctl -n hw.memsize", check=False).stdout.strip()
        text = box.sh("memory_pressure -Q", check=False).stdout
        match = re.search(r"free percentage:\s*(\d+)%", text)
        if not total_text.isdigit() or match is None:
            return None, None
        total = float(total_text)
        return total * float(match.group(1)) / 100.0, total
    info = _meminfo(box)
    if "MemAvailable" not in info or "MemTotal" not in info:
        return None, None
    return info["MemAvailable"], info["MemTotal"]


def _meminfo(box: Box) -> dict[str, float]:
    out = {}
    for line in box.sh("cat /proc/meminfo", check=False).stdout.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = float(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def enough_memory(box: Box, guards: Guards) -> GuardCheck:
    """Free memory at or above the card's bounds (percent and/or bytes)."""
    free, total = memory_free(box)
    if free is None or total is None:
        return GuardCheck("free_memory", False, "cannot read free memory on the box; fail closed")
    pct = 100.0 * free / total
    seen = f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB ({pct:.0f}%)"
    if guards.min_free_memory_pct is not None and pct < guards.min_free_memory_pct:
        return GuardCheck(
            "free_memory",
            False,
            f"{seen}, under {guards.min_free_memory_pct:g}%",
            free,
            f"{guards.min_free_memory_pct:g}%",
        )
    if guards.min_free_memory_bytes is not None and free < guards.min_free_memory_bytes:
        return GuardCheck(
            "free_memory",
            False,
            f"{seen}, under {guards.min_free_memory_bytes / 2**30:g} GiB",
            free,
            guards.min_free_memory_bytes,
        )
    return GuardCheck("free_memory", True, seen, free, guards.min_free_memory_pct)


def wired_bytes(box: Box) -> float | None:
    """Wired memory: macOS ``Pages wired down``; Linux locked memory (Mlocked + Unevictable)."""
    if box.spec.platform == "macos-metal":
        text = box.sh("vm_stat", check=False).stdout
        size = re.search(r"page size of (\d+) bytes", text)
        wired = re.search(r"Pages wired down:\s*(\d+)", text)
        if size is None or wired is None:
            return None
        return float(wired.group(1)) * float(size.group(1))
    info = _meminfo(box)
    if "Unevictable" not in info:
        return None
    return info["Unevictable"] + info.get("Mlocked", 0.0)


def idle_value(samples: dict[str, float], metric: str) -> float | None:
    """A metric summed over its label sets (``name`` or ``name{…}``); None when not served."""
    values = [v for k, v in samples.items() if k == metric or k.startswith(metric + "{")]
    return float(sum(values)) if values else None


def wait_idle(base_url: str, metrics_http: str, idle: Idle, poll_s: float = 0.5) -> GuardCheck:
    """Poll the runtime's Prometheus metrics until every ``idle.metrics`` reads 0 for ``for_s``
    (the CUDA lane's rule before timed runs on a shared box); a failed check past ``timeout_s``.

    A metric the runtime does not serve fails closed: it cannot say the box is idle.
    """
    started = time.monotonic()
    quiet_since: float | None = None
    last = "no answer"
    while True:
        now = time.monotonic()
        samples = scrape_counters(base_url, None, metrics_http, timeout_s=5)
        if samples is not None:
            values = {m: idle_value(samples, m) for m in idle.metrics}
            absent = [m for m, v in values.items() if v is None]
            if absent:
                return GuardCheck(
                    "idle", False, f"{metrics_http} serves no {', '.join(absent)}; fix profile idle"
                )
            last = ", ".join(f"{m}={v:g}" for m, v in values.items() if v is not None)
            busy = any(v for v in values.values())
            quiet_since = None if busy else (quiet_since if quiet_since is not None else now)
            if quiet_since is not None and now - quiet_since >= idle.for_s:
                return GuardCheck("idle", True, f"idle for {idle.for_s:g} s ({last})", last, 0)
        if now - started > idle.timeout_s:
            return GuardCheck(
                "idle",
                False,
                f"box not idle for {idle.for_s:g} s within {idle.timeout_s:g} s (last: {last})",
                last,
                0,
            )
        time.sleep(poll_s)


def cohort_checks(box: Box, guards: Guards, patterns: Sequence[str]) -> list[GuardCheck]:
    """Every before-cohort rule the card keeps on."""
    checks = []
    if guards.ac_power:
        checks.append(on_ac_power(box))
    if guards.competing:
        checks.append(competing_processes(box, [*patterns, *guards.competing_extra]))
    if guards.min_free_memory_pct is not None or guards.min_free_memory_bytes is not None:
        checks.append(enough_memory(box, guards))
    return checks


@dataclass
class RunWatch:
    """A thread that samples the box every ``guards.sample_s`` during one run and, when a rule
    breaks, records why and calls ``on_abort`` (which stops the runtime)."""

    open_box: Callable[[], Box]
    guards: Guards
    on_abort: Callable[[Box, str], None]  # stops the runtime, on the watch's own box
    reason: str | None = None
    samples: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-guards", daemon=True)
        self._box: Box | None = None
        self._started = time.monotonic()
        self._swap_start: int | None = None

    def start(self) -> None:
        """Take the baselines and start sampling."""
        self._box = self.open_box()
        self._started = time.monotonic()
        if self.guards.swapout:
            self._swap_start = self._box.swapout_pages()
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (the verdict so far stays in ``reason``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self._box is not None:
            self._box.close()

    def check_now(self) -> str | None:
        """Sample once; the broken rule, if any."""
        assert self._box is not None
        elapsed = time.monotonic() - self._started
        if self.guards.max_run_s is not None and elapsed > self.guards.max_run_s:
            return f"run past the time limit of {self.guards.max_run_s:g} s (guards.max_run_s)"
        if self.guards.swapout and self._swap_start is not None:
            now = self._box.swapout_pages()
            if now is not None and now > self._swap_start:
                return f"new swap-out during the run: {now - self._swap_start} pages"
        if self.guards.max_wired_bytes is not None:
            wired = wired_bytes(self._box)
            if wired is None:
                return "cannot read wired memory on the box; fail closed (guards.max_wired_bytes)"
            if wired > self.guards.max_wired_bytes:
                return (
                    f"wired memory {wired / 2**30:.2f} GiB over the bound "
                    f"{self.guards.max_wired_bytes / 2**30:g} GiB (guards.max_wired_bytes)"
                )
        return None

    def _loop(self) -> None:
        while not self._stop.wait(self.guards.sample_s):
            try:
                reason = self.check_now()
            except (HarnessError, OSError) as exc:
                self.errors.append(str(exc)[:300])
                continue
            self.samples += 1
            if reason is not None:
                self.reason = reason
                assert self._box is not None
                self.on_abort(self._box, reason)
                return
