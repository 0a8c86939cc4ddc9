"""Canaries: a few fixed greedy prompts every warm boot answers before its warm-up.

docs/design.md#canaries. A residency change moves experts, not the math, so a boot's canary
outputs must equal the control's; one that differs ran on wrong weights (an eviction that swapped
two experts, a cache that served a stale record). The prompts are the harness's own, not the
card's pool, so they never prime a prefix cache for the scored requests; they are sent greedy
whatever the workload's temperature, and not scored. A run that sends no warm-up (a cold run,
or ``workload.warmup_requests: 0``) sends no canaries either: its first scored request is the
boot's first, and stays so. Where the workload asks for ``logprobs``, the canaries carry them
too: a change of the weights small enough to keep every argmax still moves them.
"""

from __future__ import annotations

from typing import Any

from harness.card import Card
from harness.drive.client import PhasePlan, RequestResult, WorkItem

# Plain text of different kinds (code, prose, a list, numbers), so the canaries route through
# many experts of a model trained on any of them.
CANARY_PROMPTS = (
    "def checksum(data):\n    total = 0\n    for byte in data:\n",
    "The expert cache keeps the most used experts resident because",
    "Shopping list:\n1. flour\n2.",
    "SELECT id, name FROM runs WHERE status = 'ok' ORDER BY",
    "In 1969 the first message sent between two computers was",
    "import json\n\nwith open('config.json') as handle:\n",
    "Three primes after 100 are",
    "Dear reviewer, thank you for",
)


def canary_phase(card: Card) -> list[PhasePlan]:
    """The card's canaries as one unscored phase (none when ``canaries.prompts`` is 0, or the
    card sends no warm-up: its first scored request is the boot's first, and stays so)."""
    if card.workload.warmup_requests == 0:
        return []
    items = tuple(
        WorkItem(
            prompt_id=f"canary-{i + 1}",
            domain="canary",
            phase="canary",
            phase_index=-1,
            max_tokens=card.canaries.max_tokens,
            prompt=text,
            warmup=True,
        )
        for i, text in enumerate(CANARY_PROMPTS[: card.canaries.prompts])
    )
    return [PhasePlan("canary", -1, items)] if items else []


def canary_record(results: list[RequestResult]) -> dict[str, Any]:
    """What ``canaries.json`` holds: each canary's output, its stream chunks (tokens) and, where
    the workload asked for them, each token's log-probability."""
    out = []
    for result in results:
        pieces, at = [], 0
        for size in result.chunk_chars:
            pieces.append(result.output_text[at : at + size])
            at += size
        out.append(
            {
                "prompt_id": result.prompt_id,
                "ok": result.ok,
                "error": result.error,
                "text": result.output_text,
                "pieces": pieces,
                "logprobs": [e.get("logprob") for e in result.logprobs],
            }
        )
    return {"version": 1, "canaries": out}
