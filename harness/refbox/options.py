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
from typing import Any, Literal, NoReturn

from harness.errors import HarnessError, KnobError
from harness.formats.maps import read_hotlist, read_rowmap
from harness.policy.residency import ExpertCache, PolicyKnobs, parse_priority
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.heat import HeatSettings, read_heat, write_heat
from harness.refbox.model import ModelConfig

__all__ = ["ServeConfig", "build_parser", "error_message", "parse_serve_args"]

_HELP = """\
The bundled reference runtime: a small MoE decoder served over an OpenAI-compatible API.

Every flag also reads the environment variable REFBOX_<FLAG> (upper case, dashes as
underscores, e.g. REFBOX_HOT_SLOTS=32); a flag on the command line wins. An invalid value fails
startup with one line `refbox: --flag: message` and exit code 2, before the port is bound.
Readiness: GET /health turns 200 and stderr prints `refbox: listening on http://HOST:PORT`.
SIGTERM/SIGINT finish gracefully: ring and route trace flushed, counters written, exit 0.
"""


class _UsageError(Exception):
    """A flag or env value is invalid; the message is the whole line after ``refbox: ``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse says "argument --port: invalid int value: 'x'"; keep our one-line shape.
        match = re.match(r"argument (--[\w-]+)(?:/[^:]*)?: (.*)", message)
        raise _UsageError(f"{match[1]}: {match[2]}" if match else message)


def _float(text: str) -> float:
    value = float(text)
    if value != value:  # NaN
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class _Option:
    """One flag of ``serve``: its name and argparse keywords."""

    flag: str
    settings: dict[str, Any]


def _option(flag: str, **settings: Any) -> _Option:
    return _Option(flag, settings)


# The `serve` flags by --help group: each flag's argparse settings.
_POLICY = PolicyKnobs()
_OPTIONS: dict[str, tuple[_Option, ...]] = {
    "server": (
        _option("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"),
        _option("--port", type=int, default=8000, help="port; 0 picks a free one (8000)"),
        _option("--model-name", default="refbox", help="served model id (refbox)"),
    ),
    "model": (
        _option("--layers", type=int, default=8, help="MoE layers (8)"),
        _option("--experts", type=int, default=64, help="experts per layer (64)"),
        _option("--top-k", type=int, default=4, help="experts per token per layer (4)"),
        _option("--d-model", type=int, default=64, help="hidden width (64)"),
        _option("--d-ff", type=int, default=128, help="expert FFN width (128)"),
        _option("--seed", type=int, default=0, help="weights seed (0)"),
    ),
    "tiers": (
        _option("--hot-slots", type=int, default=48, help="resident experts per layer (48)"),
        _option(
            "--expert-bytes",
            type=int,
            default=512 * 1024,
            help="slow-tier record size in bytes; a cold lookup reads and copies one whole record, "
            "so this scales the cost of a miss (524288; never below the weights' own size)",
        ),
        _option("--cold-dir", default=None, help="directory for the slow-tier file (tmp)"),
        _option(
            "--rowmap",
            default=None,
            help="rowmap JSON: hot experts per layer (default: the first "
            "hot-slots ids of each layer, a deliberately stale map)",
        ),
        _option("--hotlist", default=None, help="ds4 hotlist file (cache mode)"),
        _option(
            "--cache-records",
            type=int,
            default=0,
            help="cache mode: cached records in all (0 = off)",
        ),
        _option(
            "--hotlist-priority", default="adaptive", help="cache mode prior: legacy, adaptive or N"
        ),
    ),
    "adaptive residency policy (rowmap mode)": (
        _option("--policy", default=_POLICY.policy, help=f"adaptive or frozen ({_POLICY.policy})"),
        _option(
            "--decay-half-life-steps",
            type=_float,
            default=_POLICY.decay_half_life_steps,
            help=f"EWMA half-life of the counters ({_POLICY.decay_half_life_steps:g})",
        ),
        _option(
            "--promote-threshold",
            type=_float,
            default=_POLICY.promote_threshold,
            help=f"decayed count a cold expert needs ({_POLICY.promote_threshold:g})",
        ),
        _option(
            "--hysteresis",
            type=_float,
            default=_POLICY.hysteresis,
            help=f"margin over the weakest hot expert ({_POLICY.hysteresis:g})",
        ),
        _option(
            "--drain-every",
            type=int,
            default=_POLICY.drain_every,
            help=f"decode steps between swap-queue drains ({_POLICY.drain_every})",
        ),
        _option(
            "--swaps-per-layer",
            type=int,
            default=_POLICY.swaps_per_layer,
            help=f"swaps per layer per drain ({_POLICY.swaps_per_layer})",
        ),
    ),
    "files": (
        _option("--ring", default=None, help="telemetry ring file (one record per step)"),
        _option("--ring-capacity", type=int, default=65536, help="ring slots (65536)"),
        _option("--counters", default=None, help="counters JSON written at shutdown"),
        _option("--route-trace", default=None, help="routing trace JSONL"),
        _option("--phase", type=int, default=0, help="initial phase tag in the ring (0)"),
        _option(
            "--dump-dir",
            default=None,
            help="the only folder /admin/dump may write into (default: the working directory)",
        ),
        _option(
            "--admin-token",
            default=None,
            help="require `Authorization: Bearer TOKEN` on every /admin call; give it as "
            "REFBOX_ADMIN_TOKEN (a flag shows in ps), as the harness does at every boot",
        ),
        _option(
            "--control",
            default=None,
            help="control file polled for knob changes and resets (JSON {seq, knobs, reset}); each "
            "is acknowledged in the log as 'refbox: control SEQ applied' or '... rejected: WHY'",
        ),
        _option(
            "--control-signal",
            choices=["HUP", "USR1", "USR2"],
            default=None,
            help="read the control file only when this signal arrives (once ready), not by polling",
        ),
    ),
    "vLLM dialect": (
        _option(
            "--enable-return-routed-experts",
            action="store_true",
            help="a whole (non-streamed) completion carries `routed_experts` in its choice, as "
            "vLLM's does: base64 .npy bytes, [prompt + completion tokens - 1, layers, top_k]",
        ),
        _option(
            "--routed-experts-format",
            choices=["vllm", "sglang"],
            default="vllm",
            help="sglang: return the routing as SGLang does instead, only to a request asking "
            "`return_routed_experts: true`, as the response's `sglext.routed_experts` (base64 of "
            "flat little-endian int32)",
        ),
    ),
    "SGLang recorder dialect (dumps into $SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR, /tmp)": (
        _option(
            "--expert-distribution-recorder-mode",
            default=None,
            help="stat: serve /start_, /stop_ and /dump_expert_distribution_record as SGLang does "
            "(per-pass counts, an infinite buffer)",
        ),
        _option(
            "--record-kt-gpu-expert-distribution",
            action="store_true",
            help="write KTransformers' gpu_expert_masks (the hot tier per pass) beside each dump, "
            "in gpu_expert_distribution_<time>.pt; "
            "implies --expert-distribution-recorder-mode stat (rowmap mode only)",
        ),
    ),
    "fault and drift injection": (
        _option(
            "--fail-after-tokens",
            type=int,
            default=None,
            help="exit with code 1 right after the N-th generated token of the process lifetime",
        ),
        _option(
            "--hang-after-tokens",
            type=int,
            default=None,
            help="after the N-th generated token stop emitting, keeping the connection open",
        ),
        _option(
            "--boot-delay-s",
            type=_float,
            default=0.0,
            help="wait this long (health 503) before loading the model (0)",
        ),
        _option("--never-ready", action="store_true", help="load, but keep /health at 503 forever"),
        _option(
            "--drift-pct-per-min",
            type=_float,
            default=0.0,
            help="make every step P%% slower per minute since --drift-origin, by real extra work",
        ),
        _option(
            "--drift-origin",
            type=_float,
            default=None,
            help="epoch seconds the drift counts from, shared across boots (default: boot time)",
        ),
        _option(
            "--step-slowdown-pct",
            type=_float,
            default=0.0,
            help="make every decode step P%% slower, by real extra work, for the whole boot: a "
            "cell that is a set amount slower than another at any state of the box (0)",
        ),
        _option(
            "--carry-over-pct",
            type=_float,
            default=0.0,
            help="make every step P%% slower, by real extra work, when the boot before this one on "
            "the box (per --carry-over-state) had another --carry-over-tag: carry-over (0)",
        ),
        _option(
            "--carry-over-leaves-pct",
            type=_float,
            default=0.0,
            help="make the NEXT boot on the box P%% slower, whatever its tag (heat, a dirtied page "
            "cache: carry-over a cell leaves behind, itself included), per --carry-over-state (0)",
        ),
        _option(
            "--carry-over-tag",
            default="",
            help="this boot's tag in the carry-over state file (e.g. the cell's name)",
        ),
        _option(
            "--carry-over-state",
            default=None,
            help="file holding the tag of the last boot on this box (and the percent it leaves); "
            "read, then overwritten, at boot",
        ),
        _option(
            "--heat-state",
            metavar="FILE",
            default=None,
            help="file holding the box's heat S in 0..1 (state a box keeps and traffic relaxes: "
            "a skewed tier, a page cache, heat), shared by every boot on the box that names it: "
            "read at boot, rewritten atomically after every completed request; missing: S = 0",
        ),
        _option(
            "--heat-source",
            metavar="X",
            type=_float,
            default=0.0,
            help="what this boot's traffic drives the heat towards, 0..1: each completed "
            "request sets S to X + (S - X) * 2^(-1/H), H per --heat-half-life-requests "
            "(0: it cools the box)",
        ),
        _option(
            "--heat-slowdown-pct",
            metavar="P",
            type=_float,
            default=0.0,
            help="make every decode step P%% x S slower, by real extra work, S being the box's "
            "heat when the step runs (per --heat-state; 0: off)",
        ),
        _option(
            "--heat-half-life-requests",
            metavar="H",
            type=_float,
            default=HeatSettings.half_life_requests,
            help="completed requests that halve the distance between the heat and --heat-source "
            f"({HeatSettings.half_life_requests:g})",
        ),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``serve`` flags (see ``--help``), from the table above."""
    parser = _Parser(
        prog="harness refbox serve",
        description=_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for title, options in _OPTIONS.items():
        group = parser.add_argument_group(title)
        for option in options:
            group.add_argument(option.flag, **option.settings)
    return parser


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
                raise _UsageError(f"{flag}: {key}={raw!r} must be one of 1, 0, true, false")
            action.default = raw.strip().lower() in _TRUE
            continue
        convert: Callable[[str], Any] = action.type if callable(action.type) else str
        try:
            action.default = convert(raw)
        except ValueError as exc:
            raise _UsageError(f"{flag}: invalid value {raw!r} from {key}") from exc


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
    admin_token: str | None = None  # required on every /admin call when set
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
        raise _UsageError(f"{flag}: {message}")


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
        raise _UsageError(f"{_KNOB_FLAGS.get(name, '--policy')}: {exc.message}") from exc
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
            raise _UsageError(f"--rowmap: {error_message(exc)}") from exc
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
            raise _UsageError(f"--hotlist: {error_message(exc)}") from exc
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
    """Check every value and read the maps; raises _UsageError naming the first bad flag."""
    _check_ranges(a)
    _check_paths(a)
    knobs = _policy_knobs(a)
    try:
        priority = parse_priority(a.hotlist_priority)
    except KnobError as exc:
        raise _UsageError(f"--hotlist-priority: {exc.message}") from exc
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
        raise _UsageError(f"--carry-over-state: cannot read {state}: {exc.strerror}") from exc
    left = 0.0
    if previous is not None:
        previous, _, rest = previous.partition("\n")
        try:
            left = max(0.0, float(rest)) if rest.strip() else 0.0
        except ValueError:
            left = 0.0  # not one of ours: nothing left behind
    try:
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_text(f"{tag}\n{leaves_pct:g}" if leaves_pct else tag, encoding="utf-8")
        os.replace(scratch, path)
    except OSError as exc:
        raise _UsageError(f"--carry-over-state: cannot write {state}: {exc.strerror}") from exc
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
        raise _UsageError(f"--heat-state: cannot read {state}: {exc.strerror}") from exc
    except ValueError as exc:
        raise _UsageError(
            f"--heat-state: {exc}; delete it to start from a cool box (heat 0)"
        ) from exc
    try:
        write_heat(state, heat, requests)
    except OSError as exc:
        raise _UsageError(f"--heat-state: cannot write {state}: {exc.strerror}") from exc
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
    except _UsageError as exc:
        print(f"refbox: {exc}", file=sys.stderr)
        return 2
