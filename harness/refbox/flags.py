"""The reference runtime's ``serve`` flags as a table: each flag's --help group and argparse
settings, and the parser built from it. :mod:`harness.refbox.options` reads them (with their
``REFBOX_*`` environment variables) and validates the values.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from harness.policy.residency import PolicyKnobs
from harness.refbox.heat import HeatSettings

_HELP = """\
The bundled reference runtime: a small MoE decoder served over an OpenAI-compatible API.

Every flag also reads the environment variable REFBOX_<FLAG> (upper case, dashes as
underscores, e.g. REFBOX_HOT_SLOTS=32); a flag on the command line wins. An invalid value fails
startup with one line `refbox: --flag: message` and exit code 2, before the port is bound.
Readiness: GET /health turns 200 and stderr prints `refbox: listening on http://HOST:PORT`.
SIGTERM/SIGINT finish gracefully: ring and route trace flushed, counters written, exit 0.
"""


class UsageError(Exception):
    """A flag or env value is invalid; the message is the whole line after ``refbox: ``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse says "argument --port: invalid int value: 'x'"; keep our one-line shape.
        match = re.match(r"argument (--[\w-]+)(?:/[^:]*)?: (.*)", message)
        raise UsageError(f"{match[1]}: {match[2]}" if match else message)


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
            help="require `Authorization: Bearer TOKEN` on every /admin and recorder call; "
            "give it as REFBOX_ADMIN_TOKEN (a flag shows in ps), as the harness does at every boot",
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
            "--fault",
            choices=["none", "empty-hot", "ignore-policy", "swap-weights", "scale-logits"],
            default="none",
            help="a change that silently never takes effect, for engagement checks: empty-hot "
            "keeps no expert resident while reporting --hot-slots as set; ignore-policy "
            "reports --policy as given and runs the residency frozen; or one that breaks the "
            "outputs, for canaries: swap-weights gives every 5th expert loaded from the slow "
            "tier its neighbour's weights; scale-logits multiplies every logit by 1.1, which "
            "keeps every greedy output and moves the log-probabilities (none)",
        ),
        _option(
            "--cold-bits",
            type=int,
            default=0,
            help="a lossy mode: experts loaded from the slow tier are quantized to B bits "
            "(1-16) and copy B/32 of their record; 0 loads them exact (0)",
        ),
        _option(
            "--flip-pct",
            type=_float,
            default=0.0,
            help="a lossy mode of a known divergence: each generated byte, with chance P%% "
            "drawn from a hash of the seed, prompt and position, is the runner-up byte (0)",
        ),
        _option(
            "--runner-up-mass",
            type=_float,
            default=0.0,
            help="a lossy mode of a known KL: every next-byte distribution moves E of its "
            "probability onto its runner-up, a KL of at most -log(1-E) nats (0)",
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
