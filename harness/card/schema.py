"""The schema of a campaign card: the pydantic models a card's YAML must fit.

This is the shape-and-type pass (``extra="forbid"``); what needs the card as a whole or the disk
is checked in :mod:`harness.card.checks`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from harness.formats.textfile import compile_pattern
from harness.profiles.base import Strict
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile

KnobValue = str | int | float | bool
CacheState = Literal["warm", "cold"]
_FRACTION = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
# A name that becomes a file name: no separator, no `..`, nothing a file system refuses.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def parse_fraction(value: str | int) -> tuple[int, int | None]:
    """``"49/50"`` -> (49, 50); an int k -> (k, None) meaning "at least k"."""
    if isinstance(value, int):
        return value, None
    match = _FRACTION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not k/n")
    return int(match.group(1)), int(match.group(2))


def _check_fraction(value: str | int) -> str | int:
    k, n = parse_fraction(value)
    if n is not None and (k > n or n == 0):
        raise ValueError(f"{value!r}: k must be at most n and n positive")
    if k < 0:
        raise ValueError("k must not be negative")
    return value


def _refuse_vacuous(value: str | int, what: str) -> None:
    """0 of n passes whatever the runs did: a gate that cannot fail is not a gate."""
    if value != "all" and parse_fraction(value)[0] == 0:
        raise ValueError(f"{value!r}: k is 0, so {what}; give k >= 1")


class Split(Strict):
    """Which prompts of the pools form a set: those whose ``split`` field equals this."""

    split: str = Field(description="value of the prompts' `split` field")


class PromptsSpec(Strict):
    """Prompt pools and how they divide into fitting and scoring sets."""

    pools: list[str] = Field(min_length=1, description="JSONL pools, paths relative to the card")
    fit: Split | None = Field(None, description="prompts a map or hotlist may be fitted on")
    # A factory, not an instance: an instance would build Split's validator at import, before
    # build_card_schema can order the builds. The schema still shows editors the default.
    heldout: Split = Field(
        default_factory=lambda: Split(split="heldout"),
        description="prompts that are scored",
        json_schema_extra={"default": {"split": "heldout"}},
    )
    quality: str | None = Field(None, description="JSONL quality suite with `check` per prompt")


# Upper bounds on counts and durations (le=...) are far past any campaign; they keep a typo or a
# damaged number (1e999, 10**400) from reaching plan estimates and timeouts as inf or overflow.


class Phase(Strict):
    """A stretch of the workload on some domains; ``shift: true`` marks a domain shift."""

    name: str = Field(description="phase name, also the ring's phase tag")
    domains: list[str] = Field(min_length=1, description="domains whose held-out prompts it uses")
    duration_s: float | None = Field(
        None, gt=0, le=1e7, allow_inf_nan=False, description="run the phase this long"
    )
    requests: int | None = Field(None, ge=1, le=10**7, description="or send this many requests")
    shift: bool = Field(False, description="a domain shift starts this phase (T90 is measured)")
    until_recovered: int | None = Field(
        None,
        ge=1,
        le=10**7,
        description="after its requests, keep sending its prompts (not scored) until the "
        "runtime's cold share has recovered and held, read from its ring while the phase runs, "
        "at most this many more requests: T90 is then measurable whatever the runtime's speed "
        "or --scale (a shift phase of requests; needs the ring)",
    )
    prompt_tokens: int | None = Field(
        None,
        ge=1,
        le=10**7,
        description="build each prompt to this many tokens from its domain's text",
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Phase:
        if self.duration_s is not None and self.requests is not None:
            raise ValueError("give `duration_s` or `requests`, not both")
        if self.until_recovered is not None and (not self.shift or self.duration_s is not None):
            raise ValueError(
                "until_recovered extends a shift phase of requests: set shift: true, and "
                "requests (or none: its domains' held-out prompts) instead of duration_s"
            )
        return self


class Workload(Strict):
    """What the driver sends in each run."""

    max_tokens: int = Field(64, ge=1, le=10**7, description="tokens generated per request")
    concurrency: int = Field(1, ge=1, le=64, description="concurrent requests (C1…C64)")
    warmup_requests: int = Field(
        1,
        ge=0,
        le=10**6,
        description="requests sent first and not scored, of the first phase's domains (so a "
        "run starts steady on them and each shift is from what ran before)",
    )
    passes: int = Field(
        1, ge=1, le=10**4, description="passes over the held-out prompts when no phases"
    )
    request_timeout_s: float = Field(
        300, gt=0, le=1e7, allow_inf_nan=False, description="per-request timeout"
    )
    temperature: float = Field(
        0.0, ge=0, le=100, allow_inf_nan=False, description="0 = greedy, so outputs can be compared"
    )
    logprobs: int = Field(
        0,
        ge=0,
        le=20,
        description="top log-probabilities asked for per generated token (OpenAI `logprobs`; "
        "0: none); the `kl` equivalence metric reads them",
    )
    phases: list[Phase] | None = Field(None, description="default: one pass over held-out prompts")

    @field_validator("phases")
    @classmethod
    def _unique_names(cls, phases: list[Phase] | None) -> list[Phase] | None:
        if phases is not None:
            names = [p.name for p in phases]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"phase names must be unique: {dupes}")
        return phases


class Equivalence(Strict):
    """A lossy cell's second endpoint: its greedy outputs on the held-out prompts agree with the
    control's within a non-inferiority margin (docs/design.md#equivalence)."""

    metric: Literal["prefix_agreement", "token_agreement", "kl"] = Field(
        "prefix_agreement",
        description="per prompt: the share of the control's output reproduced before the first "
        "differing character (prefix_agreement), or at the same positions (token_agreement); "
        "or the mean per-token KL divergence from the control's next-token distribution, in "
        "nats, over the tokens both generate alike (kl: needs workload.logprobs)",
    )
    margin: float = Field(
        gt=0,
        le=10,
        allow_inf_nan=False,
        description="how far the mean agreement may fall below the control's own (1): it "
        "passes when the 95% interval's lower bound is at least 1 - margin (below 1); for kl, "
        "the most mean KL allowed: it passes when the interval's upper bound is at most margin",
    )

    @model_validator(mode="after")
    def _agreement_below_one(self) -> Equivalence:
        if self.metric != "kl" and self.margin >= 1:
            raise ValueError(
                f"margin {self.margin:g} of an agreement (a share, at most 1) excludes nothing: "
                "give one below 1"
            )
        return self


class Cell(Strict):
    """One arm: knob settings applied to the runtime at boot (or live)."""

    description: str = Field("", description="what this cell changes")
    knobs: dict[str, KnobValue] = Field(default_factory=dict, description="named profile knobs")
    env: dict[str, KnobValue] = Field(default_factory=dict, description="raw environment")
    args: list[str] = Field(default_factory=list, description="extra command-line arguments")
    files: dict[str, str] = Field(default_factory=dict, description="knob files to upload")
    live: dict[str, KnobValue] = Field(default_factory=dict, description="live knobs after boot")
    lossy: bool | Equivalence = Field(
        False,
        description="the change may alter outputs: true (its canaries are not compared), or "
        "`{margin, metric}` (not compared, and a better also needs the equivalence endpoint)",
    )

    @field_validator("env")
    @classmethod
    def _environment(cls, env: dict[str, KnobValue]) -> dict[str, KnobValue]:
        # What execve(2) cannot pass: caught here, not as a failed boot (or a traceback) later.
        for name, value in env.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(
                    f"environment name {name!r:.60}: must be non-empty, without `=` or a NUL byte"
                )
            if "\0" in str(value):
                raise ValueError(f"{name}: a value with a NUL byte cannot be passed to a process")
        return env

    @field_validator("args")
    @classmethod
    def _arguments(cls, args: list[str]) -> list[str]:
        for index, arg in enumerate(args):
            if "\0" in arg:
                raise ValueError(f"args[{index}]: an argument with a NUL byte cannot be passed")
        return args


BootDesign = Literal["per-block", "per-cycle", "per-campaign"]


class Design(Strict):
    """The run order: mirrored cycles so drift cancels, repeats and cache states inside them."""

    order: Literal["abba", "ladder", "sequential"] = Field("abba", description="run order")
    cycles: int = Field(2, ge=1, le=1000, description="mirrored cycles (ABBA, BAAB, …)")
    repeats: int = Field(
        1, ge=1, le=100, description="runs per block (one arm's back-to-back runs)"
    )
    cache_states: list[CacheState] = Field(["warm"], min_length=1, description="warm and/or cold")
    seed: int = Field(0, ge=0, description="seed for prompt order and synthetic prompts")
    retries: int = Field(1, ge=0, le=100, description="retries of a failed run before giving up")
    sequential: bool = Field(
        False, description="look after `cycles`, then every `look_every`; stop once decided"
    )
    max_cycles: int | None = Field(
        None, ge=1, le=1000, description="a sequential design's last look (its full size)"
    )
    look_every: int = Field(1, ge=1, le=1000, description="cycles added between sequential looks")
    washout: float = Field(
        1.0,
        ge=0,
        le=4,
        allow_inf_nan=False,
        description="before every warm block is measured, requests of its own cell sent and "
        "not scored, as a share of a block's scored requests (1: a whole block, the paired "
        "AABB/BBAA design; at least one request): each scored block then follows its own arm, "
        "and state of the box that its own traffic clears within the washout cannot reach it; "
        "state that outlives it (a box that heats for blocks, a page cache) still can, "
        "whatever is declared (`harness bench sequential` prints, per design, which half-lives "
        "of such state its labels hold against); 0.25 (a quarter block) costs less wall time "
        "and clears only state a quarter block of own traffic clears; 0 sends none and leaves "
        "carry-over to the crossover model, which costs power and fails closed below 3 cycles",
    )
    washed_by: Literal["washout", "boot"] = Field(
        "washout",
        description="what clears a block of the one before it: the washout (its traffic; a "
        "label stands on D̄ only after a whole block of it) or boot (each block boots its own "
        "runtime, which starts with nothing of the last, and what the box keeps across boots "
        "is read by the runtime profile's box_state probes, every one of which must read and "
        "settle; needs boot: per-block). A block whose probes did not all read is decided as "
        "unwashed; state no probe reads is assumed, and the report says which were read",
    )
    boot: BootDesign = Field(
        "per-block",
        description="which runs share one boot: per-block (each run boots its own runtime), "
        "per-cycle (the blocks of one mirrored cycle on one boot, switched by live knobs) or "
        "per-campaign (every run of a box on one boot); sharing needs the runtime's `live` "
        "contract and cells that differ only in live knobs",
    )

    @model_validator(mode="after")
    def _sequential_needs_its_size(self) -> Design:
        if self.boot != "per-block" and "cold" in self.cache_states:
            raise ValueError(
                f"boot: {self.boot} shares a warm runtime, and a cold run needs a fresh boot "
                "after its files leave the page cache; use boot: per-block or drop cold"
            )
        if self.washed_by == "boot" and self.boot != "per-block":
            raise ValueError(
                f"washed_by: boot needs every block on a boot of its own, and boot: {self.boot} "
                "shares one; use boot: per-block or washed_by: washout"
            )
        if self.sequential:
            if self.order == "sequential":
                raise ValueError("sequential looks need mirrored cycles: order abba or ladder")
            if self.max_cycles is None:
                raise ValueError("sequential: true needs max_cycles (its last look)")
            if self.max_cycles < self.cycles:
                raise ValueError(
                    f"max_cycles {self.max_cycles} is below cycles {self.cycles}: the first look "
                    "cannot come after the last"
                )
        elif self.max_cycles is not None:
            raise ValueError("max_cycles applies to a sequential design: add sequential: true")
        return self

    @field_validator("cache_states")
    @classmethod
    def _unique_states(cls, states: list[CacheState]) -> list[CacheState]:
        if len(set(states)) != len(states):
            raise ValueError("cache states must not repeat")
        return states


class AnalysisSpec(Strict):
    """Analysis parameters (docs/design.md#metrics, #statistics)."""

    # At least 10 ms: analysis holds one bin per window of a run (1e-300 s asked for GiBs).
    window_s: float = Field(
        2.0, ge=0.01, le=1e7, allow_inf_nan=False, description="cold-share window (>= 0.01 s)"
    )
    margin_pct: float = Field(
        2.0, gt=0, le=1e4, allow_inf_nan=False, description="δ: smallest effect worth calling"
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="significance level")
    converged_span_s: float = Field(
        10.0, ge=0.01, le=1e7, allow_inf_nan=False, description="span whose median is converged"
    )
    hold_s: float = Field(
        4.0, ge=0, le=1e7, allow_inf_nan=False, description="how long a recovery must hold"
    )
    # The step clock (analyze/recovery.StepClock): recovery counted in host steps, so a busy
    # box's slower steps neither stretch nor blur it; churn is read over the same converged span.
    window_steps: int | None = Field(
        None,
        ge=1,
        le=10**9,
        description=(
            "time recovery on the step clock: cold-share windows of this many host steps "
            "(T90 in steps, wall seconds beside); unset: window_s seconds"
        ),
    )
    converged_span_steps: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="step clock: the span whose median is converged (default 4 windows)",
    )
    hold_steps: int | None = Field(
        None,
        ge=0,
        le=10**12,
        description="step clock: how many steps a recovery must hold (default 2 windows)",
    )

    boxes: Literal["fixed", "random"] = Field(
        "fixed",
        description=(
            "a fleet's verdict: about these boxes (fixed: the interval between cycles; a box x "
            "cell interaction fails better gates) or boxes like these (random: between boxes)"
        ),
    )

    @model_validator(mode="after")
    def _step_clock(self) -> AnalysisSpec:
        step_only = self.converged_span_steps is not None or self.hold_steps is not None
        if self.window_steps is None and step_only:
            raise ValueError(
                "converged_span_steps and hold_steps are the step clock's: set window_steps "
                "too, or use converged_span_s and hold_s"
            )
        return self


class _CellGate(Strict):
    cells: list[str] | None = Field(None, description="cells it applies to (default: all)")


class ExactOutputsGate(_CellGate):
    """Greedy outputs of each cell equal the control's on k of n held-out prompts."""

    kind: Literal["exact_outputs"]
    vs: str | None = Field(None, description="reference cell (default: the control)")
    min_match: str | int = Field("all", description="k/n, k, or 'all'")
    allow: list[str] = Field(default_factory=list, description="known-flaky prompt ids")

    @field_validator("min_match")
    @classmethod
    def _fraction(cls, value: str | int) -> str | int:
        if value == "all":
            return value
        _check_fraction(value)
        _refuse_vacuous(value, "the gate could never fail")
        return value


class CounterGate(_CellGate):
    """A counter delta per run stays within bounds (e.g. new swap-out pages == 0)."""

    kind: Literal["counter"]
    counter: str = Field(description="counter name")
    max: float | None = Field(None, description="upper bound (inclusive)")
    min: float | None = Field(None, description="lower bound (inclusive)")

    @model_validator(mode="after")
    def _bound(self) -> CounterGate:
        if self.max is None and self.min is None:
            raise ValueError("a counter gate needs `max` and/or `min`")
        return self


class BetterGate(_CellGate):
    """The cell is *better* than the reference on a metric, in the statistical sense."""

    kind: Literal["better"]
    metric: str = Field(description="metric name")
    vs: str | None = Field(None, description="reference cell (default: the control)")


class SurvivesGate(_CellGate):
    """The `better` results hold in every listed cache state, never averaged across them."""

    kind: Literal["survives"]
    cache_states: list[CacheState] = Field(min_length=1, description="states that must all pass")
    metrics: list[str] | None = Field(None, description="default: the metrics of better gates")


class QualityGate(_CellGate):
    """k of n quality-suite prompts pass their `check`."""

    kind: Literal["quality"]
    min_pass: str | int = Field(description="k/n or k")
    vs: str | None = Field(
        None, description="also pass at least as many prompts as this cell (no regression)"
    )

    @field_validator("min_pass")
    @classmethod
    def _fraction(cls, value: str | int) -> str | int:
        return _check_fraction(value)

    @model_validator(mode="after")
    def _not_vacuous(self) -> QualityGate:
        if self.vs is None:  # with `vs` the gate still fails a cell that passes fewer
            _refuse_vacuous(self.min_pass, "without `vs` the gate could never fail")
        return self


class SoakGate(_CellGate):
    """A soak reached its duration with no crash, no lost ring record and a bounded tail."""

    kind: Literal["soak"]
    min_duration_s: float = Field(
        gt=0, le=1e9, allow_inf_nan=False, description="duration the soak must reach"
    )
    itl_p99_ms_max: float | None = Field(None, gt=0, description="inter-token p99 bound")
    rss_growth_pct_max: float | None = Field(None, ge=0, description="memory growth bound")
    max_lost_records: int = Field(0, ge=0, description="ring records allowed to be lost")


class LockstepGate(_CellGate):
    """The simulator replays recorded routing with zero divergent decisions."""

    kind: Literal["lockstep"]
    max_divergent: int = Field(0, ge=0, description="divergent decisions allowed")


# A release's name (harness.history.releases): what tags and versions look like (v1.2,
# 2026.12-rc1, 1.2.0+build7); it is part of a file name, so no separators.
RELEASE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$"


class RegressionGate(_CellGate):
    """Not worse, by the margin, than the last N promoted campaigns of this card on this box,
    or (`against: release`) than a release marked in the results store."""

    kind: Literal["regression"]
    metric: str = Field(description="metric name")
    last: int = Field(3, ge=1, le=1000, description="promoted campaigns to compare with")
    against: Literal["previous", "release"] = Field(
        "previous",
        description="previous: the last `last` promoted campaigns; release: a release marked "
        "with `harness history release DIR`, so small steps cannot add up past the margin",
    )
    release: str | None = Field(
        None,
        pattern=RELEASE_NAME,
        description="the release to compare with (against: release; default: the one of this "
        "card on this box marked last)",
    )


Gate = Annotated[
    ExactOutputsGate
    | CounterGate
    | BetterGate
    | SurvivesGate
    | QualityGate
    | SoakGate
    | LockstepGate
    | RegressionGate,
    Field(discriminator="kind"),
]


class Guards(Strict):
    """The runner's rules (seed 004's runner and CONTRIBUTING): what a cohort must not run beside.

    A cohort is one comparison's mirrored blocks (one cycle of a cell against the control in one
    cache state). Before its first run: the box on AC power, no competing process, enough free
    memory. During each run (sampled every ``sample_s``): no new swap-out, wired memory under a
    bound, the run under a time limit. Any failure, and a runtime binary that changed within the
    cohort, invalidates the whole cohort: its runs are not run further or retried, it is
    reported invalid, and ``harness gate`` fails closed. Default: on, except for the reference
    runtime (a test double on a shared machine).
    """

    enabled: bool | None = Field(None, description="on/off; default: on unless runtime is refbox")
    ac_power: bool = Field(True, description="refuse a cohort on battery")
    competing: bool = Field(True, description="refuse a cohort beside a competing process")
    competing_extra: list[str] = Field(
        default_factory=list, description="regexes of command lines, besides the profile's"
    )
    min_free_memory_pct: float | None = Field(
        20, ge=0, le=100, allow_inf_nan=False, description="refuse a cohort under this % free"
    )
    min_free_memory_bytes: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="refuse a cohort under this many bytes free"
    )
    swapout: bool = Field(True, description="abort a run on any new swap-out")
    max_wired_bytes: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="abort a run past this wired memory"
    )
    max_run_s: float | None = Field(
        None, gt=0, le=1e6, allow_inf_nan=False, description="abort a run past this long"
    )
    sample_s: float = Field(1.0, gt=0, le=60, allow_inf_nan=False, description="sample interval")

    @field_validator("competing_extra")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                compile_pattern(pattern)
            except (re.error, OverflowError, RecursionError) as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return patterns


class ConfirmSpec(Strict):
    """A *worse* (or a failed `better`, `survives` or `regression`) on this campaign's box
    stands as "unconfirmed" until a second campaign of the card on ``box`` shows it too:
    one box's false alarms add up over hundreds of gates (docs/design.md#gates)."""

    box: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        description="the second, independent box that must confirm a failure (a box name)",
    )


# The gates a second box can confirm: those that fail on a comparison's label, which one
# box's noise can flip. Outputs, counters, quality and soaks fail on what ran, not on chance.
CONFIRMABLE_KINDS = ("better", "survives", "regression")


GATE_KINDS = (
    "exact_outputs", "counter", "better", "survives", "quality", "soak", "lockstep", "regression",
)  # fmt: skip


class Canaries(Strict):
    """Fixed greedy prompts sent before the warm-up of every warm boot (none without warm-up),
    whose outputs (and log-probabilities, where the workload asks for them) must equal the
    control's unless the cell is declared lossy (docs/design.md#canaries-and-equivalence)."""

    prompts: int = Field(3, ge=0, le=8, description="how many of the fixed prompts (0: none)")
    max_tokens: int = Field(16, ge=1, le=256, description="tokens generated per canary")
    logprob_tolerance: float = Field(
        0.05,
        ge=0,
        le=10,
        allow_inf_nan=False,
        description="where the workload asks for `logprobs`, how far (nats) a token's "
        "log-probability may move from the control's before the boot is corrupt: a change of "
        "the weights that keeps the argmax shows here; 0: exactly equal",
    )


class Card(Strict):
    """A campaign: cells of knob settings, a control, an order, prompts, phases and gates."""

    campaign: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", description="name, [a-z0-9-]+")
    description: str = Field("", description="one line for the report")
    box: str | BoxSpec = Field("local", description="box name or inline box")
    boxes: list[str | BoxSpec] | None = Field(
        None,
        min_length=1,
        description="a fleet: boxes that run the campaign's cohorts in parallel, each a box name "
        "or an inline box with a `name` (instead of `box`)",
    )
    runtime: str | RuntimeProfile = Field("refbox", description="profile name or inline profile")
    prompts: PromptsSpec = Field(
        description="the prompt pools, and which split is fit, which held out"
    )
    workload: Workload = Field(
        default_factory=lambda: Workload(), description="what each run sends: warm-up and phases"
    )
    cells: dict[str, Cell] = Field(min_length=1, description="arms by name")
    control: str | None = Field(None, description="the control cell")
    design: Design = Field(
        default_factory=lambda: Design(),
        description="the order of runs: cycles, pattern, cache states, sequential looks",
    )
    analysis: AnalysisSpec = Field(
        default_factory=lambda: AnalysisSpec(),
        description="how runs become verdicts: the noise band, recovery and drift settings",
    )
    gates: list[Gate] = Field(default_factory=list, description="promotion gates")
    canaries: Canaries = Field(
        default_factory=lambda: Canaries(),
        description="fixed greedy prompts every warm boot answers first, compared with the "
        "control's: a boot whose outputs differ is corrupt",
    )
    confirm: ConfirmSpec | None = Field(
        None,
        description="confirm a failed better, survives or regression gate on a second box "
        "before it fails: `confirm: {box: NAME}`",
    )
    guards: Guards = Field(default_factory=lambda: Guards(), description="the runner's rules")

    @field_validator("runtime", "box")
    @classmethod
    def _a_name_not_a_path(cls, value: Any) -> Any:
        # The name becomes a file name (inputs/runtimes/<name>.yaml, boxes/<box>.json): a
        # separator or `..` would put that file wherever the card says.
        if isinstance(value, str) and not _NAME.fullmatch(value):
            raise ValueError(
                f"{value[:60]!r} is a name, not a path: letters, digits, '_', '-', '.' (not "
                "starting with '.'); put the file where the search path finds it"
            )
        return value

    @field_validator("boxes")
    @classmethod
    def _box_names(cls, boxes: list[Any] | None) -> list[Any] | None:
        for entry in boxes or []:
            cls._a_name_not_a_path(entry)
        return boxes

    @field_validator("cells")
    @classmethod
    def _cell_names(cls, cells: dict[str, Cell]) -> dict[str, Cell]:
        for name in cells:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise ValueError(f"cell name {name!r}: use letters, digits, '_', '-', '.'")
        return cells

    @property
    def treatments(self) -> list[str]:
        """Cells other than the control, in card order."""
        return [name for name in self.cells if name != self.control]


# Fields a card may no longer set, and what to do instead. Pydantic alone would call them unknown
# keys; saying they were removed tells the author the line is dead, not misspelt.
REMOVED_FIELDS: dict[tuple[type[BaseModel], str], str] = {}


def build_card_schema() -> None:
    """Build Card's validator after those of the models it nests and validates on their own.

    Pydantic reuses a nested model's finished schema, but a deferred one (``defer_build``) is
    generated inline and then again when that model validates alone: a runtime profile file, a
    boxes file, a section the card leaves to its default factory. Built first, each is built once.
    """
    for model in (RuntimeProfile, BoxSpec, Workload, Design, AnalysisSpec, Guards, Canaries, Card):
        model.model_rebuild()
