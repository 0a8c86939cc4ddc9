"""The reference runtime's HTTP server (``harness refbox serve``, ``python -m harness.refbox``).

An aiohttp server in its own process around one :class:`~harness.refbox.engine.Engine`; its
flags and env vars are parsed and checked in :mod:`harness.refbox.options`.

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
    ``POST /admin/reset``      back to the boot state (hot tier refilled, adaptive state, knobs
                               and counters cleared; ring and step numbers go on); body: live
                               knobs applied after it, ``rowmap`` a map file to refill from
    ``POST /admin/dump``       route counts per layer and expert, in the route-count dump
                               format; body ``{"path": FILE}`` also writes the file (inside
                               ``--dump-dir`` only)
    ``GET /admin/state``       the live knobs and the map file loaded last (``rowmap``): what
                               the harness reads back after every run

    ``GET|POST /start_expert_distribution_record``, ``/stop_…``, ``/dump_…``
                               SGLang's recorder (with ``--expert-distribution-recorder-mode
                               stat``): the dump writes ``expert_distribution_recorder_<time>.pt``
                               into ``$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`` (default /tmp)

Every ``/admin`` and recorder call needs ``Authorization: Bearer TOKEN`` when the server was
given a token (``REFBOX_ADMIN_TOKEN``; the harness makes one per boot), and an ``/admin`` change
must be ``Content-Type: application/json`` (415 otherwise: a web page can post text/plain to a
port on the box, but not JSON without a preflight the server never answers).

With ``--enable-return-routed-experts`` (vLLM's flag), a non-streamed completion's choice carries
``routed_experts``: base64 ``.npy`` bytes of ``[prompt + completion tokens - 1, layers, top_k]``,
the prompt's tokens (BOS first), then each generated token but the last (never forwarded). With
``--routed-experts-format sglang`` as SGLang returns the same rows instead: only to a request
with ``return_routed_experts: true``, as ``sglext.routed_experts`` (base64 of flat int32).

With ``--control FILE`` the same changes arrive through a file the server polls (every 50 ms):
``{"seq": N, "knobs": {...}, "reset": true|false}``, acknowledged in the log as ``refbox: control
N applied`` or ``refbox: control N rejected: WHY``, so a harness can drive a runtime that has no
admin endpoint the way it drives one that has. With ``--control-signal HUP`` (or USR1, USR2) it
reads the file only when that signal arrives, as a runtime that reloads on a signal does.

Generation: exactly ``max_tokens`` tokens (default 16), no stop condition (EOS is never
generated). Greedy argmax when ``temperature`` is 0 or absent; otherwise a softmax sample from a
generator seeded by the request's ``seed`` (default 0). Streaming sends one SSE chunk per token;
its text is the valid UTF-8 decoded so far, so a chunk inside a multi-byte character carries ""
and the character arrives whole with its last byte. With ``stream_options.include_usage`` a
final chunk carries ``usage``. Requests are served one at a time; the decode loop runs in a
worker thread, so ``/health`` and the admin endpoints stay responsive.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import hmac
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from harness.errors import HarnessError, KnobError
from harness.formats.maps import read_rowmap, write_count_dump
from harness.formats.safe_write import write_text_atomic
from harness.refbox.engine import Engine
from harness.refbox.logprobs import asked_top, token_logprobs
from harness.refbox.model import F32, I64
from harness.refbox.options import ServeConfig, error_message, parse_serve_args

__all__ = ["serve_main"]

_DONE = object()
# SGLang's recorder routes: each changes the record or writes a file, so the token guards them.
_RECORDER_PATHS = tuple(f"/{a}_expert_distribution_record" for a in ("start", "stop", "dump"))


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
        self.rowmap: str | None = config.args.rowmap  # the map file loaded last (boot or reset)

    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(middlewares=[self.guard_admin])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/counters", self.counters)
        app.router.add_get("/admin/knobs", self.get_knobs)
        app.router.add_get("/admin/state", self.get_state)
        app.router.add_post("/admin/knobs", self.post_knobs)
        app.router.add_post("/admin/reset", self.post_reset)
        app.router.add_post("/admin/dump", self.dump)
        for path in _RECORDER_PATHS:
            app.router.add_route("GET", path, self.expert_record)
            app.router.add_route("POST", path, self.expert_record)
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

    @web.middleware
    async def guard_admin(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Every /admin and recorder call: the boot's token when one was given (401 without
        it; each changes what a run measures or writes a file), and JSON only for an /admin
        change (415 otherwise: a web page can post text/plain to localhost, never
        application/json without asking first)."""
        admin = request.path.startswith("/admin/")
        if admin or request.path in _RECORDER_PATHS:
            token = self.config.admin_token
            given = request.headers.get("Authorization", "")
            if token is not None and not hmac.compare_digest(
                given.encode("utf-8", "replace"), f"Bearer {token}".encode()
            ):
                return web.json_response(
                    {"error": "admin calls need this boot's token: Authorization: Bearer TOKEN"},
                    status=401,
                )
            # The recorder keeps SGLang's plain GET/POST; the token alone guards it.
            if admin and request.method != "GET" and request.content_type != "application/json":
                return web.json_response(
                    {"error": "admin changes are JSON: send Content-Type: application/json"},
                    status=415,
                )
        return await handler(request)

    async def get_knobs(self, request: web.Request) -> web.Response:
        """The live knobs."""
        return web.json_response(self._engine().knob_dict())

    async def get_state(self, request: web.Request) -> web.Response:
        """What this boot runs with now: the live knobs and the map file it loaded last, under
        the keys a reset takes them (the harness reads it back after every run)."""
        return web.json_response({**self._engine().knob_dict(), "rowmap": self.rowmap})

    async def post_knobs(self, request: web.Request) -> web.Response:
        """Change live knobs from a JSON object; 400 with the message when a value is invalid."""
        engine = self._engine()
        body = await _json_body(request)
        try:
            knobs = engine.set_knobs(body)
        except KnobError as exc:
            return web.json_response({"error": exc.message}, status=400)
        return web.json_response(knobs)

    async def post_reset(self, request: web.Request) -> web.Response:
        """Back to the boot state, then apply the body's live knobs; 400 with the message when
        the map or a knob is invalid."""
        engine = self._engine()
        body = await _json_body(request)
        try:
            knobs = await asyncio.to_thread(self._reset, engine, body)
        except KnobError as exc:
            return web.json_response({"error": exc.message}, status=400)
        return web.json_response(knobs)

    def _reset(self, engine: Engine, changes: dict[str, Any]) -> dict[str, Any]:
        changes = dict(changes)
        hot = None
        if "rowmap" in changes:
            path = changes.pop("rowmap")
            try:
                hot = [
                    sorted(layer)
                    for layer in read_rowmap(str(path), experts=engine.cfg.experts).hot
                ]
            except HarnessError as exc:
                raise KnobError(f"rowmap: {exc}") from exc
        engine.reset(hot)
        if hot is not None:
            self.rowmap = str(path)
        return engine.set_knobs(changes) if changes else engine.knob_dict()

    async def poll_control(self, path: str, woken: asyncio.Event | None = None) -> None:
        """Apply each new version of the control file and say so in the log; with ``woken``
        (set by the control signal), look only when it is set, never by polling (a signal that
        came before the server was ready is taken once it is)."""
        seen: tuple[int, int] | None = None
        while not self.stop.is_set():
            if woken is not None:
                await woken.wait()
                woken.clear()
                while not self.ready and not self.stop.is_set():
                    await asyncio.sleep(0.05)
            else:
                await asyncio.sleep(0.05)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            if (stat.st_ino, stat.st_mtime_ns) == seen or self.engine is None or not self.ready:
                continue
            seen = (stat.st_ino, stat.st_mtime_ns)
            seq: Any = "?"
            try:
                with open(path, encoding="utf-8") as handle:
                    order = json.load(handle)
                seq = order.get("seq", "?")
                knobs = order.get("knobs") or {}
                if not isinstance(knobs, dict):
                    raise KnobError("knobs: must be an object")
                if order.get("reset"):
                    await asyncio.to_thread(self._reset, self.engine, knobs)
                elif "rowmap" in knobs:
                    raise KnobError('rowmap: a map changes with a reset ("reset": true)')
                else:
                    self.engine.set_knobs(knobs)
            except (OSError, ValueError, AttributeError, KnobError) as exc:
                why = exc.message if isinstance(exc, KnobError) else str(exc)
                print(f"refbox: control {seq} rejected: {why}", file=sys.stderr, flush=True)
                continue
            print(f"refbox: control {seq} applied", file=sys.stderr, flush=True)

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
            inside = os.path.realpath(path).startswith(self.config.dump_dir + os.sep)
            if not inside:
                return web.json_response(
                    {"error": f"path: must be inside {self.config.dump_dir} (--dump-dir)"},
                    status=400,
                )
            try:
                write_count_dump(path, counts, now_s)
            except (HarnessError, OSError) as exc:
                return web.json_response({"error": error_message(exc)}, status=400)
        layers = {str(i): row for i, row in enumerate(counts.tolist())}
        return web.json_response({"layers": layers, "time": now_s})

    async def expert_record(self, request: web.Request) -> web.Response:
        """SGLang's three recorder endpoints, with its plain-text answers; without a recorder
        mode, 400 with the flag to set (SGLang's recorder is a no-op that raises then)."""
        engine = self._engine()
        recorder = engine.recorder
        if recorder is None:
            return web.Response(
                status=400,
                text="Please set --expert-distribution-recorder-mode to use the expert "
                "distribution recorder.\n",
            )
        action = request.path.split("_", 1)[0].lstrip("/")
        if action == "start":
            with engine.lock:
                recorder.start()
            return web.Response(text="Start recording the expert distribution.\n")
        if action == "stop":
            with engine.lock:
                recorder.stop()
            return web.Response(text="Stop recording the expert distribution.\n")
        folder = os.environ.get("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", "/tmp")
        try:
            with engine.lock:
                paths = recorder.dump(folder)
        except (HarnessError, OSError) as exc:
            return web.Response(status=500, text=f"dump failed: {error_message(exc)}\n")
        for path in paths:
            print(f"refbox: Write expert distribution to {path}", file=sys.stderr, flush=True)
        return web.Response(text="Dump expert distribution record.\n")

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
        # Routing comes back only on a whole (non-streamed) response; SGLang's only to a
        # request that asks for it.
        routes: list[I64] | None = None
        args = self.config.args
        asked = args.routed_experts_format == "vllm" or body.get("return_routed_experts") is True
        if args.enable_return_routed_experts and asked and not body.get("stream"):
            routes = []
        try:
            meta.top = asked_top(body, chat=chat)
        except ValueError as exc:
            raise _bad_request(f"{'top_logprobs' if chat else 'logprobs'}: {exc}") from None
        async with self.serial:
            tokens = self._tokens(
                engine, prompt, max_tokens, float(temperature), seed, routes, meta.top is not None
            )
            if body.get("stream"):
                return await self._stream(request, tokens, meta, usage, include_usage)
            return await self._whole(tokens, meta, usage, routes)

    async def _stream(
        self,
        request: web.Request,
        tokens: AsyncIterator[tuple[int, F32 | None]],
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
        async for token, logits in tokens:
            index += 1
            text = decoder.decode(bytes((token,)), final=index == usage["completion_tokens"])
            finish = "length" if index == usage["completion_tokens"] else None
            chunk = meta.chunk(text, finish, first=index == 1)
            if logits is not None and meta.top is not None:
                chunk["choices"][0]["logprobs"] = token_logprobs(
                    token, logits, meta.top, chat=meta.chat, offset=index - 1
                )
            await _send(response, chunk)
            if await self._after_token():
                return response  # shutting down during an injected hang
        if include_usage:
            await _send(response, meta.usage_chunk(usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _whole(
        self,
        tokens: AsyncIterator[tuple[int, F32 | None]],
        meta: _Meta,
        usage: dict[str, int],
        routes: list[I64] | None = None,
    ) -> web.Response:
        out = bytearray()
        async for token, _ in tokens:  # log-probabilities are streamed only
            out.append(token)
            if await self._after_token():
                raise web.HTTPServiceUnavailable(text="shutting down")
        text = out.decode("utf-8", errors="replace")
        whole = meta.whole(text, usage)
        if routes is not None and self.config.args.routed_experts_format == "sglang":
            whole["sglext"] = {"routed_experts": routed_experts_int32(routes)}
        elif routes is not None:
            whole["choices"][0]["routed_experts"] = routed_experts_npy(routes)
        return web.json_response(whole)

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
        self,
        engine: Engine,
        prompt: bytes,
        max_tokens: int,
        temperature: float,
        seed: int,
        routes: list[I64] | None = None,
        with_logits: bool = False,
    ) -> AsyncIterator[tuple[int, F32 | None]]:
        """Run the engine's generator in a worker thread and hand its tokens to the loop, each
        with the logits it was picked from when ``with_logits``."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        cancel = threading.Event()

        def work() -> None:
            try:
                picked: list[F32] | None = [] if with_logits else None
                generated = engine.generate(prompt, max_tokens, temperature, seed, routes, picked)
                for token in generated:
                    item = (token, picked[-1] if picked else None)
                    loop.call_soon_threadsafe(queue.put_nowait, item)
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
                assert isinstance(item, tuple)
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
            write_text_atomic(Path(self.config.counters_path), json.dumps(payload, indent=1))


class _Meta:
    """Shapes the OpenAI response objects of one request."""

    def __init__(self, id: str, created: int, model: str, chat: bool) -> None:
        self.id, self.created, self.model, self.chat = id, created, model, chat
        self.top: int | None = None  # top log-probabilities asked for per token

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


def routed_experts_npy(routes: list[I64]) -> str:
    """Routing as vLLM returns it (``--enable-return-routed-experts``): base64 of ``.npy`` bytes,
    shape ``[prompt + completion tokens - 1, layers, top_k]``, the narrowest of uint8, uint16
    and int32 that holds the ids."""
    array = np.stack(routes)
    dtype = np.uint8 if array.max() < 2**8 else np.uint16 if array.max() < 2**16 else np.int32
    buffer = io.BytesIO()
    np.save(buffer, array.astype(dtype), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def routed_experts_int32(routes: list[I64]) -> str:
    """Routing as SGLang returns it (``sglext.routed_experts``): base64 of the same rows as flat
    little-endian int32, no shape."""
    return base64.b64encode(np.stack(routes).astype("<i4").tobytes()).decode("ascii")


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
    control = config.args.control
    woken: asyncio.Event | None = None
    if control and config.args.control_signal:
        woken = asyncio.Event()
        loop.add_signal_handler(getattr(signal, "SIG" + config.args.control_signal), woken.set)
    poller = asyncio.create_task(server.poll_control(control, woken)) if control else None
    await server.stop.wait()
    if not loader.done():
        loader.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await loader
    if poller is not None:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
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
