"""The reference runtime's HTTP server (``harness refbox serve``, ``python -m harness.refbox``).

An aiohttp server in its own process around one :class:`~harness.refbox.engine.Engine`.

Endpoints
    ``GET /health``            503 while loading (or with ``--never-ready``), then 200
    ``GET /v1/models``         the one served model
    ``POST /v1/completions``   OpenAI-compatible; ``prompt`` a string (or a list of byte ids)
    ``POST /v1/chat/completions``  messages rendered as ``<|role|>\\ncontent\\n`` per message,
                               then ``<|assistant|>\\n``
    ``GET /counters``          cumulative counters (tokens, steps, lookups, cold_lookups, hits,
                               misses, expert_loads, bytes_read, swaps, evictions, ...)
    ``GET|POST /admin/knobs``  read or change live knobs (policy, decay_half_life_steps,
                               promote_threshold, hysteresis, drain_every, swaps_per_layer,
                               phase); an invalid value is HTTP 400 with the message
    ``POST /admin/dump``       route counts per layer and expert, in the route-count dump
                               format; body ``{"path": FILE}`` also writes the file

Generation: exactly ``max_tokens`` tokens (default 16), no stop condition (EOS is never
generated). Greedy argmax when ``temperature`` is 0 or absent; otherwise a softmax sample from a
generator seeded by the request's ``seed`` (default 0). Streaming sends one SSE chunk per token;
its text is the valid UTF-8 decoded so far, so a chunk inside a multi-byte character carries ""
and the character arrives whole with its last byte. With ``stream_options.include_usage`` a
final chunk carries ``usage``. Requests are served one at a time; the decode loop runs in a
worker thread, so ``/health`` and the admin endpoints stay responsive.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np
from aiohttp import web

from harness.errors import HarnessError, KnobError
from harness.maps import read_hotlist, read_rowmap, write_count_dump
from harness.policy import ExpertCache, PolicyKnobs, parse_priority
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.model import ModelConfig

__all__ = ["serve_main"]

_DONE = object()


class Server:
    """The HTTP face of one engine, with fault injection and a graceful shutdown."""

    def __init__(self, config: ServeConfig) -> None:
        """Hold the config; the engine is built later, in the background, after the bind."""
        self.config = config
        self.engine: Engine | None = None
        self.ready = False
        self.stop = asyncio.Event()
        self.serial = asyncio.Lock()  # one request at a time
        self.tokens_sent = 0  # lifetime, for --fail-after-tokens / --hang-after-tokens
        self.load_error: BaseException | None = None

    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/counters", self.counters)
        app.router.add_get("/admin/knobs", self.get_knobs)
        app.router.add_post("/admin/knobs", self.post_knobs)
        app.router.add_post("/admin/dump", self.dump)
        return app

    # -- plain endpoints ----------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """200 once the engine is loaded (never with --never-ready), else 503."""
        if self.ready and not self.config.never_ready:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "loading"}, status=503)

    async def models(self, request: web.Request) -> web.Response:
        """The OpenAI model list: the one served model."""
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "harness-refbox",
                    }
                ],
            }
        )

    def _engine(self) -> Engine:
        if self.engine is None or not self.ready:
            raise web.HTTPServiceUnavailable(
                text=json.dumps({"error": "the model is still loading"}),
                content_type="application/json",
            )
        return self.engine

    async def counters(self, request: web.Request) -> web.Response:
        """Cumulative counters as JSON."""
        return web.json_response(self._engine().counters())

    async def get_knobs(self, request: web.Request) -> web.Response:
        """The live knobs."""
        return web.json_response(self._engine().knob_dict())

    async def post_knobs(self, request: web.Request) -> web.Response:
        """Change live knobs from a JSON object; 400 with the message when a value is invalid."""
        engine = self._engine()
        body = await _json_body(request)
        try:
            knobs = engine.set_knobs(body)
        except KnobError as exc:
            return web.json_response({"error": exc.message}, status=400)
        return web.json_response(knobs)

    async def dump(self, request: web.Request) -> web.Response:
        """Route counts per layer and expert in the route-count dump format (int64 per expert).

        Body (optional): ``{"path": FILE}`` also writes the file atomically; ``{"counts":
        "cumulative"}`` dumps raw decode route counts instead of the policy's decayed counts.
        """
        engine = self._engine()
        body = await _json_body(request) if request.can_read_body else {}
        kind = body.get("counts", "decayed")
        if kind not in ("decayed", "cumulative"):
            return web.json_response({"error": "counts: must be decayed or cumulative"}, status=400)
        counts = np.rint(engine.route_count_dump(cumulative=kind == "cumulative")).astype(np.int64)
        now_s = time.time()
        path = body.get("path")
        if path is not None:
            if not isinstance(path, str):
                return web.json_response({"error": "path: must be a string"}, status=400)
            try:
                write_count_dump(path, counts, now_s)
            except (HarnessError, OSError) as exc:
                return web.json_response({"error": _message(exc)}, status=400)
        layers = {str(i): row for i, row in enumerate(counts.tolist())}
        return web.json_response({"layers": layers, "time": now_s})

    # -- completions --------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        body = await _json_body(request)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            data = prompt.encode("utf-8")
        elif isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < 256 for t in prompt):
            data = bytes(prompt)
        else:
            raise _bad_request("prompt: must be a string or a list of byte ids 0..255")
        return await self._serve(request, body, data, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        body = await _json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad_request("messages: must be a non-empty list")
        return await self._serve(request, body, render_chat(messages), chat=True)

    async def _serve(
        self, request: web.Request, body: dict[str, Any], prompt: bytes, *, chat: bool
    ) -> web.StreamResponse:
        engine = self._engine()
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _bad_request("max_tokens: must be a positive integer")
        temperature = body.get("temperature") or 0.0
        if not isinstance(temperature, int | float) or temperature < 0:
            raise _bad_request("temperature: must be a number >= 0")
        seed = body.get("seed") or 0
        if not isinstance(seed, int):
            raise _bad_request("seed: must be an integer")
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        meta = _Meta(
            id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            created=int(time.time()),
            model=self.config.model_name,
            chat=chat,
        )
        usage = {
            "prompt_tokens": len(prompt) + 1,  # + BOS
            "completion_tokens": max_tokens,
            "total_tokens": len(prompt) + 1 + max_tokens,
        }
        async with self.serial:
            tokens = self._tokens(engine, prompt, max_tokens, float(temperature), seed)
            if body.get("stream"):
                return await self._stream(request, tokens, meta, usage, include_usage)
            return await self._whole(tokens, meta, usage)

    async def _stream(
        self,
        request: web.Request,
        tokens: AsyncIterator[int],
        meta: _Meta,
        usage: dict[str, int],
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        index = 0
        async for token in tokens:
            index += 1
            text = decoder.decode(bytes((token,)), final=index == usage["completion_tokens"])
            finish = "length" if index == usage["completion_tokens"] else None
            await _send(response, meta.chunk(text, finish, first=index == 1))
            if await self._after_token():
                return response  # shutting down during an injected hang
        if include_usage:
            await _send(response, meta.usage_chunk(usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _whole(
        self, tokens: AsyncIterator[int], meta: _Meta, usage: dict[str, int]
    ) -> web.Response:
        out = bytearray()
        async for token in tokens:
            out.append(token)
            if await self._after_token():
                raise web.HTTPServiceUnavailable(text="shutting down")
        text = out.decode("utf-8", errors="replace")
        return web.json_response(meta.whole(text, usage))

    async def _after_token(self) -> bool:
        """Fault injection, checked after every token sent: crash or hang on cue.

        Returns True when the request must end because the server stopped during a hang.
        """
        self.tokens_sent += 1
        fail = self.config.fail_after_tokens
        if fail is not None and self.tokens_sent >= fail:
            print(f"refbox: --fail-after-tokens {fail} reached; exiting", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        hang = self.config.hang_after_tokens
        if hang is not None and self.tokens_sent >= hang:
            print(f"refbox: --hang-after-tokens {hang} reached; hanging", file=sys.stderr)
            await self.stop.wait()
            return True
        return False

    async def _tokens(
        self, engine: Engine, prompt: bytes, max_tokens: int, temperature: float, seed: int
    ) -> AsyncIterator[int]:
        """Run the engine's generator in a worker thread and hand its tokens to the loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        cancel = threading.Event()

        def work() -> None:
            try:
                for token in engine.generate(prompt, max_tokens, temperature, seed):
                    loop.call_soon_threadsafe(queue.put_nowait, token)
                    if cancel.is_set():
                        break
            except BaseException as exc:  # handed to the request, which re-raises it
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        worker = loop.run_in_executor(None, work)
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, int)
                yield item
        finally:
            cancel.set()
            await asyncio.shield(worker)
            engine.flush()

    # -- lifecycle ----------------------------------------------------------------------------

    async def load(self) -> None:
        """Build the engine off the loop (after any --boot-delay-s), then announce readiness."""
        config = self.config
        if config.boot_delay_s > 0:
            await asyncio.sleep(config.boot_delay_s)
        loop = asyncio.get_running_loop()
        try:
            self.engine = await loop.run_in_executor(None, config.build_engine)
        except BaseException as exc:
            self.load_error = exc
            self.stop.set()
            raise
        self.ready = True
        if not config.never_ready:
            print(f"refbox: listening on http://{config.host}:{config.port}", file=sys.stderr)
            sys.stderr.flush()

    def shutdown(self) -> None:
        """Close the engine (flushing ring and trace) and write the counters file."""
        engine = self.engine
        if engine is None:
            return
        counters = engine.counters()
        engine.close()
        if self.config.counters_path:
            payload = {"schema_version": 1, **counters, "knobs": engine.knob_dict()}
            tmp = f"{self.config.counters_path}.tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(payload, handle, indent=1)
            os.replace(tmp, self.config.counters_path)


class _Meta:
    """Shapes the OpenAI response objects of one request."""

    def __init__(self, id: str, created: int, model: str, chat: bool) -> None:
        self.id, self.created, self.model, self.chat = id, created, model, chat

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish: str | None, *, first: bool) -> dict[str, Any]:
        """One streamed token."""
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta = {"role": "assistant", "content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        """The final chunk carrying ``usage`` (no choices), as OpenAI sends it."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage}

    def whole(self, text: str, usage: dict[str, int]) -> dict[str, Any]:
        """A non-streaming response."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage}


def render_chat(messages: list[Any]) -> bytes:
    """The chat template: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``."""
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad_request(f"messages[{i}]: must be an object with role and content")
        role = message.get("role", "user")
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and "text" in p
            )
        if not isinstance(role, str) or not isinstance(content, str):
            raise _bad_request(f"messages[{i}]: role and content must be strings")
        parts.append(f"<|{role}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts).encode("utf-8")


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad_request(f"request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _bad_request("request body must be a JSON object")
    return body


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


# -- configuration: flags, env, validation ----------------------------------------------------

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


def build_parser() -> argparse.ArgumentParser:
    """The ``serve`` flags (see ``--help``)."""
    p = _Parser(
        prog="harness refbox serve",
        description=_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    net = p.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    net.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (8000)")
    net.add_argument("--model-name", default="refbox", help="served model id (refbox)")
    geo = p.add_argument_group("model")
    geo.add_argument("--layers", type=int, default=8, help="MoE layers (8)")
    geo.add_argument("--experts", type=int, default=64, help="experts per layer (64)")
    geo.add_argument("--top-k", type=int, default=4, help="experts per token per layer (4)")
    geo.add_argument("--d-model", type=int, default=64, help="hidden width (64)")
    geo.add_argument("--d-ff", type=int, default=128, help="expert FFN width (128)")
    geo.add_argument("--seed", type=int, default=0, help="weights seed (0)")
    tier = p.add_argument_group("tiers")
    tier.add_argument("--hot-slots", type=int, default=48, help="resident experts per layer (48)")
    tier.add_argument(
        "--expert-bytes",
        type=int,
        default=512 * 1024,
        help="slow-tier record size in bytes; a cold lookup reads and copies one whole record, "
        "so this scales the cost of a miss (524288; never below the weights' own size)",
    )
    tier.add_argument("--cold-dir", default=None, help="directory for the slow-tier file (tmp)")
    tier.add_argument(
        "--rowmap",
        default=None,
        help="rowmap JSON: hot experts per layer (default: the first "
        "hot-slots ids of each layer, a deliberately stale map)",
    )
    tier.add_argument("--hotlist", default=None, help="ds4 hotlist file (cache mode)")
    tier.add_argument(
        "--cache-records", type=int, default=0, help="cache mode: cached records in all (0 = off)"
    )
    tier.add_argument(
        "--hotlist-priority", default="adaptive", help="cache mode prior: legacy, adaptive or N"
    )
    pol = p.add_argument_group("adaptive residency policy (rowmap mode)")
    d = PolicyKnobs()
    pol.add_argument("--policy", default=d.policy, help=f"adaptive or frozen ({d.policy})")
    pol.add_argument(
        "--decay-half-life-steps",
        type=_float,
        default=d.decay_half_life_steps,
        help=f"EWMA half-life of the counters ({d.decay_half_life_steps:g})",
    )
    pol.add_argument(
        "--promote-threshold",
        type=_float,
        default=d.promote_threshold,
        help=f"decayed count a cold expert needs ({d.promote_threshold:g})",
    )
    pol.add_argument(
        "--hysteresis",
        type=_float,
        default=d.hysteresis,
        help=f"margin over the weakest hot expert ({d.hysteresis:g})",
    )
    pol.add_argument(
        "--drain-every",
        type=int,
        default=d.drain_every,
        help=f"decode steps between swap-queue drains ({d.drain_every})",
    )
    pol.add_argument(
        "--swaps-per-layer",
        type=int,
        default=d.swaps_per_layer,
        help=f"swaps per layer per drain ({d.swaps_per_layer})",
    )
    out = p.add_argument_group("files")
    out.add_argument("--ring", default=None, help="telemetry ring file (one record per step)")
    out.add_argument("--ring-capacity", type=int, default=65536, help="ring slots (65536)")
    out.add_argument("--counters", default=None, help="counters JSON written at shutdown")
    out.add_argument("--route-trace", default=None, help="routing trace JSONL")
    out.add_argument("--phase", type=int, default=0, help="initial phase tag in the ring (0)")
    fault = p.add_argument_group("fault and drift injection")
    fault.add_argument(
        "--fail-after-tokens",
        type=int,
        default=None,
        help="exit with code 1 right after the N-th generated token of the process lifetime",
    )
    fault.add_argument(
        "--hang-after-tokens",
        type=int,
        default=None,
        help="after the N-th generated token stop emitting, keeping the connection open",
    )
    fault.add_argument(
        "--boot-delay-s",
        type=_float,
        default=0.0,
        help="wait this long (health 503) before loading the model (0)",
    )
    fault.add_argument(
        "--never-ready", action="store_true", help="load, but keep /health at 503 forever"
    )
    fault.add_argument(
        "--drift-pct-per-min",
        type=_float,
        default=0.0,
        help="make every step P%% slower per minute since --drift-origin, by real extra work",
    )
    fault.add_argument(
        "--drift-origin",
        type=_float,
        default=None,
        help="epoch seconds the drift counts from, shared across boots (default: boot time)",
    )
    return p


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


def _validate(a: argparse.Namespace) -> ServeConfig:
    """Check every value and read the maps; raises _UsageError naming the first bad flag."""

    def need(ok: bool, flag: str, message: str) -> None:
        if not ok:
            raise _UsageError(f"{flag}: {message}")

    need(0 <= a.port <= 65535, "--port", f"must be in 0..65535, got {a.port}")
    for flag, value in (
        ("--layers", a.layers),
        ("--experts", a.experts),
        ("--d-model", a.d_model),
        ("--d-ff", a.d_ff),
    ):
        need(value >= 1, flag, f"must be a positive integer, got {value}")
    need(
        1 <= a.top_k <= a.experts, "--top-k", f"must be in 1..experts ({a.experts}), got {a.top_k}"
    )
    need(
        0 <= a.hot_slots <= a.experts,
        "--hot-slots",
        f"must be in 0..experts ({a.experts}), got {a.hot_slots}",
    )
    need(a.expert_bytes >= 0, "--expert-bytes", f"must be >= 0, got {a.expert_bytes}")
    need(a.ring_capacity >= 1, "--ring-capacity", f"must be >= 1, got {a.ring_capacity}")
    need(a.cache_records >= 0, "--cache-records", f"must be >= 0, got {a.cache_records}")
    for flag, value in (
        ("--fail-after-tokens", a.fail_after_tokens),
        ("--hang-after-tokens", a.hang_after_tokens),
    ):
        need(value is None or value >= 1, flag, f"must be a positive integer, got {value}")
    for flag, value in (
        ("--boot-delay-s", a.boot_delay_s),
        ("--drift-pct-per-min", a.drift_pct_per_min),
    ):
        need(value >= 0, flag, f"must be >= 0, got {value}")
    if a.cold_dir is not None:
        need(os.path.isdir(a.cold_dir), "--cold-dir", f"{a.cold_dir!r} is not a directory")
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
    try:
        priority = parse_priority(a.hotlist_priority)
    except KnobError as exc:
        raise _UsageError(f"--hotlist-priority: {exc.message}") from exc
    rowmap: list[list[int]] | None = None
    hot_slots = a.hot_slots
    if a.rowmap is not None:
        need(
            a.cache_records == 0,
            "--rowmap",
            "a rowmap and cache mode (--cache-records) exclude each other; pick one",
        )
        try:
            loaded = read_rowmap(a.rowmap, experts=a.experts)
        except (HarnessError, OSError) as exc:
            raise _UsageError(f"--rowmap: {_message(exc)}") from exc
        rowmap = [sorted(int(e) for e in layer) for layer in loaded.hot]
        need(
            len(rowmap) == a.layers,
            "--rowmap",
            f"{a.rowmap}: has {len(rowmap)} layers, the model has {a.layers} (--layers)",
        )
        sizes = sorted({len(layer) for layer in rowmap})
        need(
            len(sizes) == 1,
            "--rowmap",
            f"{a.rowmap}: hot sets differ in size across layers ({sizes}); one size per map",
        )
        hot_slots = sizes[0]
    hotlist: list[tuple[int, int]] = []
    if a.hotlist is not None:
        need(a.cache_records > 0, "--hotlist", "a hotlist needs cache mode: set --cache-records N")
        try:
            entries = read_hotlist(a.hotlist).entries
            hotlist = [(int(e[0]), int(e[1])) for e in entries]
            ExpertCache(a.cache_records, hotlist, priority, a.layers, a.experts)
        except (HarnessError, OSError) as exc:
            raise _UsageError(f"--hotlist: {_message(exc)}") from exc
    for flag, path in (
        ("--ring", a.ring),
        ("--counters", a.counters),
        ("--route-trace", a.route_trace),
    ):
        if path is not None:
            parent = os.path.dirname(os.path.abspath(path))
            need(os.path.isdir(parent), flag, f"directory {parent!r} does not exist")
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
        phase=a.phase,
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
    )


def _message(exc: BaseException) -> str:
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


async def _serve(config: ServeConfig, sock: socket.socket) -> int:
    server = Server(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.stop.set)
    runner = web.AppRunner(server.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock, shutdown_timeout=1.0)
    await site.start()
    # The port is known (and reachable: /health says 503) before the model loads.
    print(f"refbox: bound http://{config.host}:{config.port}; loading", file=sys.stderr)
    sys.stderr.flush()
    loader = asyncio.create_task(server.load())
    await server.stop.wait()
    if not loader.done():
        loader.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await loader
    await runner.cleanup()
    await loop.run_in_executor(None, server.shutdown)
    if server.load_error is not None:
        print(f"refbox: failed to load the model: {server.load_error}", file=sys.stderr)
        return 3
    return 0


def serve_main(argv: list[str]) -> int:
    """Entry point of ``harness refbox serve ...``; returns the process exit code."""
    args = list(argv)
    if args and args[0] == "serve":
        args = args[1:]
    config = parse_serve_args(args)
    if isinstance(config, int):
        return config
    try:
        sock = socket.create_server((config.host, config.port))
    except OSError as exc:
        print(
            f"refbox: --port: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr
        )
        return 3
    config.port = sock.getsockname()[1]
    return asyncio.run(_serve(config, sock))
