"""Counters scraped from a runtime's own log, by the regexes its profile declares.

Some runtimes count only in their log: ds4 prints its streaming expert cache line (``hits=N
misses=N … miss_pread=X GiB``, cumulative for the process) per frontier and at cleanup, and
llama-server prints each request's ``prompt eval time = … / N tokens`` and ``eval time = … / N
tokens``. A snapshot of the log reads every declared counter as of that moment: the last matching
line for ``last`` patterns, the sum over matching lines for ``sum`` patterns, the number of
matching lines for ``count`` patterns; the runner takes one
before and one after the scored workload, and the run's value is the difference, like any other
counter. A counter that no line gave is absent from the snapshot, so it is missing (and reported
so) rather than 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.errors import RecordError
from harness.formats.textfile import compile_pattern
from harness.profiles.telemetry import LOG_UNITS, LogCounter

# Units as stored, for counters.json: sizes in bytes, times in ms.
_STORED_UNIT = {"KiB": "bytes", "MiB": "bytes", "GiB": "bytes", "us": "ms", "s": "ms"}


def log_snapshot(text: str, specs: Sequence[LogCounter], *, where: str = "log") -> dict[str, float]:
    """Every counter the log so far gives: {name: value in its stored unit}.

    A group that is a number on no line (an optional group left out, a pattern never matched)
    is absent. A group that matched text that is not a number is a profile error naming the line.
    """
    out: dict[str, float] = {}
    compiled = [(spec, compile_pattern(spec.pattern)) for spec in specs]
    for number, line in enumerate(text.splitlines(), start=1):
        for spec, pattern in compiled:
            match = pattern.search(line)
            if match is None:
                continue
            for name, raw in match.groupdict().items():
                if raw is None:
                    continue
                if spec.mode == "count":
                    out[name] = out.get(name, 0.0) + 1.0
                    continue
                try:
                    value = float(raw) * LOG_UNITS[spec.units.get(name, "count")]
                except ValueError:
                    raise RecordError(
                        f"{where}:{number}: log counter {name} matched {raw!r}, not a number; "
                        "fix the profile's telemetry.log_counters pattern"
                    ) from None
                out[name] = out.get(name, 0.0) + value if spec.mode == "sum" else value
    return out


def start_snapshot(
    specs: Sequence[LogCounter], text: str | None, *, where: str = "log"
) -> dict[str, float]:
    """The snapshot a run's counts start from.

    ``text`` None: the process starts with the run (a command driver), so every counter starts
    at 0. Otherwise the log so far, where a ``sum`` counter with no line yet is 0 (no event yet)
    and a ``last`` counter with no line yet stays absent (see :func:`missing_log_counters`).
    """
    snapshot = log_snapshot(text, specs, where=where) if text is not None else {}
    for spec in specs:
        for name in spec.counters():
            if name not in snapshot and (text is None or spec.mode != "last"):
                snapshot[name] = 0.0
    return snapshot


def log_counter_units(specs: Sequence[LogCounter]) -> dict[str, str]:
    """{counter: unit as stored} for every declared log counter."""
    units = {}
    for spec in specs:
        for name in spec.counters():
            printed = spec.units.get(name, "count")
            units[name] = _STORED_UNIT.get(printed, printed)
    return units


def missing_log_counters(
    specs: Sequence[LogCounter],
    before: dict[str, float] | None,
    after: dict[str, float] | None,
) -> dict[str, str]:
    """{counter: why it has no delta} for the declared counters a run could not count.

    ``before`` comes from :func:`start_snapshot`, so a counter absent there is a ``last`` one
    whose line was not printed yet: what the process had counted is unknown.
    """
    missing: dict[str, str] = {}
    for spec in specs:
        for name in spec.counters():
            if after is None or name not in after:
                missing[name] = "no log line gave it by the end of the run"
            elif before is None or name not in before:
                missing[name] = (
                    "no log line gave it before the scored workload (its counts are cumulative "
                    "for the process, so the start is unknown); add warm-up requests"
                )
    return missing
