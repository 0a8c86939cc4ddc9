"""The workload driver: an asyncio + aiohttp streaming client for OpenAI-compatible servers.

Timing follows vLLM's and SGLang's benchmark clients so numbers are comparable: ``t0`` is taken
with ``perf_counter`` just before the request is sent, *inside* the concurrency limiter, and the
time spent waiting for the limiter is recorded apart as the scheduling delay. Every chunk's
arrival time is kept; TTFT is the first chunk with content; ``n`` is the server's
``usage.completion_tokens``. SSE comment lines (``: prefill`` keep-alives) are skipped, never
counted as tokens.

A hung runtime is recognised as hung (:class:`_Watch`): once a request has timed out with no
token from any request since its own last one, the drive sends nothing more, cancels what is in
flight and raises :class:`RuntimeHung` with every result so far, instead of waiting out one
request timeout per remaining request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from harness.boxes.async_interrupts import run_async
from harness.boxes.tunnel import refusal
from harness.errors import InfrastructureError


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
    # Per generated token, when asked for: {"token", "logprob", "top": {token: logprob}}.
    logprobs: list[dict[str, Any]] = field(default_factory=list)

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
    logprobs: int = 0  # top log-probabilities asked for per token (0: none)


@dataclass(frozen=True)
class PhasePlan:
    """One phase: items to send once each, or cycled through until ``duration_s`` elapses."""

    name: str
    index: int
    items: tuple[WorkItem, ...]
    duration_s: float | None = None
    # Unscored items cycled after ``items`` while the drive's ``until`` says the phase's
    # recovery is not measured yet (``until_recovered``); at most this many.
    extension: tuple[WorkItem, ...] = ()


def request_body(spec: DriveSpec, item: WorkItem) -> tuple[str, dict[str, Any]]:
    """The path and streamed request body for one item (the driver sends exactly this)."""
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
        if spec.logprobs:
            body.update(logprobs=True, top_logprobs=spec.logprobs)
        return "/v1/chat/completions", body
    if spec.logprobs:
        body["logprobs"] = spec.logprobs
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


def chunk_logprobs(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunk's tokens with their log-probabilities, as either shape servers send: chat's
    (and llama-server's) ``content`` list of ``{token, logprob, top_logprobs: [{token,
    logprob}]}``, or the completions API's parallel ``tokens``, ``token_logprobs`` and
    ``top_logprobs`` (one ``{token: logprob}`` each). Anything else reads as none."""
    choices = payload.get("choices") or []
    block = choices[0].get("logprobs") if choices else None
    if not isinstance(block, dict):
        return []
    out: list[dict[str, Any]] = []
    if isinstance(block.get("content"), list):
        for entry in block["content"]:
            top = {
                str(t.get("token")): float(t["logprob"])
                for t in entry.get("top_logprobs") or []
                if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
            }
            logprob = entry.get("logprob")
            own = float(logprob) if isinstance(logprob, int | float) else None
            out.append({"token": str(entry.get("token")), "logprob": own, "top": top})
        return out
    tokens = block.get("tokens") or []
    own_list = block.get("token_logprobs") or [None] * len(tokens)
    tops = block.get("top_logprobs") or [None] * len(tokens)
    for token, own, top in zip(tokens, own_list, tops, strict=False):
        picked = {str(k): float(v) for k, v in (top or {}).items() if isinstance(v, int | float)}
        value = float(own) if isinstance(own, int | float) else None
        out.append({"token": str(token), "logprob": value, "top": picked})
    return out


def is_reasoning_chunk(payload: dict[str, Any]) -> bool:
    """True for a chat chunk carrying ``delta.reasoning_content`` (a thinking model's thoughts,
    which ds4-server streams even when they decode to an empty string)."""
    choices = payload.get("choices") or []
    return bool(choices) and "reasoning_content" in (choices[0].get("delta") or {})


class RuntimeHung(InfrastructureError):
    """The runtime stopped streaming or refused a connection (see :class:`_Watch`); ``results``
    holds every request the drive sent, those cancelled in flight included."""

    def __init__(self, message: str, results: list[RequestResult]) -> None:
        super().__init__(message)
        self.results = results


CANCELLED_HUNG = (
    "cancelled: the runtime was judged hung (a request timed out with no token since) or down "
    "(a request could not connect)"
)


class _Watch:
    """Decides when the runtime is hung (or down), and then cancels the requests in flight.

    Progress is a content chunk (a token's text) arriving on any stream of this drive. Headers,
    SSE comments and keep-alives are not progress: a runtime whose HTTP loop still answers
    while its engine is stuck sends those forever. A request that times out has been stalled
    since its own last content chunk (since it was sent, if it had none). The runtime is hung
    when no request at all got a content chunk after that moment: nothing moved for a whole
    stall, so it is not one slow request among streaming ones. Every request sent before the
    runtime's last token times out within ``timeout_s`` of it, so hung is decided at most one
    request timeout after the last token, whatever the concurrency. A runtime whose first
    token takes longer than the timeout is judged hung too: to a client the two look alike,
    and a scored request that timed out fails its run anyway. A request that cannot connect
    means the runtime is down (exited, or no longer listening): every later one would fail the
    same way, at once, so the drive stops there too rather than spin through a timed phase.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.last_token = float("-inf")  # perf_counter of the latest content chunk, any request
        self.hung: str | None = None  # what the request that decided it saw, once decided
        self.state = "hung"  # or "down": it refused a connection
        self.in_flight: set[asyncio.Task[RequestResult]] = set()
        self.cancelled = 0
        self.not_sent = 0

    def token(self, now: float) -> None:
        """A content chunk arrived on some stream."""
        self.last_token = max(self.last_token, now)

    def timed_out(self, result: RequestResult, stalled_since: float, now: float) -> None:
        """A request timed out: decide whether the runtime is hung, and if so stop the rest."""
        if self.hung is not None or self.last_token > stalled_since:
            return
        self.hung = (
            f"request {result.prompt_id} (phase {result.phase}) timed out after "
            f"{self.timeout_s:g} s with no token from any request for the last "
            f"{now - stalled_since:.1f} s"
        )
        self._cancel_others()

    def refused(self, result: RequestResult, detail: str) -> None:
        """A request could not connect (``detail`` says how): the runtime exited or stopped
        listening, so every later request would fail the same way (a timed phase would send
        them until its end)."""
        if self.hung is not None:
            return
        self.state = "down"
        self.hung = (
            f"request {result.prompt_id} (phase {result.phase}) could not connect "
            f"({detail}): the runtime exited or stopped listening"
        )
        self._cancel_others()

    def _cancel_others(self) -> None:
        current = asyncio.current_task()
        for task in self.in_flight:
            if task is not current:
                task.cancel()

    async def send(
        self,
        session: aiohttp.ClientSession,
        spec: DriveSpec,
        item: WorkItem,
        origin: float,
        queued: float,
    ) -> RequestResult:
        """:func:`send_one` in a task of its own, so a hung verdict can cancel it and still
        keep what it streamed."""
        result = _new_result(item)
        task = asyncio.create_task(
            send_one(session, spec, item, origin, queued, result=result, watch=self)
        )
        self.in_flight.add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()  # the drive itself is being cancelled (Ctrl-C, a stop signal)
            raise
        finally:
            self.in_flight.discard(task)
        if task.cancelled():
            self.cancelled += 1
            result.error = CANCELLED_HUNG
            return result
        return task.result()

    def error(self, results: list[RequestResult]) -> RuntimeHung:
        """The failure the drive raises once the runtime is hung."""
        noun = "request" if self.cancelled == 1 else "requests"
        advice = (
            "if it is only slow, raise workload.request_timeout_s"
            if self.state == "hung"
            else "a retry boots it afresh"
        )
        return RuntimeHung(
            f"runtime {self.state}: {self.hung}; stopped sending ({self.cancelled} {noun} in "
            f"flight cancelled, {self.not_sent} not sent). See the runtime's log tail; {advice}",
            results,
        )


def _new_result(item: WorkItem) -> RequestResult:
    result = RequestResult(item.prompt_id, item.domain, item.phase, item.phase_index, item.warmup)
    result.target_prompt_tokens = item.target_prompt_tokens
    return result


async def send_one(
    session: aiohttp.ClientSession,
    spec: DriveSpec,
    item: WorkItem,
    origin: float,
    queued: float,
    *,
    result: RequestResult | None = None,
    watch: _Watch | None = None,
) -> RequestResult:
    """Send one streaming request and time every chunk (into ``result``, when given).

    With a ``watch``, every content chunk counts as progress and a timeout asks it whether the
    runtime is hung.
    """
    path, body = request_body(spec, item)
    if result is None:
        result = _new_result(item)
    sent = body.get("prompt")
    if sent is None:
        sent = "".join(m.get("content", "") for m in body.get("messages", []))
    result.prompt_bytes = len(str(sent).encode("utf-8"))
    texts: list[str] = []
    thinking = False  # a chunk carried delta.reasoning_content (never counted as content)
    t0 = time.perf_counter()
    result.t_start_s = t0 - origin
    result.scheduling_delay_s = t0 - queued
    stalled_since = t0  # the last content chunk, in perf_counter time
    try:
        # aiohttp rounds timeouts of 5 s and more up to a whole second of loop time; requests
        # would then time out together, and a stalled one would outlive its timeout.
        timeout = aiohttp.ClientTimeout(total=spec.timeout_s, ceil_threshold=math.inf)
        async with session.post(spec.base_url + path, json=body, timeout=timeout) as response:
            if response.status != 200:
                detail = (await response.text())[:500]
                if refusal(response.status, response.headers) is not None:
                    # A tunnel's answer for a runtime that refused it: a refused connect.
                    result.error = f"ConnectionRefusedError: {detail}"
                    if watch is not None:
                        watch.refused(result, result.error)
                    return result
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
                if spec.logprobs:
                    result.logprobs.extend(chunk_logprobs(payload))
                thinking = thinking or is_reasoning_chunk(payload)
                if text:
                    stalled_since = now
                    if watch is not None:
                        watch.token(now)
                    if result.ttft_s is None:
                        result.ttft_s = now - t0
                    result.e2el_s = now - t0
                    result.chunk_times_s.append(now - t0)
                    result.chunk_chars.append(len(text))
                    texts.append(text)
    except TimeoutError:
        result.error = f"timed out after {spec.timeout_s:g} s"
        if watch is not None:
            watch.timed_out(result, stalled_since, time.perf_counter())
        return result
    except aiohttp.ClientConnectorError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        if watch is not None:
            watch.refused(result, result.error)
        return result
    except (aiohttp.ClientError, json.JSONDecodeError, ConnectionError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.output_text = "".join(texts)
    if result.ttft_s is None:
        result.error = "stream ended with no content"
        if thinking:
            result.error += (
                " (only delta.reasoning_content: the server was thinking; turn thinking off in "
                "the profile's api.extra_body, e.g. ds4-server's {thinking: {type: disabled}})"
            )
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


class _Items(Protocol):
    def next_item(self) -> WorkItem | None: ...


async def _timed_worker(
    cursor: _Items, send: Callable[[WorkItem], Awaitable[RequestResult | None]]
) -> list[RequestResult]:
    """One of ``concurrency`` workers cycling through a phase's items until its deadline (or
    until ``send`` returns None: the runtime is hung)."""
    done: list[RequestResult] = []
    while (item := cursor.next_item()) is not None:
        result = await send(item)
        if result is None:
            break
        done.append(result)
    return done


PhaseHook = Callable[[PhasePlan], Awaitable[None]]
ProgressHook = Callable[[RequestResult], None]
CHECK_EVERY_S = 0.5


@dataclass(frozen=True)
class UntilHook:
    """What ends a phase's ``until_recovered`` extension: ``measured`` says whether its recovery
    is measured (asked first, then every CHECK_EVERY_S). ``begins`` and ``ends`` bracket the
    requests it sends (called only when it sends any), so the runner can leave them out of the
    run's counters: the extension runs on until the ring shows recovery, a length that differs
    from run to run, and its prompts would otherwise dilute every counted rate."""

    measured: Callable[[PhasePlan], Awaitable[bool]]
    begins: Callable[[PhasePlan], Awaitable[None]] | None = None
    ends: Callable[[PhasePlan], Awaitable[None]] | None = None


class _Extension:
    """The unscored items of a phase's extension, handed out until ``stop`` or exhausted."""

    def __init__(self, phase: PhasePlan) -> None:
        self.items = phase.extension
        self.position = 0
        self.stop = asyncio.Event()

    def next_item(self) -> WorkItem | None:
        if self.stop.is_set() or self.position >= len(self.items):
            return None
        item = self.items[self.position]
        self.position += 1
        return item


async def _extend(
    phase: PhasePlan,
    until: UntilHook,
    concurrency: int,
    send: Callable[[WorkItem], Awaitable[RequestResult | None]],
) -> list[RequestResult]:
    """Send a phase's extension until ``until`` says its recovery is measured (checked first,
    then every CHECK_EVERY_S while the workers send) or the extension runs out.

    A stop is confirmed once the requests in flight at the check have finished: their steps
    join the phase, and may move its converged span or break the hold the check saw (one CI run
    of the ladder read "never recovered" so), so the extension goes on until the phase as it
    ended reads as measured — the test the analysis then applies to it."""
    extension = _Extension(phase)
    hung = False

    async def watch() -> None:
        # Never cancelled inside ``measured`` (a drain in a thread): a second drain beside it
        # would read the ring twice. It waits on the stop instead of sleeping through it.
        while not extension.stop.is_set():
            if await until.measured(phase):
                extension.stop.set()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(extension.stop.wait(), CHECK_EVERY_S)

    async def sending(item: WorkItem) -> RequestResult | None:
        nonlocal hung
        result = await send(item)
        hung = hung or result is None
        return result

    if await until.measured(phase):
        return []
    if until.begins is not None:
        await until.begins(phase)
    results: list[RequestResult] = []
    try:
        while True:
            extension.stop.clear()
            checker = asyncio.create_task(watch())
            try:
                batches = await asyncio.gather(
                    *(_timed_worker(extension, sending) for _ in range(concurrency))
                )
            finally:
                extension.stop.set()
                await checker
            results.extend(r for batch in batches for r in batch)
            exhausted = extension.position >= len(extension.items)
            if hung or exhausted or await until.measured(phase):
                return results
    finally:
        if until.ends is not None:
            await until.ends(phase)


async def drive(
    spec: DriveSpec,
    phases: Sequence[PhasePlan],
    *,
    on_phase: PhaseHook | None = None,
    on_result: ProgressHook | None = None,
    origin: float | None = None,
    mark_first: bool = True,
    until: UntilHook | None = None,
) -> list[RequestResult]:
    """Send every phase in order; returns results in completion order within each phase.

    A phase with an ``extension`` is followed by its unscored items while ``until`` says its
    recovery is not measured yet (none are sent without ``until``).

    ``t_start_s`` is measured from ``origin`` (a ``perf_counter`` value; default: now), so a run
    driven in several pieces keeps one time axis. ``mark_first`` flags the earliest request as
    the first after boot; a later piece of the same boot passes False. Raises
    :class:`RuntimeHung`, carrying the results, when the runtime stops streaming.
    """
    results: list[RequestResult] = []
    limiter = asyncio.Semaphore(spec.concurrency)
    connector = aiohttp.TCPConnector(limit=spec.concurrency, force_close=False)
    watch = _Watch(spec.timeout_s)
    if origin is None:
        origin = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:

        async def limited(item: WorkItem, counted: bool = True) -> RequestResult | None:
            queued = time.perf_counter()
            async with limiter:
                if watch.hung is not None:
                    watch.not_sent += counted  # a timed phase has no count of what is left
                    return None
                result = await watch.send(session, spec, item, origin, queued)
            if on_result is not None:
                on_result(result)
            return result

        for index, phase in enumerate(phases):
            if on_phase is not None:
                await on_phase(phase)
            if phase.duration_s is None:
                sent = await asyncio.gather(*(limited(i) for i in phase.items))
                results.extend(r for r in sent if r is not None)
            else:
                cursor = _Cursor(phase)
                batches = await asyncio.gather(
                    *(
                        _timed_worker(cursor, lambda i: limited(i, counted=False))
                        for _ in range(spec.concurrency)
                    )
                )
                for batch in batches:
                    results.extend(batch)
            if phase.extension and until is not None and watch.hung is None:
                results.extend(
                    await _extend(
                        phase, until, spec.concurrency, lambda i: limited(i, counted=False)
                    )
                )
            if watch.hung is not None:
                watch.not_sent += sum(len(p.items) for p in phases[index + 1 :] if not p.duration_s)
                break
    if results and mark_first:
        first = min(results, key=lambda r: r.t_start_s)
        first.first_after_boot = True
    if watch.hung is not None:
        raise watch.error(results)
    return results


def run_drive(
    spec: DriveSpec,
    phases: Sequence[PhasePlan],
    *,
    on_phase: PhaseHook | None = None,
    on_result: ProgressHook | None = None,
) -> list[RequestResult]:
    """Blocking wrapper over :func:`drive`."""
    return run_async(drive(spec, phases, on_phase=on_phase, on_result=on_result))


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
