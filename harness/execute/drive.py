"""The workload driver: an asyncio + aiohttp streaming client for OpenAI-compatible servers.

Timing follows vLLM's and SGLang's benchmark clients so numbers are comparable: ``t0`` is taken
with ``perf_counter`` just before the request is sent, *inside* the concurrency limiter, and the
time spent waiting for the limiter is recorded apart as the scheduling delay. Every chunk's
arrival time is kept; TTFT is the first chunk with content; ``n`` is the server's
``usage.completion_tokens``. SSE comment lines (``: prefill`` keep-alives) are skipped, never
counted as tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class WorkItem:
    """One request to send."""

    prompt_id: str
    domain: str
    phase: str
    phase_index: int
    max_tokens: int
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    warmup: bool = False
    target_prompt_tokens: int | None = None  # the phase's ``prompt_tokens`` when it set one


@dataclass
class RequestResult:
    """What one request did, with client-side timestamps in seconds."""

    prompt_id: str
    domain: str
    phase: str
    phase_index: int
    warmup: bool
    ok: bool = False
    error: str = ""
    first_after_boot: bool = False
    t_start_s: float = 0.0  # t0, relative to the start of the drive
    scheduling_delay_s: float = 0.0
    ttft_s: float | None = None
    e2el_s: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # relative to t0
    chunk_chars: list[int] = field(default_factory=list)
    output_text: str = ""
    server_timings: dict[str, Any] | None = None
    prompt_bytes: int = 0  # UTF-8 bytes of the prompt as sent (messages: their contents)
    target_prompt_tokens: int | None = None

    @property
    def output_sha256(self) -> str:
        """SHA-256 of the output text, for exact-output comparison."""
        return hashlib.sha256(self.output_text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class DriveSpec:
    """Where and how to send the workload."""

    base_url: str
    flavour: str  # "completions" or "chat"
    model: str
    concurrency: int = 1
    timeout_s: float = 300.0
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PhasePlan:
    """One phase: items to send once each, or cycled through until ``duration_s`` elapses."""

    name: str
    index: int
    items: tuple[WorkItem, ...]
    duration_s: float | None = None


def _body(spec: DriveSpec, item: WorkItem) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": item.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **spec.extra_body,
    }
    if spec.flavour == "chat":
        messages = list(item.messages or ()) or [{"role": "user", "content": item.prompt or ""}]
        body["messages"] = messages
        return "/v1/chat/completions", body
    prompt = item.prompt
    if prompt is None:
        prompt = "\n".join(m.get("content", "") for m in item.messages or ())
    body["prompt"] = prompt
    return "/v1/completions", body


def _chunk_text(payload: dict[str, Any]) -> str:
    choices = payload.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    return str(delta.get("content") or "")


async def send_one(
    session: aiohttp.ClientSession, spec: DriveSpec, item: WorkItem, origin: float, queued: float
) -> RequestResult:
    """Send one streaming request and time every chunk."""
    path, body = _body(spec, item)
    result = RequestResult(item.prompt_id, item.domain, item.phase, item.phase_index, item.warmup)
    result.target_prompt_tokens = item.target_prompt_tokens
    sent = body.get("prompt")
    if sent is None:
        sent = "".join(m.get("content", "") for m in body.get("messages", []))
    result.prompt_bytes = len(str(sent).encode("utf-8"))
    texts: list[str] = []
    t0 = time.perf_counter()
    result.t_start_s = t0 - origin
    result.scheduling_delay_s = t0 - queued
    try:
        timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
        async with session.post(spec.base_url + path, json=body, timeout=timeout) as response:
            if response.status != 200:
                detail = (await response.text())[:500]
                result.error = f"HTTP {response.status}: {detail}"
                return result
            async for raw in response.content:
                now = time.perf_counter()
                line = raw.decode("utf-8", "replace").strip()
                if not line or line.startswith(":"):
                    continue  # SSE comment or keep-alive: not a token
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                payload = json.loads(data)
                if payload.get("error"):
                    result.error = f"server error: {payload['error']}"
                    return result
                usage = payload.get("usage")
                if usage:
                    result.completion_tokens = usage.get("completion_tokens")
                    result.prompt_tokens = usage.get("prompt_tokens")
                if payload.get("timings"):
                    result.server_timings = payload["timings"]
                text = _chunk_text(payload)
                if text:
                    if result.ttft_s is None:
                        result.ttft_s = now - t0
                    result.e2el_s = now - t0
                    result.chunk_times_s.append(now - t0)
                    result.chunk_chars.append(len(text))
                    texts.append(text)
    except TimeoutError:
        result.error = f"timed out after {spec.timeout_s:g} s"
        return result
    except (aiohttp.ClientError, json.JSONDecodeError, ConnectionError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.output_text = "".join(texts)
    if result.ttft_s is None:
        result.error = "stream ended with no content"
    elif result.completion_tokens is None:
        result.error = "no usage in the stream (server ignored stream_options.include_usage)"
    else:
        result.ok = True
    return result


class _Cursor:
    """Round-robin position shared by the workers of one timed phase."""

    def __init__(self, phase: PhasePlan) -> None:
        self.phase = phase
        self.deadline = time.perf_counter() + (phase.duration_s or 0.0)
        self.position = 0

    def next_item(self) -> WorkItem | None:
        if time.perf_counter() >= self.deadline:
            return None
        item = self.phase.items[self.position % len(self.phase.items)]
        self.position += 1
        return item


async def _timed_worker(
    cursor: _Cursor, send: Callable[[WorkItem], Awaitable[RequestResult]]
) -> list[RequestResult]:
    """One of ``concurrency`` workers cycling through a phase's items until its deadline."""
    done: list[RequestResult] = []
    while (item := cursor.next_item()) is not None:
        done.append(await send(item))
    return done


PhaseHook = Callable[[PhasePlan], Awaitable[None]]
ProgressHook = Callable[[RequestResult], None]


async def drive(
    spec: DriveSpec,
    phases: Sequence[PhasePlan],
    *,
    on_phase: PhaseHook | None = None,
    on_result: ProgressHook | None = None,
    origin: float | None = None,
    mark_first: bool = True,
) -> list[RequestResult]:
    """Send every phase in order; returns results in completion order within each phase.

    ``t_start_s`` is measured from ``origin`` (a ``perf_counter`` value; default: now), so a run
    driven in several pieces keeps one time axis. ``mark_first`` flags the earliest request as
    the first after boot; a later piece of the same boot passes False.
    """
    results: list[RequestResult] = []
    limiter = asyncio.Semaphore(spec.concurrency)
    connector = aiohttp.TCPConnector(limit=spec.concurrency, force_close=False)
    if origin is None:
        origin = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:

        async def limited(item: WorkItem) -> RequestResult:
            queued = time.perf_counter()
            async with limiter:
                result = await send_one(session, spec, item, origin, queued)
            if on_result is not None:
                on_result(result)
            return result

        for phase in phases:
            if on_phase is not None:
                await on_phase(phase)
            if phase.duration_s is None:
                results.extend(await asyncio.gather(*(limited(i) for i in phase.items)))
                continue
            cursor = _Cursor(phase)
            batches = await asyncio.gather(
                *(_timed_worker(cursor, limited) for _ in range(spec.concurrency))
            )
            for batch in batches:
                results.extend(batch)
    if results and mark_first:
        first = min(results, key=lambda r: r.t_start_s)
        first.first_after_boot = True
    return results


def run_drive(
    spec: DriveSpec,
    phases: Sequence[PhasePlan],
    *,
    on_phase: PhaseHook | None = None,
    on_result: ProgressHook | None = None,
) -> list[RequestResult]:
    """Blocking wrapper over :func:`drive`."""
    return asyncio.run(drive(spec, phases, on_phase=on_phase, on_result=on_result))


def long_prompt(prompt: str, context: Sequence[str], target_bytes: int, seed: str) -> str:
    """``prompt`` preceded by context text so the whole is about ``target_bytes`` UTF-8 bytes.

    The context is ``context`` shuffled once by ``seed`` and repeated until long enough, cut at a
    character boundary, then a blank line and ``prompt`` last, so requests built from different
    prompts differ and the same inputs always give the same text. A prompt already longer than
    the target is sent as it is. The reference runtime's tokenizer is byte-level, so bytes are
    its tokens; for other tokenizers the length in tokens is only approximate.
    """
    tail = "\n\n" + prompt
    room = target_bytes - len(tail.encode("utf-8"))
    pieces = [text for text in context if text]
    if room <= 0 or not pieces:
        return prompt
    random.Random(seed).shuffle(pieces)
    separator = "\n\n"
    unit = separator.join(pieces).encode("utf-8") + separator.encode("utf-8")
    repeated = unit * (room // len(unit) + 1)
    # Cutting a multi-byte character in half would change the byte count on re-encoding.
    filler = repeated[:room].decode("utf-8", "ignore")
    return filler + tail
