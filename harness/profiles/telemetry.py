"""What a runtime reports and where: its ring, log counters, count dumps and applied-knob lines."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from harness.formats.textfile import compile_pattern
from harness.profiles.base import Strict, _check_regex


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
    timings), so a snapshot is the sum over every matching line so far. ``count``: each matching
    line is one event that prints no number (vLLM's "Rearranging experts …"): a snapshot counts
    the lines where the group matched. Either way a run's value is the after − before delta; a
    ``last`` counter no line gave is missing, never 0.
    """

    pattern: str = Field(description="regex searched per log line; named groups are counters")
    mode: Literal["last", "sum", "count"] = Field(
        "last",
        description="last: a cumulative line; sum: one per event, its numbers added; count: one "
        "per event, the lines counted",
    )
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


class ResponseRoutesSpec(Strict):
    """Routing a runtime returns in its whole (non-streamed) responses: vLLM's and SGLang's
    ``--enable-return-routed-experts``. ``harness collect --routes-from-responses`` turns the knob
    on, sends the split without streaming and keeps each response's routing as a trace."""

    knob: str = Field(description="the switch knob that turns the routing on (set to true)")
    field: str = Field(
        "choices.0.routed_experts",
        description="where in the response JSON the routing is, dotted (list indexes as numbers)",
    )
    encoding: Literal["npy-base64", "int32-base64"] = Field(
        "npy-base64",
        description="npy-base64: base64 of .npy bytes, [prompt + completion tokens - 1, layers, "
        "top_k] (vLLM's); int32-base64: base64 of the same rows as flat little-endian int32, "
        "reshaped by `harness collect --top-k` (SGLang's)",
    )
    request_fields: dict[str, bool | int | str] = Field(
        default_factory=dict,
        description="fields every request body carries to ask for the routing (SGLang's "
        "return_routed_experts: true)",
    )


class PagedExpertsReplaySpec(Strict):
    """The knobs that turn on SGLang's Paged Experts and size its slots: with the switch on,
    each run's recorded passes are replayed through its residency policy
    (harness/policy/paged_experts.py) for a hit rate labelled replayed, since the runtime counts
    none."""

    switch_knob: str = Field(description="switch knob that turns Paged Experts on")
    slots_knob: str = Field(description="knob holding the experts per layer kept on the GPU")


class ExpertRecorderSpec(Strict):
    """SGLang's expert-distribution recorder, driven around each run's scored workload: start
    before it, stop and dump after; the dump's files (``.pt``, read without torch) become the
    run's route counts, ``route_selections`` and, with KTransformers' GPU masks, ``hits`` and
    ``misses``. The runtime needs ``--expert-distribution-recorder-mode`` (``stat``)."""

    dir: str = Field(
        description="folder template where the runtime writes its dumps (the profile sets "
        "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR to it), e.g. {run_dir}/expert-distribution"
    )
    start_http: str = Field(
        "/start_expert_distribution_record", description="POST path that starts a record"
    )
    stop_http: str = Field(
        "/stop_expert_distribution_record", description="POST path that stops it"
    )
    dump_http: str = Field(
        "/dump_expert_distribution_record", description="POST path that writes the dump files"
    )
    glob: list[str] = Field(
        ["expert_distribution_recorder_*.pt", "gpu_expert_distribution_*.pt"],
        description="dump file names: SGLang's counts, and the GPU masks KTransformers' build "
        "writes beside them (a string for one pattern)",
    )

    @field_validator("glob", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    timeout_s: float = Field(
        120, gt=0, le=1e5, allow_inf_nan=False, description="wait this long for a dump's files"
    )
    replicas_knob: str | None = Field(
        None,
        description="knob saying how many ranks record every token (SGLang's tp_size: without "
        "an all-to-all backend every rank routes the whole batch, and the stat dump sums the "
        "ranks), so the dumped counts are divided by its value",
    )
    sharding_knob: str | None = Field(
        None,
        description="knob whose setting other than `none` makes each rank route only its own "
        "tokens (SGLang's moe_a2a_backend): the counts are then not divided",
    )
    full_gpu_prefill_knob: str | None = Field(
        None,
        description="knob holding the token count from which a forward pass runs wholly on the "
        "GPU (KTransformers' kt_gpu_prefill_token_threshold: its whole layer loaded, though the "
        "masks record the partial placement); such passes are left out of hits and misses and "
        "counted apart as full_gpu_selections",
    )
    paged_experts: PagedExpertsReplaySpec | None = Field(
        None,
        description="SGLang's Paged Experts knobs: a run with it on gets replayed_hits, "
        "replayed_misses and replayed_hit_rate from its recorded passes (replayed, not measured)",
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
        description="counter or metric -> why this build cannot produce it (a gate on it "
        "fails validation)",
    )
    applied: list[AppliedCheck] = Field(
        default_factory=list, description="log lines that must agree with a knob's value"
    )
    identity_lines: list[str] = Field(
        default_factory=list,
        description="regexes of log lines that say how the runtime placed or sized itself "
        "(llama.cpp's --fit plan): the matching lines are kept in the run's runtime identity",
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
    expert_recorder: ExpertRecorderSpec | None = Field(
        None,
        description="SGLang's expert-distribution recorder, started and dumped around each run",
    )
    response_routes: ResponseRoutesSpec | None = Field(
        None, description="routing returned in whole responses (for harness collect)"
    )

    @model_validator(mode="after")
    def _route_source_and_identity_lines(self) -> Telemetry:
        if self.count_dump is not None and self.expert_recorder is not None:
            raise ValueError(
                "give `count_dump` or `expert_recorder`, not both: each writes the run's "
                "route-counts.json"
            )
        for pattern in self.identity_lines:
            _check_regex(pattern, "identity_lines")
        return self
