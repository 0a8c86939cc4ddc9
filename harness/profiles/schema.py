"""Boxes (where commands run) and runtime profiles (how to boot and talk to a runtime), as data.

Adding a runtime is a YAML file under ``campaigns/runtimes/``, not code. These models are the
schema of those files and of the inline mappings a card may use instead of a name.
"""

from __future__ import annotations

import re
import sys
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.catalog import COUNTERS, METRICS
from harness.formats.textfile import compile_pattern
from harness.profiles.slurm_fields import slurm_fields_problem, slurm_minutes

Platform = Literal["linux-cpu", "linux-cuda", "macos-metal", "any"]


def _check_regex(pattern: str, field: str) -> None:
    """Raise ValueError (pydantic reports it at the field's line) for a bad pattern."""
    try:
        compile_pattern(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise ValueError(f"`{field}` is not a regular expression: {exc}") from None


class Strict(BaseModel):
    """Base of every user-facing model: unknown keys are errors, not silently ignored, and no
    number is NaN or infinite (a bound of `.nan` would let every value pass)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class BoxSpec(Strict):
    """Where commands run: this machine, a host over SSH (fabric), or nodes of a Slurm cluster
    (each cohort one job, submitted from this machine with submitit: harness/execute/slurm/)."""

    kind: Literal["local", "ssh", "slurm"] = Field(
        "local", description="local subprocesses, ssh, or jobs on a slurm cluster"
    )
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="what an inline box of a card's `boxes` list is called (a boxes file's "
        "entries are named by their key)",
    )
    host: str | None = Field(None, description="ssh host name or alias from ~/.ssh/config")
    port: int | None = Field(None, ge=1, le=65535, description="ssh port (default: ssh config/22)")
    user: str | None = Field(None, description="ssh user (default: ssh config/current user)")
    key: str | None = Field(None, description="private key file, ~ expanded")
    gateway: str | None = Field(None, description="ProxyJump host, as user@host:port")
    python: str | None = Field(
        None,
        description="Python interpreter on the box (for the refbox); default: this harness's "
        "own interpreter on a local box, python3 over ssh",
    )
    platform: Platform = Field("linux-cpu", description="what the box is, for cache drops etc.")
    workdir: str = Field(
        "~/.cache/harness/runs", description="directory on the box for run files and uploads"
    )
    insecure_accept_unknown_host_key: bool = Field(
        False, description="accept host keys missing from known_hosts (off: check known_hosts)"
    )
    known_hosts: str | None = Field(
        None,
        description="extra known_hosts file (~ expanded), checked besides ~/.ssh/known_hosts "
        "and the ssh config's UserKnownHostsFile",
    )
    env: dict[str, str] = Field(default_factory=dict, description="env for every command")
    partition: str | None = Field(
        None, description="slurm: the partition its jobs run in (default: the cluster's)"
    )
    gres: str | None = Field(
        None, description="slurm: generic resources per job (--gres), e.g. gpu:1 or gpu:h200:8"
    )
    gpus: int | None = Field(
        None, ge=1, le=1024, description="slurm: GPUs per node (--gpus-per-node), or use `gres`"
    )
    account: str | None = Field(None, description="slurm: the account jobs are charged to")
    time: str | int | None = Field(
        None,
        description="slurm: time limit of one cohort's job: minutes, HH:MM:SS or D-HH:MM:SS "
        "(default: the partition's)",
    )
    constraint: str | None = Field(None, description="slurm: node features (--constraint)")
    setup: list[str] = Field(
        default_factory=list,
        description="slurm: shell lines the job runs before the harness starts on the node "
        "(module load …, source a venv)",
    )
    shared_dir: str | None = Field(
        None,
        description="slurm: a folder this machine and every node see (NFS, Lustre), absolute or "
        "~/: the cohorts' job folders, their logs and the runtimes' files",
    )
    max_parallel: int | None = Field(
        None, ge=1, le=100000, description="slurm: cohort jobs running at once (default: all)"
    )
    drive: Literal["tunnel", "on-box"] | None = Field(
        None,
        description="ssh only: where the workload driver runs: `tunnel` (default: here, its "
        "requests carried to the box's 127.0.0.1 by an SSH tunnel) or `on-box` (on the box "
        "itself, with the box's python and aiohttp; the results are fetched back)",
    )

    @property
    def drives_on_box(self) -> bool:
        """True when the workload driver runs on the box (``drive: on-box``)."""
        return self.drive == "on-box"

    def python_path(self) -> str:
        """The interpreter to run on the box."""
        if self.python:
            return self.python
        # A slurm node shares this machine's file system, venv included, as a rule.
        return "python3" if self.kind == "ssh" else sys.executable

    def time_limit_min(self) -> int | None:
        """A slurm box's time limit per job in whole minutes (None: the partition's)."""
        return None if self.time is None else slurm_minutes(self.time)

    @model_validator(mode="after")
    def _kind_fields(self) -> BoxSpec:
        if self.kind == "ssh" and not self.host:
            raise ValueError("an ssh box needs `host`")
        if self.kind == "local" and self.host:
            raise ValueError("a local box takes no `host`; set kind: ssh")
        problem = slurm_fields_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("drive")
    @classmethod
    def _drive_is_for_ssh(cls, drive: str | None, info: ValidationInfo) -> str | None:
        if drive is not None and info.data.get("kind") in ("local", "slurm"):
            raise ValueError(
                f"a {info.data.get('kind')} box takes no `drive`: its driver already runs beside "
                "its runtime, with no tunnel; remove `drive` (it is for ssh boxes)"
            )
        return drive


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


class KnobSpec(Strict):
    """One knob a cell may set by name: how it reaches the runtime and what values are valid."""

    env: str | None = Field(None, description="environment variable it sets")
    arg: str | None = Field(None, description="command-line flag it sets (value follows)")
    live: str | None = Field(None, description="key in the live-knob endpoint's JSON body")
    choices: list[str] | None = Field(None, description="allowed values")
    pattern: str | None = Field(None, description="regex a value must match in full")
    help: str = Field("", description="what the knob does, for error messages")
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
        if self.pattern is not None and re.fullmatch(self.pattern, value):
            return None
        if self.choices is None and self.pattern is None:
            return None
        allowed = ", ".join(self.choices or [])
        if self.pattern is not None:
            extra = self.help or f"a value matching {self.pattern}"
            allowed = f"{allowed}, or {extra}" if allowed else extra
        return f"must be one of {allowed}" if self.choices else f"must be {allowed}"


class RingSpec(Strict):
    """Where the runtime's telemetry ring lives and how to read it."""

    path: str = Field(description="path template, e.g. {run_dir}/ring.bin")
    header: bool = Field(True, description="self-describing ring (false: declare `fields`)")
    fields: list[str] | None = Field(None, description="int64 field names of a header-less ring")

    @model_validator(mode="after")
    def _fields_when_headerless(self) -> RingSpec:
        if not self.header and not self.fields:
            raise ValueError("a header-less ring needs `fields`")
        return self


# Units a log counter may be written in, and the factor to the counter's stored unit: sizes are
# stored in bytes, times in ms, everything else as written.
LOG_UNITS: dict[str, float] = {
    "count": 1.0,
    "tokens": 1.0,
    "ratio": 1.0,
    "bytes": 1.0,
    "KiB": 1024.0,
    "MiB": 1024.0**2,
    "GiB": 1024.0**3,
    "us": 1e-3,
    "ms": 1.0,
    "s": 1e3,
}
LogUnit = Literal["count", "tokens", "ratio", "bytes", "KiB", "MiB", "GiB", "us", "ms", "s"]


class LogCounter(Strict):
    """Counters scraped from the runtime's log: one regex, each named group one counter.

    ``last``: the line prints counts cumulative for the process (ds4's streaming cache line), so
    a snapshot is the last matching line so far. ``sum``: each line counts one event (a request's
    timings), so a snapshot is the sum over every matching line so far. Either way a run's value
    is the after − before delta; a counter no line gave is missing, never 0.
    """

    pattern: str = Field(description="regex searched per log line; named groups are counters")
    mode: Literal["last", "sum"] = Field("last", description="cumulative line, or one per event")
    at: Literal["live", "exit"] = Field(
        "live",
        description="live: the line is printed while the runtime runs (before/after the scored "
        "workload); exit: only when the process ends (ds4 prints its cache line at cleanup), so "
        "the count starts at 0 with the boot, warm-up included, and is read after the graceful "
        "stop",
    )
    units: dict[str, LogUnit] = Field(
        default_factory=dict,
        description="group -> unit as printed (KiB/MiB/GiB stored as bytes, s/us as ms)",
    )

    @model_validator(mode="after")
    def _named_groups(self) -> LogCounter:
        _check_regex(self.pattern, "pattern")
        groups = set(compile_pattern(self.pattern).groupindex)
        if not groups:
            raise ValueError("a log counter pattern needs named groups, e.g. (?P<hits>\\d+)")
        unknown = sorted(set(self.units) - groups)
        if unknown:
            raise ValueError(f"`units` names {', '.join(unknown)}, not groups of the pattern")
        return self

    def counters(self) -> list[str]:
        """The counter names this pattern yields."""
        return list(compile_pattern(self.pattern).groupindex)


class CountDumpSpec(Strict):
    """A route-count dump file the runtime rewrites (the CUDA lane's ``MEGA_COUNT``, the vLLM
    plugin's ``HARNESS_VLLM_ROUTES``): read before and after each run as counters."""

    path: str = Field(description="path template of the dump, e.g. {run_dir}/route-counts.json")
    every_s: float = Field(
        20.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="how often the runtime rewrites it; each read waits 1.5x this first, so "
        "the dump holds every step that ran",
    )


class AppliedCheck(Strict):
    """A log line where the runtime says what it applied for a knob: a run whose line disagrees
    with the knob (a build that ignores the knob) fails instead of measuring the wrong arm."""

    knob: str = Field(
        description="the knob whose value the line reports, or files.NAME: the path of an "
        "uploaded file (a file knob)"
    )
    pattern: str = Field(description="regex searched per log line, with a group (?P<applied>…)")
    expect: dict[str, str] = Field(
        description="knob value -> the applied text the line must show; key '*' for any other "
        "value, with {value} standing for it (e.g. '*': 'fixed:{value}')"
    )
    unset: str | None = Field(
        None, description="applied text expected when the cell leaves the knob unset"
    )
    required: bool = Field(
        True, description="the line must be printed: its absence fails the run (say why)"
    )

    @model_validator(mode="after")
    def _applied_group(self) -> AppliedCheck:
        _check_regex(self.pattern, "pattern")
        if "applied" not in compile_pattern(self.pattern).groupindex:
            raise ValueError("an applied check's pattern needs a group (?P<applied>...)")
        return self

    def expected(self, value: str | None) -> str | None:
        """The applied text a run with this knob value must print (None: not checked)."""
        if value is None:
            return self.unset
        if value in self.expect:
            return self.expect[value]
        template = self.expect.get("*")
        return template.replace("{value}", value) if template is not None else None


class Telemetry(Strict):
    """What the executor collects from a run besides the client-side timings."""

    log_counters: list[LogCounter] = Field(
        default_factory=list, description="counters scraped from the runtime's log"
    )
    unavailable: dict[str, str] = Field(
        default_factory=dict,
        description="counter -> why this build cannot produce it (a gate on it fails validation)",
    )
    applied: list[AppliedCheck] = Field(
        default_factory=list, description="log lines that must agree with a knob's value"
    )

    ring: RingSpec | None = Field(None, description="telemetry ring, if the runtime writes one")
    counters_http: str | None = Field(None, description="GET path returning counters as JSON")
    metrics_http: str | None = Field(None, description="GET path of Prometheus text metrics")
    dump_http: str | None = Field(None, description="POST path returning a route-count dump")
    live_knobs_http: str | None = Field(None, description="POST path taking live knobs as JSON")
    route_trace: str | None = Field(None, description="routing trace path template")
    count_dump: CountDumpSpec | None = Field(
        None, description="route-count dump file read as counters (route_selections) per run"
    )


class LiveHttp(Strict):
    """A knob change sent as one HTTP request to the running runtime."""

    method: Literal["POST", "PUT", "PATCH"] = Field("POST", description="HTTP method")
    path: str = Field(description="path on the runtime's port, e.g. /admin/knobs")
    body: str = Field(
        "{knobs}",
        description="body template: {knobs} is the settings as a JSON object, {seq} the "
        "change's number; any 2xx answer means applied",
    )


class LiveFile(Strict):
    """A knob change written to a control file the runtime polls, acknowledged in its log."""

    path: str = Field(description="control file template, e.g. {run_dir}/control.json")
    body: str = Field(
        '{"seq": {seq}, "knobs": {knobs}}',
        description="file template: {knobs} is the settings as a JSON object, {seq} the "
        "change's number (it grows with every change of one boot)",
    )
    ack_log_line: str = Field(
        description="regex ({seq} filled in) the runtime logs once the change took effect"
    )
    reject_log_line: str | None = Field(
        None,
        description="regex ({seq} filled in) the runtime logs when it refuses the change; its "
        "first group is the reason",
    )
    timeout_s: float = Field(
        10, gt=0, le=1e5, allow_inf_nan=False, description="no acknowledgement by then: failed"
    )
    interval_s: float = Field(
        0.05, gt=0, le=60, allow_inf_nan=False, description="how often the log is read"
    )

    @model_validator(mode="after")
    def _patterns(self) -> LiveFile:
        _check_regex(self.ack_log_line.replace("{seq}", "0"), "ack_log_line")
        if self.reject_log_line is not None:
            _check_regex(self.reject_log_line.replace("{seq}", "0"), "reject_log_line")
        return self


class LiveAction(Strict):
    """One way to reach a running runtime: an HTTP request or a control file."""

    http: LiveHttp | None = Field(None, description="send it as an HTTP request")
    file: LiveFile | None = Field(None, description="write it to a control file the runtime polls")

    @model_validator(mode="after")
    def _exactly_one(self) -> LiveAction:
        if (self.http is None) == (self.file is None):
            raise ValueError("give exactly one of `http` or `file`")
        return self


class LiveContract(Strict):
    """How a running runtime takes knob changes, so cells can share one boot (`design.boot`).

    Knobs with a `live` key, and the file knobs named in `files`, may differ between cells of
    one boot; every other knob, env and arg must be the same.
    """

    apply: LiveAction | None = Field(
        None,
        description="how knob changes reach the runtime (default: POST telemetry.live_knobs_http)",
    )
    reset: LiveAction | None = Field(
        None,
        description="back to the boot state (map reloaded, counters and adaptive state cleared), "
        "sent before each run after the first on a shared boot; the settings ride along",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="file knobs that may change live: name -> key its uploaded path is sent as",
    )
    washout_requests: int = Field(
        0, ge=0, le=100000, description="requests sent and discarded after each change"
    )
    washout_s: float = Field(
        0, ge=0, le=1e5, allow_inf_nan=False, description="seconds waited after each change"
    )


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
    binary: str | None = Field(None, description="file whose SHA-256 is recorded")


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
