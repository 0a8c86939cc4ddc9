"""``harness bench drive``: how faithfully the driver times a stream whose schedule is known.

A loopback aiohttp server, in its own process so it never shares the client's event loop, answers
``/v1/completions`` with a stream on an exact schedule: the first token ``ttft_ms`` after the
request arrives, then one chunk every ``tpot_ms``, each sent at an absolute deadline computed from
the request's arrival (so a late wake-up never pushes the later tokens back), then a ``usage``
chunk and ``[DONE]``. The server records when it handed the first and the last token to the socket;
that is the true TPOT each client measurement is compared with, and no client can read a token
before its stamp.

At C1, C16 and C64 the same requests are timed by our driver (:func:`harness.drive.client.drive`)
and by a plain aiohttp loop written the way vLLM's benchmark client times a stream (a session per
request, ``async for`` over ``response.content``, ``perf_counter`` when a chunk with choices has
been parsed). Arms alternate A B B A against the same server, so load on the machine hits both.
Figures: median and p95 of ``|TPOT_measured - TPOT_true| / TPOT_true`` in %, and our median
error over the plain loop's.

Run the server alone with ``python -m harness.benchmarks.drive --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from harness.benchmarks import Figure
from harness.drive.client import DriveSpec, PhasePlan, WorkItem, run_drive
from harness.errors import InfrastructureError

__all__ = [
    "DEFAULT_SCHEDULE",
    "Schedule",
    "ScheduleServer",
    "StreamTiming",
    "TrueTiming",
    "measure_driver",
    "measure_plain_loop",
    "run_bench",
    "tpot_errors_pct",
]


@dataclass(frozen=True)
class Schedule:
    """The stream every request gets: ``tokens`` chunks, the first after ``ttft_ms``."""

    ttft_ms: float
    tpot_ms: float
    tokens: int


# 20 ms per token is a realistic decode pace (50 tok/s) and leaves the 2-core box headroom at
# C64: 64 streams x 50 chunks/s = 3,200 chunks/s for each of the two processes, well under what
# one aiohttp loop parses. 64 tokens make the decode span 63 x 20 ms = 1.26 s, so 1 % of TPOT is
# 12.6 ms of lateness at the last token: far above the ~1 ms timer granularity of the server's
# sleeps, so the figures measure the client, not the clock. The TTFT (50 ms) only has to be long
# enough that the first token is clearly apart from connection set-up.
DEFAULT_SCHEDULE = Schedule(ttft_ms=50.0, tpot_ms=20.0, tokens=64)
_LEVELS = (1, 16, 64)
_TARGET_PCT = {1: 1.0, 16: 1.0, 64: 3.0}
# "No worse than the plain loop", allowing for noise: both arms' errors are a few hundredths of a
# percent, where one scheduler hiccup doubles a ratio, so ours may exceed the plain loop's median
# by a tenth of the C1 target before it counts as worse.
_NO_WORSE_SLACK_PCT = 0.1
_READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TrueTiming:
    """When the server put the first and last token of one request on the wire (its clock)."""

    first_s: float  # since the request arrived
    last_s: float
    tokens: int
    late_max_ms: float  # worst lateness of a token vs its deadline

    @property
    def tpot_s(self) -> float:
        """The TPOT the server actually delivered."""
        return (self.last_s - self.first_s) / (self.tokens - 1)


@dataclass(frozen=True)
class StreamTiming:
    """What a client measured for one request, in seconds from its own t0."""

    ttft_s: float
    e2el_s: float
    tokens: int

    @property
    def tpot_s(self) -> float:
        """TPOT = (E2EL - TTFT) / (n - 1), as :mod:`harness.analyze.metrics` computes it."""
        return (self.e2el_s - self.ttft_s) / (self.tokens - 1)


# ---------------------------------------------------------------------------------------------
# The schedule server (runs in a child process).


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _app(schedule: Schedule) -> web.Application:
    truth: dict[str, dict[str, float]] = {}
    token = _event(
        {
            "id": "cmpl-schedule",
            "object": "text_completion",
            "model": "schedule",
            "choices": [{"index": 0, "text": " tok", "finish_reason": None}],
        }
    )

    async def completions(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        body = await request.json()
        tokens = int(body.get("max_tokens") or schedule.tokens)
        key = str(body.get("prompt", ""))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        first_s = last_s = late_max_s = 0.0
        for k in range(tokens):
            # Absolute deadlines from the arrival: a late wake-up delays this token only.
            deadline = arrived + (schedule.ttft_ms + k * schedule.tpot_ms) / 1e3
            # The loop may wake a clock tick early: sleep again until the deadline has passed.
            while (delay := deadline - loop.time()) > 0:
                await asyncio.sleep(delay)
            # Stamped as the chunk is handed to the socket, not after: the write reaches the
            # kernel before it returns, so a client may read the token before a later stamp.
            sent = loop.time()
            await response.write(token)  # small writes go to the socket at once
            late_max_s = max(late_max_s, sent - deadline)
            if k == 0:
                first_s = sent - arrived
            last_s = sent - arrived
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        await response.write(
            _event(
                {"id": "cmpl-schedule", "object": "text_completion", "choices": [], "usage": usage}
            )
        )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        truth[key] = {
            "first_s": first_s,
            "last_s": last_s,
            "tokens": tokens,
            "late_max_ms": late_max_s * 1e3,
        }
        return response

    async def get_truth(request: web.Request) -> web.Response:
        return web.json_response(truth)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/truth", get_truth)
    app.router.add_get("/health", health)
    return app


async def _serve(host: str, port: int, schedule: Schedule) -> None:
    runner = web.AppRunner(_app(schedule), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The parent reads this line to learn the port.
    sys.stdout.write(f"schedule server listening on http://{host}:{bound}\n")
    sys.stdout.flush()
    await stop.wait()
    await runner.cleanup()


def serve_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the schedule server process."""
    parser = argparse.ArgumentParser(prog="python -m harness.benchmarks.drive")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=DEFAULT_SCHEDULE.ttft_ms)
    parser.add_argument("--tpot-ms", type=float, default=DEFAULT_SCHEDULE.tpot_ms)
    parser.add_argument("--tokens", type=int, default=DEFAULT_SCHEDULE.tokens)
    args = parser.parse_args(argv)
    schedule = Schedule(args.ttft_ms, args.tpot_ms, args.tokens)
    asyncio.run(_serve(args.host, args.port, schedule))
    return 0


class ScheduleServer:
    """The schedule server as a child process; use as a context manager."""

    def __init__(self, schedule: Schedule = DEFAULT_SCHEDULE) -> None:
        self.schedule = schedule
        self.base_url = ""
        self._process: subprocess.Popen[str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()

    def start(self) -> None:
        """Start the process and wait for its ``listening on`` line."""
        s = self.schedule
        argv = [sys.executable, "-m", "harness.benchmarks.drive"]
        argv += [
            "--ttft-ms",
            str(s.ttft_ms),
            "--tpot-ms",
            str(s.tpot_ms),
            "--tokens",
            str(s.tokens),
        ]
        self._process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], _READY_TIMEOUT_S)
        line = self._process.stdout.readline() if ready else ""
        if "listening on " not in line:
            self.stop()
            raise InfrastructureError(
                f"the schedule server did not start within {_READY_TIMEOUT_S:g} s: "
                f"{self._stderr_text() or line or 'no output'}"
            )
        self.base_url = line.split("listening on ", 1)[1].strip()

    def _stderr_text(self) -> str:
        with contextlib.suppress(ValueError, OSError):
            self._stderr.seek(0)
            return self._stderr.read()[-2000:]
        return ""

    def truth(self) -> dict[str, TrueTiming]:
        """What the server actually sent, per prompt."""
        return asyncio.run(_get_truth(self.base_url))

    def stop(self) -> None:
        """Terminate the process (SIGKILL after 10 s) and close its pipes."""
        process = self._process
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
            self._process = None
        self._stderr.close()

    def __enter__(self) -> ScheduleServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _get_truth(base_url: str) -> dict[str, TrueTiming]:
    async with aiohttp.ClientSession() as session, session.get(base_url + "/truth") as response:
        raw: dict[str, dict[str, float]] = await response.json()
    return {
        key: TrueTiming(v["first_s"], v["last_s"], int(v["tokens"]), v["late_max_ms"])
        for key, v in raw.items()
    }


# ---------------------------------------------------------------------------------------------
# The two clients.


def measure_driver(
    base_url: str, keys: Sequence[str], concurrency: int, tokens: int
) -> dict[str, StreamTiming]:
    """Time one request per key (the key is the prompt) with our driver."""
    spec = DriveSpec(
        base_url=base_url, flavour="completions", model="schedule", concurrency=concurrency
    )
    items = tuple(
        WorkItem(
            prompt_id=k, domain="bench", phase="bench", phase_index=0, max_tokens=tokens, prompt=k
        )
        for k in keys
    )
    out: dict[str, StreamTiming] = {}
    for result in run_drive(spec, [PhasePlan("bench", 0, items)]):
        if not result.ok or result.ttft_s is None or result.e2el_s is None:
            raise InfrastructureError(f"driver request {result.prompt_id} failed: {result.error}")
        out[result.prompt_id] = StreamTiming(
            result.ttft_s, result.e2el_s, int(result.completion_tokens or 0)
        )
    return out


async def _plain_request(
    url: str, key: str, tokens: int, limiter: asyncio.Semaphore
) -> tuple[str, StreamTiming]:
    """One request timed the way vLLM's benchmark client does it (written from its description)."""
    body = {"model": "schedule", "prompt": key, "max_tokens": tokens, "stream": True}
    async with limiter, aiohttp.ClientSession() as session:
        start = time.perf_counter()
        latest = start
        ttft_s: float | None = None
        count = 0
        async with session.post(url, json=body) as response:
            async for line in response.content:
                line = line.strip()
                if not line:
                    continue
                text = line.decode("utf-8").removeprefix("data: ")
                if text == "[DONE]":
                    continue
                data = json.loads(text)
                if data.get("choices"):
                    stamp = time.perf_counter()  # after the parse, as vLLM's client does
                    if ttft_s is None:
                        ttft_s = stamp - start
                    latest = stamp
                elif usage := data.get("usage"):
                    count = int(usage.get("completion_tokens") or 0)
    if ttft_s is None:
        raise InfrastructureError(f"plain-loop request {key}: the stream had no tokens")
    return key, StreamTiming(ttft_s, latest - start, count)


def measure_plain_loop(
    base_url: str, keys: Sequence[str], concurrency: int, tokens: int
) -> dict[str, StreamTiming]:
    """Time one request per key with the plain aiohttp loop (the baseline)."""

    async def run_all() -> list[tuple[str, StreamTiming]]:
        limiter = asyncio.Semaphore(concurrency)
        url = base_url + "/v1/completions"
        return await asyncio.gather(*(_plain_request(url, k, tokens, limiter) for k in keys))

    return dict(asyncio.run(run_all()))


# ---------------------------------------------------------------------------------------------
# Measurement.


def tpot_errors_pct(measured: dict[str, StreamTiming], truth: dict[str, TrueTiming]) -> np.ndarray:
    """``|TPOT_measured - TPOT_true| / TPOT_true`` in %, one per measured request."""
    errors = []
    for key, timing in measured.items():
        true = truth.get(key)
        if true is None or true.tokens != timing.tokens or true.tokens < 2:
            raise InfrastructureError(
                f"request {key}: the server's record ({true}) does not match the client's "
                f"({timing.tokens} tokens)"
            )
        errors.append(abs(timing.tpot_s - true.tpot_s) / true.tpot_s * 100.0)
    return np.asarray(errors, dtype=float)


@dataclass(frozen=True)
class _Level:
    concurrency: int
    ours_pct: np.ndarray
    plain_pct: np.ndarray
    server_dev_pct: np.ndarray  # the server's true TPOT vs the nominal one
    server_late_ms: float


def _measure_level(
    server: ScheduleServer, concurrency: int, per_slot: int, slots: Sequence[str]
) -> _Level:
    tokens = server.schedule.tokens
    measured: dict[str, dict[str, StreamTiming]] = {"ours": {}, "plain": {}}
    for slot, arm in enumerate(slots):
        keys = [f"c{concurrency}-s{slot}-{arm}-{i}" for i in range(per_slot)]
        measure = measure_driver if arm == "ours" else measure_plain_loop
        measured[arm].update(measure(server.base_url, keys, concurrency, tokens))
    truth = server.truth()
    used = [truth[k] for arm in measured.values() for k in arm if k in truth]
    nominal_s = server.schedule.tpot_ms / 1e3
    return _Level(
        concurrency=concurrency,
        ours_pct=tpot_errors_pct(measured["ours"], truth),
        plain_pct=tpot_errors_pct(measured["plain"], truth),
        server_dev_pct=np.asarray([abs(t.tpot_s - nominal_s) / nominal_s * 100 for t in used]),
        server_late_ms=max(t.late_max_ms for t in used),
    )


def _figures(level: _Level) -> list[Figure]:
    c = level.concurrency
    target = _TARGET_PCT[c]
    figures = []
    for label, q in (("median", 50.0), ("p95", 95.0)):
        ours = float(np.percentile(level.ours_pct, q))
        plain = float(np.percentile(level.plain_pct, q))
        figures.append(
            Figure(
                name=f"TPOT error at C{c}, {label} (n={len(level.ours_pct)})",
                value=ours,
                unit="%",
                baseline=f"plain aiohttp loop {plain:.3f} %",
                target=f"< {target:g} %",
                passed=ours < target,
            )
        )
    # The ratio compares medians: a p95 of a few dozen requests is one scheduler hiccup on a
    # shared box, and flipped between 0.1x and 2.7x across repeated runs; medians held steady.
    ours_median = float(np.median(level.ours_pct))
    plain_median = float(np.median(level.plain_pct))
    figures.append(
        Figure(
            name=f"TPOT error at C{c}, driver / plain loop (median)",
            value=ours_median / plain_median if plain_median > 0 else float("inf"),
            unit="x",
            baseline=f"driver {ours_median:.3f} %, plain loop {plain_median:.3f} %",
            target=f"no worse than the plain loop (+{_NO_WORSE_SLACK_PCT:g} pt noise)",
            passed=ours_median <= plain_median + _NO_WORSE_SLACK_PCT,
        )
    )
    figures.append(
        Figure(
            name=f"server schedule deviation at C{c}, p95 (context)",
            value=float(np.percentile(level.server_dev_pct, 95)),
            unit="%",
            baseline=f"true vs nominal TPOT; worst token {level.server_late_ms:.1f} ms late",
        )
    )
    return figures


def run_bench(quick: bool = False) -> list[Figure]:
    """TPOT error of our driver and of a plain aiohttp loop at C1, C16 and C64.

    Full: arms A B B A with 4 requests per C1 slot and two waves per C16/C64 slot (8, 64 and
    256 requests per arm). ``quick``: A B with one wave per slot (1, 16 and 64 per arm).
    """
    slots = ("ours", "plain") if quick else ("ours", "plain", "plain", "ours")
    figures: list[Figure] = []
    with ScheduleServer(DEFAULT_SCHEDULE) as server:
        for c in _LEVELS:
            per_slot = c if quick else (4 if c == 1 else 2 * c)
            figures.extend(_figures(_measure_level(server, c, per_slot, slots)))
    return figures


if __name__ == "__main__":
    sys.exit(serve_main())
