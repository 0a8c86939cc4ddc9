"""What one run sends: the card's workload as phases of work items, and how to send them.

Only held-out prompts are scored; a mixed phase takes its prompts round-robin across domains, a
phase with ``prompt_tokens`` lengthens each prompt to about that many tokens, and the quality
suite runs last.
"""

from __future__ import annotations

from harness.card import LoadedCard
from harness.drive.client import DriveSpec, PhasePlan, WorkItem, long_prompt
from harness.formats.prompts import Prompt
from harness.runtimes.boot import RunningRuntime

QUALITY_PHASE = -2  # phase index of the quality suite: outputs checked, timings not scored


def build_phases(loaded: LoadedCard, warmup: bool, count: int | None = None) -> list[PhasePlan]:
    """The workload of one run as phases of work items (held-out prompts only); with
    ``warmup``, ``count`` requests (default ``workload.warmup_requests``) marked warmup."""
    card = loaded.card
    workload = card.workload
    heldout = loaded.split("heldout")

    def item(
        prompt_index: int,
        phase: str,
        index: int,
        domains: list[str] | None,
        prompt_tokens: int | None = None,
        unscored: bool = False,
    ) -> WorkItem:
        pool = _interleaved([p for p in heldout if domains is None or p.domain in domains])
        prompt = pool[prompt_index % len(pool)]
        text, messages = prompt.prompt, prompt.messages
        if prompt_tokens is not None:
            context = [p.text for p in heldout if p.domain == prompt.domain]
            seed = f"{card.design.seed}:{phase}:{prompt.domain}"
            text, messages = _lengthen(prompt.prompt, prompt.messages, context, prompt_tokens, seed)
        return WorkItem(
            prompt_id=prompt.id,
            domain=prompt.domain,
            phase=phase,
            phase_index=index,
            max_tokens=prompt.max_tokens or workload.max_tokens,
            prompt=text,
            messages=messages,
            warmup=warmup or unscored,
            target_prompt_tokens=prompt_tokens,
        )

    if warmup:
        n = workload.warmup_requests if count is None else count
        # Warm-up and washout are the first phase's traffic, so a run starts steady on it and
        # each shift the card declares is a shift from what ran before: drawn from every domain,
        # they primed the runtime with the next phase's experts too and hid its transient.
        first = workload.phases[0].domains if workload.phases else None
        items = tuple(item(i, "warmup", -1, first) for i in range(n))
        return [PhasePlan("warmup", -1, items)] if items else []
    phases = []
    if not workload.phases:
        count = len(heldout) * workload.passes
        phases.append(PhasePlan("main", 0, tuple(item(i, "main", 0, None) for i in range(count))))
    for index, phase in enumerate(workload.phases or []):
        pool_size = len([p for p in heldout if p.domain in phase.domains])
        count = phase.requests or pool_size
        items = tuple(
            item(i, phase.name, index, phase.domains, phase.prompt_tokens) for i in range(count)
        )
        # until_recovered: the phase's prompts again, not scored (every run scores the same
        # requests), while the runner reads that its recovery is not measured yet.
        extension = tuple(
            item(count + i, phase.name, index, phase.domains, phase.prompt_tokens, unscored=True)
            for i in range(phase.until_recovered or 0)
        )
        phases.append(PhasePlan(phase.name, index, items, phase.duration_s, extension))
    if loaded.quality:
        # The quality suite runs last, so its prompts never disturb the timed phases.
        quality = tuple(
            WorkItem(
                prompt_id=p.id,
                domain=p.domain,
                phase="quality",
                phase_index=QUALITY_PHASE,
                max_tokens=p.max_tokens or workload.max_tokens,
                prompt=p.prompt,
                messages=p.messages,
            )
            for p in loaded.quality
        )
        phases.append(PhasePlan("quality", QUALITY_PHASE, quality))
    return phases


def _lengthen(
    prompt: str | None,
    messages: tuple[dict[str, str], ...] | None,
    context: list[str],
    target_tokens: int,
    seed: str,
) -> tuple[str | None, tuple[dict[str, str], ...] | None]:
    """A prompt (or the last message of a chat) built to about ``target_tokens`` tokens."""
    if prompt is not None or not messages:
        return long_prompt(prompt or "", context, target_tokens, seed), messages
    others = sum(len(m.get("content", "").encode("utf-8")) for m in messages[:-1])
    last = dict(messages[-1])
    last["content"] = long_prompt(last.get("content", ""), context, target_tokens - others, seed)
    return None, (*messages[:-1], last)


def _interleaved(prompts: list[Prompt]) -> list[Prompt]:
    """Prompts taken round-robin across their domains, so a mixed phase is really mixed.

    In pool order, the first N prompts of a many-domain pool would all be of its first domain.
    """
    by_domain: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_domain.setdefault(prompt.domain, []).append(prompt)
    queues = list(by_domain.values())
    out: list[Prompt] = []
    for position in range(max((len(q) for q in queues), default=0)):
        out.extend(q[position] for q in queues if position < len(q))
    return out


def run_drive_spec(loaded: LoadedCard, runtime: RunningRuntime) -> DriveSpec:
    """How a run sends its workload to ``runtime``: the profile's API, the card's workload."""
    api = loaded.runtime.api
    workload = loaded.card.workload
    return DriveSpec(
        base_url=runtime.base_url,
        flavour=api.flavour,
        model=api.model,
        concurrency=workload.concurrency,
        timeout_s=workload.request_timeout_s,
        temperature=workload.temperature,
        extra_body=dict(api.extra_body),
        logprobs=workload.logprobs,
    )
