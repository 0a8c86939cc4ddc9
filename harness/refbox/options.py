"""The reference runtime's options: flags and ``REFBOX_*`` env vars, validated into a config.

:func:`parse_serve_args` turns the command line and environment into a :class:`ServeConfig`
(model geometry, engine options, server settings, the maps read from disk), or prints one line
``refbox: --flag: message`` and returns exit code 2. Nothing here binds a port or builds the
engine; :mod:`harness.refbox.server` does that.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.errors import HarnessError, KnobError
from harness.formats.maps import read_hotlist, read_rowmap
from harness.formats.safe_write import write_text_atomic
from harness.policy.residency import ExpertCache, PolicyKnobs, parse_priority
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.flags import UsageError, build_parser
from harness.refbox.heat import HeatSettings, read_heat, write_heat
from harness.refbox.lossy import LossyMode
from harness.refbox.model import ModelConfig

__all__ = ["ServeConfig", "build_parser", "error_message", "parse_serve_args"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _apply_env(parser: argparse.ArgumentParser, environ: dict[str, str]) -> None:
    """Turn REFBOX_<FLAG> variables into defaults, so command-line flags still win."""
    for action in parser._actions:
        flags = [o for o in action.option_strings if o.startswith("--")]
        if not flags or flags[0] == "--help":
            continue
        flag = flags[0]
        key = "REFBOX_" + flag[2:].upper().replace("-", "_")
        if key not in environ:
            continue
        raw = environ[key]
        if isinstance(action, argparse._StoreTrueAction):
            if raw.strip().lower() not in _TRUE | _FALSE:
                raise UsageError(f"{flag}: {key}={raw!r} must be one of 1, 0, true, false")
            action.default = raw.strip().lower() in _TRUE
            continue
        convert: Callable[[str], Any] = action.type if callable(action.type) else str
        try:
            action.default = convert(raw)
        except ValueError as exc:
            raise UsageError(f"{flag}: invalid value {raw!r} from {key}") from exc


@dataclass
class ServeConfig:
    """Validated serve settings: the parsed flags plus the maps read from disk."""

    args: argparse.Namespace
    model: ModelConfig
    options: EngineOptions
    host: str
    port: int
    model_name: str
    counters_path: str | None
    fail_after_tokens: int | None
    hang_after_tokens: int | None
    boot_delay_s: float
    never_ready: bool
    admin_token: str | None = None  # required on every /admin and recorder call when set
    dump_dir: str = "."  # /admin/dump writes only inside it (resolved)
    extra: dict[str, Any] = field(default_factory=dict)

    def build_engine(self) -> Engine:
        """Build the engine (weights, slow tier, hot tier, ring, trace): the slow part of a boot."""
        return Engine(self.model, self.options)


_KNOB_FLAGS = {
    "policy": "--policy",
    "decay_half_life_steps": "--decay-half-life-steps",
    "promote_threshold": "--promote-threshold",
    "hysteresis": "--hysteresis",
    "drain_every": "--drain-every",
    "swaps_per_layer": "--swaps-per-layer",
}


def _need(ok: bool, flag: str, message: str) -> None:
    if not ok:
        raise UsageError(f"{flag}: {message}")


def _check_ranges(a: argparse.Namespace) -> None:
    """Every number in its range, and every injected state with the file that holds it."""
    _need(0 <= a.port <= 65535, "--port", f"must be in 0..65535, got {a.port}")
    for flag, value in (
        ("--layers", a.layers),
        ("--experts", a.experts),
        ("--d-model", a.d_model),
        ("--d-ff", a.d_ff),
    ):
        _need(value >= 1, flag, f"must be a positive integer, got {value}")
    _need(
        1 <= a.top_k <= a.experts, "--top-k", f"must be in 1..experts ({a.experts}), got {a.top_k}"
    )
    _need(
        0 <= a.hot_slots <= a.experts,
        "--hot-slots",
        f"must be in 0..experts ({a.experts}), got {a.hot_slots}",
    )
    _need(a.seed >= 0, "--seed", f"must be >= 0 (numpy seeds are non-negative), got {a.seed}")
    _need(a.expert_bytes >= 0, "--expert-bytes", f"must be >= 0, got {a.expert_bytes}")
    _need(a.ring_capacity >= 1, "--ring-capacity", f"must be >= 1, got {a.ring_capacity}")
    _need(a.cache_records >= 0, "--cache-records", f"must be >= 0, got {a.cache_records}")
    for flag, value in (
        ("--fail-after-tokens", a.fail_after_tokens),
        ("--hang-after-tokens", a.hang_after_tokens),
    ):
        _need(value is None or value >= 1, flag, f"must be a positive integer, got {value}")
    for flag, value in (
        ("--boot-delay-s", a.boot_delay_s),
        ("--drift-pct-per-min", a.drift_pct_per_min),
        ("--carry-over-pct", a.carry_over_pct),
        ("--carry-over-leaves-pct", a.carry_over_leaves_pct),
    ):
        _need(value >= 0, flag, f"must be >= 0, got {value}")
    _need(
        a.drift_origin is None or 0 <= a.drift_origin < math.inf,
        "--drift-origin",
        f"must be an epoch time in seconds (>= 0), got {a.drift_origin}",
    )
    _need(0 <= a.cold_bits <= 16, "--cold-bits", f"must be 0 (exact) to 16, got {a.cold_bits}")
    _need(0 <= a.flip_pct <= 100, "--flip-pct", f"must be 0 to 100, got {a.flip_pct}")
    _need(
        0 <= a.runner_up_mass < 1,
        "--runner-up-mass",
        f"must be at least 0 and below 1, got {a.runner_up_mass}",
    )
    _need(
        0 <= a.step_slowdown_pct < math.inf,
        "--step-slowdown-pct",
        f"must be a finite number >= 0, got {a.step_slowdown_pct}",
    )
    _need(
        0 <= a.heat_slowdown_pct < math.inf,
        "--heat-slowdown-pct",
        f"must be a finite number >= 0, got {a.heat_slowdown_pct}",
    )
    _need(0 <= a.heat_source <= 1, "--heat-source", f"must be in 0..1, got {a.heat_source}")
    _need(
        0 < a.heat_half_life_requests < math.inf,
        "--heat-half-life-requests",
        f"must be a finite number > 0, got {a.heat_half_life_requests}",
    )
    for flag, value in (
        ("--heat-slowdown-pct", a.heat_slowdown_pct),
        ("--heat-source", a.heat_source),
    ):
        _need(
            value == 0 or a.heat_state is not None,
            flag,
            "needs --heat-state (the file that holds the box's heat across boots)",
        )
    for flag, value in (
        ("--carry-over-pct", a.carry_over_pct),
        ("--carry-over-leaves-pct", a.carry_over_leaves_pct),
    ):
        _need(
            value == 0 or a.carry_over_state is not None,
            flag,
            "needs --carry-over-state (the file that says which boot ran before this one)",
        )


def _check_paths(a: argparse.Namespace) -> None:
    """Folders that must exist, files whose folder must, and the admin token's length."""
    if a.cold_dir is not None:
        _need(os.path.isdir(a.cold_dir), "--cold-dir", f"{a.cold_dir!r} is not a directory")
    for flag, path in (
        ("--ring", a.ring),
        ("--counters", a.counters),
        ("--route-trace", a.route_trace),
    ):
        if path is not None:
            parent = os.path.dirname(os.path.abspath(path))
            _need(os.path.isdir(parent), flag, f"directory {parent!r} does not exist")
    # The state files are shared by a box's boots, which start in different folders.
    for flag, path in (("--carry-over-state", a.carry_over_state), ("--heat-state", a.heat_state)):
        _need(path is None or os.path.isabs(path), flag, f"{path!r} is not an absolute path")
    _need(
        re.fullmatch(r"[A-Za-z0-9_.-]*", a.carry_over_tag) is not None,
        "--carry-over-tag",
        f"{a.carry_over_tag!r}: letters, digits, '.', '_' and '-' only (it is a line of the "
        "state file)",
    )
    if a.dump_dir is not None:
        _need(os.path.isdir(a.dump_dir), "--dump-dir", f"{a.dump_dir!r} is not a directory")
    _need(
        a.admin_token is None or len(a.admin_token) >= 16,
        "--admin-token",
        "at least 16 characters (the harness gives 32 random hex digits)",
    )


def _policy_knobs(a: argparse.Namespace) -> PolicyKnobs:
    """The adaptive policy's knobs, validated by the policy itself."""
    knobs = PolicyKnobs(
        policy=a.policy,
        decay_half_life_steps=a.decay_half_life_steps,
        promote_threshold=a.promote_threshold,
        hysteresis=a.hysteresis,
        drain_every=a.drain_every,
        swaps_per_layer=a.swaps_per_layer,
    )
    try:
        knobs.validate()
    except KnobError as exc:
        name = exc.message.split(":", 1)[0]
        raise UsageError(f"{_KNOB_FLAGS.get(name, '--policy')}: {exc.message}") from exc
    return knobs


def _read_rowmap(a: argparse.Namespace) -> tuple[list[list[int]] | None, int]:
    """The rowmap's hot sets (None without one) and the hot slots they make per layer."""
    rowmap: list[list[int]] | None = None
    hot_slots = a.hot_slots
    if a.rowmap is not None:
        _need(
            a.cache_records == 0,
            "--rowmap",
            "a rowmap and cache mode (--cache-records) exclude each other; pick one",
        )
        try:
            loaded = read_rowmap(a.rowmap, experts=a.experts)
        except (HarnessError, OSError) as exc:
            raise UsageError(f"--rowmap: {error_message(exc)}") from exc
        rowmap = [sorted(int(e) for e in layer) for layer in loaded.hot]
        _need(
            len(rowmap) == a.layers,
            "--rowmap",
            f"{a.rowmap}: has {len(rowmap)} layers, the model has {a.layers} (--layers)",
        )
        sizes = sorted({len(layer) for layer in rowmap})
        _need(
            len(sizes) == 1,
            "--rowmap",
            f"{a.rowmap}: hot sets differ in size across layers ({sizes}); one size per map",
        )
        hot_slots = sizes[0]
    return rowmap, hot_slots


def _read_hotlist(
    a: argparse.Namespace, priority: Literal["legacy", "adaptive"] | int
) -> list[tuple[int, int]]:
    """The ds4 hotlist's (layer, expert) entries, checked against cache mode's geometry."""
    hotlist: list[tuple[int, int]] = []
    if a.hotlist is not None:
        _need(a.cache_records > 0, "--hotlist", "a hotlist needs cache mode: set --cache-records N")
        try:
            entries = read_hotlist(a.hotlist).entries
            hotlist = [(int(e[0]), int(e[1])) for e in entries]
            ExpertCache(a.cache_records, hotlist, priority, a.layers, a.experts)
        except (HarnessError, OSError) as exc:
            raise UsageError(f"--hotlist: {error_message(exc)}") from exc
    return hotlist


def _recorder_mode(a: argparse.Namespace) -> str | None:
    """SGLang's recorder mode, as KTransformers' GPU-mask flag implies it."""
    recorder_mode: str | None = a.expert_distribution_recorder_mode
    if a.record_kt_gpu_expert_distribution and recorder_mode is None:
        recorder_mode = "stat"  # as KTransformers' build sets it
    _need(
        recorder_mode in (None, "stat"),
        "--expert-distribution-recorder-mode",
        f"{recorder_mode!r}: the reference runtime records mode stat only",
    )
    _need(
        not (a.record_kt_gpu_expert_distribution and a.cache_records > 0),
        "--record-kt-gpu-expert-distribution",
        "GPU masks are the rowmap's hot sets: not in cache mode (--cache-records)",
    )
    return recorder_mode


def _validate(a: argparse.Namespace) -> ServeConfig:
    """Check every value and read the maps; raises UsageError naming the first bad flag."""
    _check_ranges(a)
    _check_paths(a)
    knobs = _policy_knobs(a)
    try:
        priority = parse_priority(a.hotlist_priority)
    except KnobError as exc:
        raise UsageError(f"--hotlist-priority: {exc.message}") from exc
    rowmap, hot_slots = _read_rowmap(a)
    hotlist = _read_hotlist(a, priority)
    recorder_mode = _recorder_mode(a)
    model = ModelConfig(
        layers=a.layers,
        experts=a.experts,
        top_k=a.top_k,
        d_model=a.d_model,
        d_ff=a.d_ff,
        seed=a.seed,
    )
    options = EngineOptions(
        hot_slots=hot_slots,
        expert_bytes=a.expert_bytes,
        cold_dir=a.cold_dir,
        rowmap=rowmap,
        knobs=knobs,
        cache_records=a.cache_records,
        hotlist=hotlist,
        hotlist_priority=priority,
        ring_path=a.ring,
        ring_capacity=a.ring_capacity,
        route_trace_path=a.route_trace,
        drift_pct_per_min=a.drift_pct_per_min,
        drift_origin_s=time.time() if a.drift_origin is None else a.drift_origin,
        carry_over_pct=carried_over_pct(
            a.carry_over_state, a.carry_over_tag, a.carry_over_pct, a.carry_over_leaves_pct
        ),
        heat=box_heat(a.heat_state, a.heat_source, a.heat_slowdown_pct, a.heat_half_life_requests),
        step_slowdown_pct=a.step_slowdown_pct,
        fault=a.fault,
        cold_bits=a.cold_bits,
        lossy=LossyMode(flip_pct=a.flip_pct, runner_up_mass=a.runner_up_mass),
        phase=a.phase,
        expert_recorder=recorder_mode,
        expert_recorder_masks=a.record_kt_gpu_expert_distribution,
    )
    return ServeConfig(
        args=a,
        model=model,
        options=options,
        host=a.host,
        port=a.port,
        model_name=a.model_name,
        counters_path=a.counters,
        fail_after_tokens=a.fail_after_tokens,
        hang_after_tokens=a.hang_after_tokens,
        boot_delay_s=a.boot_delay_s,
        never_ready=a.never_ready,
        admin_token=a.admin_token,
        dump_dir=os.path.realpath(a.dump_dir if a.dump_dir is not None else os.getcwd()),
    )


def carried_over_pct(state: str | None, tag: str, pct: float, leaves_pct: float = 0.0) -> float:
    """The slowdown this boot carries over from the one before it, and record this boot.

    Carry-over injection: the state file holds the tag of the last boot on the box and, on a
    second line, the percent it leaves behind. This boot is ``pct`` percent slower when that tag
    differs from its own (a candidate's pages evicted the control's, say), not at all after a
    boot of its own tag or as the first boot; and it is slower by whatever the boot before left
    (``leaves_pct`` of that boot: heat, whatever this boot's tag, its own included). The tag is
    written whatever ``pct`` is, so a cell without the slowdown still marks the box.
    """
    if state is None:
        return 0.0
    path = Path(state)
    try:
        previous: str | None = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        previous = None
    except OSError as exc:
        raise UsageError(f"--carry-over-state: cannot read {state}: {exc.strerror}") from exc
    left = 0.0
    if previous is not None:
        previous, _, rest = previous.partition("\n")
        try:
            left = max(0.0, float(rest)) if rest.strip() else 0.0
        except ValueError:
            left = 0.0  # not one of ours: nothing left behind
    try:
        text = f"{tag}\n{leaves_pct:g}" if leaves_pct else tag
        write_text_atomic(path, text, make_folder=False)
    except OSError as exc:
        raise UsageError(f"--carry-over-state: cannot write {state}: {exc.strerror}") from exc
    return (pct if previous is not None and previous != tag else 0.0) + left


def box_heat(
    state: str | None, source: float, slowdown_pct: float, half_life_requests: float
) -> HeatSettings | None:
    """This boot's heat settings with the heat the box has now (None without a state file).

    The file is written back at once with what it held (a cool box's when it is missing), so a
    path that cannot be written fails the boot here, before the port is bound, not a request.
    """
    if state is None:
        return None
    try:
        heat, requests = read_heat(state)
    except OSError as exc:
        raise UsageError(f"--heat-state: cannot read {state}: {exc.strerror}") from exc
    except ValueError as exc:
        raise UsageError(
            f"--heat-state: {exc}; delete it to start from a cool box (heat 0)"
        ) from exc
    try:
        write_heat(state, heat, requests)
    except OSError as exc:
        raise UsageError(f"--heat-state: cannot write {state}: {exc.strerror}") from exc
    return HeatSettings(
        path=state,
        source=source,
        slowdown_pct=slowdown_pct,
        half_life_requests=half_life_requests,
        heat=heat,
        requests=requests,
    )


def error_message(exc: BaseException) -> str:
    """The one-line message of a harness or file error, as a flag error or HTTP 400 shows it."""
    if isinstance(exc, HarnessError):
        return exc.message
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def parse_serve_args(argv: list[str], environ: dict[str, str] | None = None) -> ServeConfig | int:
    """Parse and validate flags and env; on error print one line and return exit code 2."""
    parser = build_parser()
    try:
        _apply_env(parser, dict(os.environ if environ is None else environ))
        return _validate(parser.parse_args(argv))
    except UsageError as exc:
        print(f"refbox: {exc}", file=sys.stderr)
        return 2
