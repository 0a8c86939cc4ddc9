"""Boxes (where commands run) and runtime profiles (how to boot and talk to a runtime), as data.

Adding a runtime is a YAML file under ``campaigns/runtimes/``, not code. These models are the
schema of those files and of the inline mappings a card may use instead of a name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from harness.catalog import COUNTERS, METRICS
from harness.profiles.base import Platform, Strict, _check_regex
from harness.profiles.live import LiveAction, LiveContract, LiveHttp
from harness.profiles.telemetry import LOG_UNITS, LogUnit, Telemetry


class HttpProbe(Strict):
    """Ready when GET ``path`` answers ``status``."""

    path: str = Field("/health", description="path probed on the runtime's port")
    status: int = Field(200, ge=100, le=599, description="HTTP status meaning ready")


class ReadyProbe(Strict):
    """How to tell that a booted runtime is ready to serve."""

    http: HttpProbe | None = Field(None, description="HTTP readiness probe")
    log_line: str | None = Field(None, description="regex; ready once the log shows a match")
    timeout_s: float = Field(
        120, gt=0, le=1e6, allow_inf_nan=False, description="give up (boot failed) after this long"
    )
    interval_s: float = Field(0.2, gt=0, le=1e4, allow_inf_nan=False, description="probe interval")

    @model_validator(mode="after")
    def _needs_one(self) -> ReadyProbe:
        if self.http is None and self.log_line is None:
            raise ValueError("a readiness probe needs `http` and/or `log_line`")
        if self.log_line is not None:
            _check_regex(self.log_line, "log_line")
        return self


class Api(Strict):
    """The OpenAI-compatible surface the workload driver speaks."""

    flavour: Literal["completions", "chat"] = Field("completions", description="endpoint kind")
    streaming: bool = Field(True, description="stream with SSE")
    model: str = Field("default", description="model name sent in requests")
    extra_body: dict[str, object] = Field(
        default_factory=dict, description="fields merged into every request (cache_prompt…)"
    )


_SWITCH_STATES = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def switch_state(text: str) -> bool | None:
    """A switch knob's value as on/off (``1``/``true``/``on``, ``0``/``false``/``off``); None
    when it is neither."""
    return _SWITCH_STATES.get(text.strip().lower())


def _within(value: str, bounds: tuple[int, int]) -> bool:
    """Whether the number ``value`` starts with lies within ``bounds`` (none: it does not)."""
    digits = re.match(r"-?[0-9]+", value)
    return digits is not None and bounds[0] <= int(digits.group()) <= bounds[1]


class EngagementSignature(Strict):
    """What every boot of a cell shows when its change of this knob took effect: a run-table
    metric or counter above a floor, or outside the range of the control's boots."""

    metric: str = Field(description="a metric or counter of the run table (hit_rate, swaps, ...)")
    above: float | None = Field(
        None, allow_inf_nan=False, description="each boot's value must exceed this"
    )
    differs: bool = Field(
        False, description="each boot's value must lie outside the control's boots' range"
    )
    when: list[str] | None = Field(
        None, description="only where the knob is one of these (a switch: true or false)"
    )
    unless: list[str] = Field(
        default_factory=list, description="not where the knob is one of these (hot_slots 0)"
    )

    @model_validator(mode="after")
    def _one_test(self) -> EngagementSignature:
        if (self.above is None) == (not self.differs):
            raise ValueError("an engagement signature takes one of `above: N` or `differs: true`")
        return self

    def applies(self, value: str) -> bool:
        """Whether this signature judges a cell whose knob is ``value``."""
        return (self.when is None or value in self.when) and value not in self.unless

    def text(self) -> str:
        """How the report names it: ``hit_rate > 0``, ``swaps differs from the control``."""
        if self.above is not None:
            return f"{self.metric} > {self.above:g}"
        return f"{self.metric} outside the control's range"


class KnobSpec(Strict):
    """One knob a cell may set by name: how it reaches the runtime and what values are valid."""

    env: str | None = Field(None, description="environment variable it sets")
    arg: str | None = Field(None, description="command-line flag it sets (value follows)")
    live: str | None = Field(None, description="key in the live-knob endpoint's JSON body")
    choices: list[str] | None = Field(None, description="allowed values")
    pattern: str | None = Field(None, description="regex a value must match in full")
    bounds: tuple[int, int] | None = Field(
        None,
        description="[least, most] the number a value matching `pattern` starts with may be "
        "(an engine's integer parse: ds4's strtol to INT_MAX)",
    )
    help: str = Field("", description="what the knob does, for error messages")
    engaged: list[EngagementSignature] = Field(
        default_factory=list,
        description="what a boot shows when a change of this knob took effect (docs/design.md"
        "#engagement); none: the report says engagement is not verified",
    )
    lossless: bool = Field(
        True,
        description="a change of it keeps the model's greedy outputs (docs/design.md#canaries); "
        "false for a knob that picks another model (weights, a seed): its cells' canaries are "
        "not compared",
    )
    default: str | None = Field(None, description="value used when a cell does not set it")
    required: bool = Field(
        False, description="every cell must set it (a container image, a model path)"
    )
    switch: bool = Field(
        False,
        description="`arg` is a flag without a value (--enforce-eager): given when the knob is "
        "true, left out when it is false (or `off_arg` given instead); or `env` is a variable "
        'the runtime tests for presence only (ds4\'s getenv(...) != NULL, where even "0" turns '
        "it on): set to 1 when true, left unset when false",
    )
    off_arg: str | None = Field(
        None, description="flag given when a switch knob is false (--no-enable-prefix-caching)"
    )

    @model_validator(mode="after")
    def _one_route(self) -> KnobSpec:
        if not (self.env or self.arg or self.live):
            raise ValueError("a knob needs `env`, `arg` or `live`")
        if self.pattern is not None:
            _check_regex(self.pattern, "pattern")
        if self.switch and (bool(self.arg) == bool(self.env) or self.live):
            raise ValueError(
                "a `switch` knob is a flag (`arg`) or a presence-tested variable (`env`): "
                "give exactly one of them and no `live`"
            )
        if self.switch and (self.choices is not None or self.pattern is not None):
            raise ValueError("a `switch` knob is true or false: drop `choices` and `pattern`")
        if self.off_arg is not None and (not self.switch or self.env):
            raise ValueError("`off_arg` belongs to a `switch` flag knob (`arg`, `switch: true`)")
        if self.bounds is not None and (self.pattern is None or self.bounds[0] > self.bounds[1]):
            raise ValueError("`bounds` [least, most] narrows a `pattern`: give both, least first")
        if self.switch and self.default is not None and switch_state(self.default) is None:
            raise ValueError(f"`default` of a switch must be true or false, not {self.default!r}")
        return self

    def check(self, value: str) -> str | None:
        """None when ``value`` is valid, else the message naming what is allowed."""
        if self.switch:
            if switch_state(value) is None:
                return f"is a switch ({self.arg or self.env}): must be true or false"
            return None
        if self.choices is not None and value in self.choices:
            return None
        matches = self.pattern is not None and re.fullmatch(self.pattern, value)
        if matches and (self.bounds is None or _within(value, self.bounds)):
            return None
        if self.choices is None and self.pattern is None:
            return None
        allowed = ", ".join(self.choices or [])
        if self.pattern is not None:
            extra = self.help or f"a value matching {self.pattern}"
            allowed = f"{allowed}, or {extra}" if allowed else extra
        return f"must be one of {allowed}" if self.choices else f"must be {allowed}"


class KnobPin(Strict):
    """A knob a cell must set (pin) when it sets any of ``when_set``, else a validation warning.

    llama.cpp's ``--fit`` (on by default in builds that have it) rewrites the GPU layer count and
    tensor placement it was not told to keep, so a cell that sets ``n_cpu_moe`` without pinning
    ``fit`` may not run the placement it names.
    """

    knob: str = Field(description="the knob to pin")
    when_set: list[str] = Field(min_length=1, description="knobs whose setting asks for the pin")
    why: str = Field(description="what happens unpinned, ending with the fix")


class Boot(Strict):
    """How to start the runtime.

    Templates may use {port} {run_dir} {python} {bind_host} {cache_dir} and {files.NAME}.
    """

    command: list[str] = Field(min_length=1, description="argv template")
    env: dict[str, str] = Field(default_factory=dict, description="env templates")
    cwd: str | None = Field(None, description="working directory template")


class Stop(Strict):
    """How to stop the runtime: a signal to its process group, then SIGKILL after a grace."""

    signal: Literal["TERM", "INT", "KILL"] = Field("TERM", description="first signal sent")
    grace_s: float = Field(
        30, ge=0, le=1e5, allow_inf_nan=False, description="seconds before SIGKILL"
    )


class Version(Strict):
    """How to record which build ran."""

    command: list[str] | None = Field(None, description="argv printing the version")
    binary: str | None = Field(
        None,
        description="file whose SHA-256 is recorded; `~/` and `$VAR`, `${VAR:-default}` expand "
        "in the box's shell",
    )


class CommandDriver(Strict):
    """A runtime measured by its own benchmark binary: the command is the run.

    Knobs reach it as they would a boot (env, or flags appended to ``argv``); its stdout (or
    ``result_path``) is a CSV or JSON table whose columns map, by header name, onto metrics.
    """

    kind: Literal["command"] = Field(description="run a command per run (no server)")
    argv: list[str] = Field(min_length=1, description="argv template, as a boot command")
    env: dict[str, str] = Field(default_factory=dict, description="env templates")
    cwd: str | None = Field(None, description="working directory template")
    result: Literal["csv", "json"] = Field(description="format of the result table")
    result_path: str | None = Field(
        None, description="file template the command writes its table to (default: its stdout)"
    )
    columns: dict[str, str] = Field(
        min_length=1, description="metric -> header name of the result column holding it"
    )
    where: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="header -> value: only rows whose column equals it are kept (e.g. n_prompt: 0)",
    )
    units: dict[str, LogUnit] = Field(
        default_factory=dict, description="metric -> unit as written (GiB read as bytes)"
    )
    tier: str | None = Field(
        None,
        description="header labelling each row's tier (ds4-bench: ctx_tokens), reported per tier",
    )
    timeout_s: float = Field(
        3600, gt=0, le=1e6, allow_inf_nan=False, description="a run past this fails"
    )

    @model_validator(mode="after")
    def _known_metrics(self) -> CommandDriver:
        known = {*METRICS, *COUNTERS}
        unknown = sorted(set(self.columns) - known)
        if unknown:
            raise ValueError(
                f"driver.columns maps onto {', '.join(unknown)}, not metrics or counters; "
                f"known: {', '.join(sorted(known))}"
            )
        extra = sorted(set(self.units) - set(self.columns))
        if extra:
            raise ValueError(f"driver.units names {', '.join(extra)}, not in driver.columns")
        return self

    def scale(self) -> dict[str, float]:
        """metric -> factor from the unit written to the stored unit."""
        return {metric: LOG_UNITS[unit] for metric, unit in self.units.items()}


class Idle(Strict):
    """The box is idle when these Prometheus metrics read 0 for ``for_s`` seconds."""

    metrics: list[str] = Field(min_length=1, description="e.g. vllm:num_requests_running")
    for_s: float = Field(120, ge=0, le=1e5, allow_inf_nan=False, description="how long at 0")
    timeout_s: float = Field(
        900, gt=0, le=1e6, allow_inf_nan=False, description="give up (cohort not run) after"
    )


class LogitDumps(Strict):
    """Where a run leaves frontier-logit dumps (``frontier_NNNNNN.logits.json``) for parity."""

    path: str = Field(description="folder template on the box, e.g. {run_dir}/logits")
    glob: str = Field("frontier_*.logits.json", description="dump file names in that folder")


FileRoute = Annotated[str, Field(pattern=r"^(arg|env):\S+$")]


# A probe's template names knobs or places in bare braces ({heat_state}, {cache_dir}); any other
# braces (an awk program's) are the command's own.
PROBE_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Places beside the knobs: the box's cache folder, where a runtime keeps files across boots.
PROBE_PLACES = ("cache_dir",)


class StateProbe(Strict):
    """A state of the box that carries from one block into the next (heat, a page cache, a
    skewed tier), read on the box before each block's warm-up and washout, as its scored
    requests begin and as they end; harness.stats.box_state withholds a label while it has not
    settled and says what washout would settle it. One of ``command`` (prints a number) or
    ``file`` (a number, or with ``key`` a JSON object's numeric field)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="the probe's name in records")
    command: str | None = Field(
        None,
        description="shell command run on the box that prints one number; {knob} is the "
        "cell's setting of that knob and {cache_dir} the box's cache folder (e.g. "
        "nvidia-smi's temperature.gpu, fincore's resident bytes of the model files)",
    )
    file: str | None = Field(
        None, description="file on the box holding the state; {knob} as in `command`"
    )
    key: str | None = Field(None, description="the JSON field of `file` that holds the number")
    missing: float | None = Field(
        None,
        allow_inf_nan=False,
        description="the reading when `file` does not exist yet (e.g. 0: a cool box); unset, "
        "a missing file is no reading",
    )
    needs: list[str] = Field(
        default_factory=list,
        description="knobs the probe reads: a cell without them is not probed",
    )
    tolerance: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="readings this close are one state: a gap no larger never withholds a "
        "label (a page cache's share moves by a few pages under the box's own memory "
        "pressure); 0: any difference beyond the readings' noise counts",
    )

    def reads(self, knobs: Mapping[str, object]) -> bool:
        """Whether a cell with these knob settings is probed: it sets every knob it needs."""
        return all(knobs.get(name) is not None for name in self.needs)

    @model_validator(mode="after")
    def _one_source(self) -> StateProbe:
        if (self.command is None) == (self.file is None):
            raise ValueError(f"box_state probe {self.name!r}: give one of `command` or `file`")
        return self


class BuildRecipe(Strict):
    """How ``harness bisect`` builds a checkout of this runtime, and boots a build."""

    command: list[str] = Field(
        min_length=1,
        description="argv run once per commit in that commit's exported tree (`{python}`: the "
        "harness's Python); a build that fails is skipped",
    )
    knob: str = Field(description="the knob each arm of a bisect step sets to its build's folder")


class RuntimeProfile(Strict):
    """A runtime the harness can boot: a YAML file under campaigns/runtimes/."""

    name: str = Field(description="profile name")
    description: str = Field("", description="one line for humans")
    platforms: list[Platform] = Field(["any"], description="platforms it runs on")
    boot: Boot = Field(description="how to start it (a command driver's is its argv)")
    ready: ReadyProbe | None = Field(None, description="readiness probe (HTTP runtimes)")
    driver: CommandDriver | None = Field(
        None, description="command driver (a benchmark binary); default: HTTP requests"
    )
    competing: list[str] = Field(
        default_factory=list,
        description="regexes of process command lines that must not run beside a cohort",
    )
    idle: Idle | None = Field(None, description="metrics that say the box serves nobody else")
    logit_dumps: LogitDumps | None = Field(None, description="frontier-logit dumps of a run")
    api: Api = Field(default_factory=lambda: Api())
    telemetry: Telemetry = Field(default_factory=lambda: Telemetry())
    stop: Stop = Field(default_factory=lambda: Stop())
    version: Version = Field(default_factory=lambda: Version())
    knobs: dict[str, KnobSpec] = Field(default_factory=dict, description="named cell knobs")
    knob_pins: list[KnobPin] = Field(
        default_factory=list,
        description="knobs a cell should pin when it sets others (a validation warning if not)",
    )
    files: dict[str, FileRoute] = Field(
        default_factory=dict,
        description="file knobs: name -> 'arg:--flag' or 'env:VAR' receiving the uploaded path",
    )
    cache_files: list[str] = Field(
        default_factory=list,
        description="files (templates, globs allowed) evicted from the page cache for cold runs",
    )
    expected_boot_s: float = Field(
        10.0, ge=0, le=1e6, allow_inf_nan=False, description="typical boot time, for plan estimates"
    )
    expected_tok_s: float = Field(
        100.0,
        ge=1e-3,
        le=1e9,
        allow_inf_nan=False,
        description="typical decode speed, for estimates",
    )
    expected_ttft_s: float = Field(
        0.0,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="typical time to first token (prefill) of a request, for estimates",
    )
    phase_live_knob: str | None = Field(
        None, description="live knob that tags the ring with the workload phase"
    )
    live: LiveContract | None = Field(
        None, description="how a running runtime takes knob changes (cells sharing one boot)"
    )
    box_state: list[StateProbe] = Field(
        default_factory=list,
        description="probes of state the box carries between blocks (harness.stats.box_state)",
    )
    build: BuildRecipe | None = Field(
        None, description="how `harness bisect` builds a commit and boots that build"
    )
    admin_token_env: str | None = Field(
        None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="env var the harness sets to a fresh random token at every boot; every live "
        "knob request (apply, reset, phase tags, live.state) and expert-recorder request then "
        "carries `Authorization: Bearer <token>`, so only the harness that booted the runtime "
        "can change what it runs",
    )

    @model_validator(mode="before")
    @classmethod
    def _boot_from_driver(cls, data: object) -> object:
        # A command driver's boot is its command, so every boot path (knobs, version, preflight)
        # works unchanged; a profile giving both would have two commands.
        if isinstance(data, dict) and isinstance(data.get("driver"), dict):
            driver = data["driver"]
            if "boot" in data:
                raise ValueError("a profile with a command driver takes no `boot`: its argv is")
            data = {
                **data,
                "boot": {
                    "command": driver.get("argv"),
                    "env": driver.get("env", {}),
                    "cwd": driver.get("cwd"),
                },
            }
        return data

    @model_validator(mode="after")
    def _ready_unless_command(self) -> RuntimeProfile:
        if self.driver is None and self.ready is None:
            raise ValueError("an HTTP runtime needs `ready` (a readiness probe)")
        for pattern in self.competing:
            _check_regex(pattern, "competing")
        names = [n for spec in self.telemetry.log_counters for n in spec.counters()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"log counters {', '.join(twice)} are named by two patterns")
        both = sorted(set(names) & set(self.telemetry.unavailable))
        if both:
            raise ValueError(f"counters {', '.join(both)} are both log counters and unavailable")
        for check in self.telemetry.applied:
            file_knob = check.knob.startswith("files.") and check.knob[6:] in self.files
            if check.knob not in self.knobs and not file_knob:
                raise ValueError(
                    f"telemetry.applied names knob {check.knob!r}, not in `knobs` "
                    "(or files.NAME for a file in `files`)"
                )
        for probe in self.box_state:
            unknown = sorted(set(probe.needs) - set(self.knobs))
            if unknown:
                raise ValueError(
                    f"box_state probe {probe.name!r} needs knobs {', '.join(unknown)}, not in "
                    "`knobs`"
                )
            named = set(PROBE_PLACEHOLDER.findall(f"{probe.command or ''} {probe.file or ''}"))
            unknown = sorted(named - set(self.knobs) - set(PROBE_PLACES))
            if unknown:
                raise ValueError(
                    f"box_state probe {probe.name!r} names {', '.join(unknown)}, neither a knob "
                    f"nor a place ({', '.join(PROBE_PLACES)}): fix the name, or add the knob "
                    "(a program's own braces need a space inside: awk '{ print }')"
                )
        counted = set(METRICS) | set(COUNTERS) | set(names)  # names: the log counters
        for knob_name, knob in self.knobs.items():
            unknown = sorted({g.metric for g in knob.engaged} - counted)
            if unknown:
                raise ValueError(
                    f"knobs.{knob_name}.engaged names {', '.join(unknown)}: not a metric, "
                    "counter or log counter of the run table (docs/reference.md#metrics)"
                )
            spelled = [v for g in knob.engaged for v in (g.when or []) + g.unless]
            if bad := [v for v in spelled if knob.check(v) is not None]:
                raise ValueError(
                    f"knobs.{knob_name}.engaged: when/unless value {bad[0]!r} {knob.check(bad[0])}"
                )
        if self.build is not None and self.build.knob not in self.knobs:
            raise ValueError(f"build.knob names {self.build.knob!r}, not in `knobs`")
        routes = self.telemetry.response_routes
        if routes is not None and routes.knob not in self.knobs:
            raise ValueError(
                f"telemetry.response_routes names knob {routes.knob!r}, not in `knobs`"
            )
        recorder = self.telemetry.expert_recorder
        recorder_knobs: tuple[str | None, ...] = (
            (recorder.replicas_knob, recorder.sharding_knob, recorder.full_gpu_prefill_knob)
            if recorder
            else ()
        )
        if recorder is not None and recorder.paged_experts is not None:
            paged = recorder.paged_experts
            recorder_knobs += (paged.switch_knob, paged.slots_knob)
        for name in recorder_knobs:
            if name is not None and name not in self.knobs:
                raise ValueError(f"telemetry.expert_recorder names knob {name!r}, not in `knobs`")
        for pin in self.knob_pins:
            unknown = sorted({pin.knob, *pin.when_set} - set(self.knobs))
            if unknown:
                raise ValueError(f"knob_pins names {', '.join(unknown)}, not in `knobs`")
        if self.live is not None:
            if self.live.apply is None and self.telemetry.live_knobs_http is None:
                raise ValueError("`live` needs `apply` (or telemetry.live_knobs_http)")
            unknown = sorted(set(self.live.files) - set(self.files))
            if unknown:
                raise ValueError(f"live.files names {', '.join(unknown)}, not in `files`")
        return self

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", value):
            raise ValueError("use lower-case letters, digits, '-' and '.'")
        return value

    def probes_reading(self, knobs: Mapping[str, object]) -> list[StateProbe]:
        """The box-state probes that read a cell with these knob settings (the profile's
        defaults filling what the cell leaves unset)."""
        settings: dict[str, object] = {
            n: s.default for n, s in self.knobs.items() if s.default is not None
        }
        settings.update(knobs)
        return [p for p in self.box_state if p.reads(settings)]

    def live_apply(self) -> LiveAction | None:
        """How live knob changes reach the runtime: ``live.apply``, else a POST of the JSON
        settings to ``telemetry.live_knobs_http``; None when the runtime takes none."""
        if self.live is not None and self.live.apply is not None:
            return self.live.apply
        if self.telemetry.live_knobs_http is not None:
            return LiveAction(http=LiveHttp(path=self.telemetry.live_knobs_http))
        return None

    def knob_for_env(self, var: str) -> tuple[str, KnobSpec] | None:
        """The declared knob that sets environment variable ``var``, if any."""
        for name, spec in self.knobs.items():
            if spec.env == var:
                return name, spec
        return None
