"""Small servers started on an SSH test box, on its 127.0.0.1, for the tunnel and driver tests.

``streaming``: an aiohttp server whose ``GET /s`` streams 20 SSE lines 10 ms apart and whose
``POST /v1/completions`` streams a completion as the driver expects; ``POST /admin/knobs``
keeps each live-knob body it gets, ``GET /admin/seen`` lists them. ``stalling``: a socket that
listens and never answers, as a hung runtime does. Each runs in its own process group on the
box, started with :meth:`Box.start_background` and stopped by that group.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from harness.boxes.ssh import SshBox

STREAMING = """
import asyncio, json, sys
from aiohttp import web

async def lines(request):
    response = web.StreamResponse()
    await response.prepare(request)
    for i in range(20):
        await response.write(f"data: {i}\\n\\n".encode())
        await asyncio.sleep(0.01)
    return response

async def completion(request):
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    n = int(body.get("max_tokens", 4))
    for i in range(n):
        chunk = {"choices": [{"text": f"t{i} "}]}
        await response.write(f"data: {json.dumps(chunk)}\\n\\n".encode())
        await asyncio.sleep(0.005)
    usage = {"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 3}}
    await response.write(f"data: {json.dumps(usage)}\\n\\ndata: [DONE]\\n\\n".encode())
    return response

async def health(request):
    return web.Response(text="ok")

SEEN = []

async def knobs(request):
    SEEN.append(await request.json())
    return web.json_response({"ok": True})

async def seen(request):
    return web.json_response(SEEN)

app = web.Application()
app.router.add_get("/s", lines)
app.router.add_get("/health", health)
app.router.add_post("/v1/completions", completion)
app.router.add_post("/admin/knobs", knobs)
app.router.add_get("/admin/seen", seen)
print("listening", flush=True)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""

STALLING = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
print("listening", flush=True)
time.sleep(600)
"""


@dataclass(frozen=True)
class BoxServer:
    """A server running on the box: its port and process group."""

    port: int
    pgid: int


@contextlib.contextmanager
def box_server(
    box: SshBox, snippet: str, workdir: str, port: int | None = None
) -> Iterator[BoxServer]:
    """Start ``snippet`` on the box with this interpreter on ``port`` (default: a free one);
    stop its group after."""
    port = port or box.free_port()
    log = f"{workdir}/server-{port}.log"
    box.mkdirs(workdir)
    pgid = box.start_background([sys.executable, "-c", snippet, str(port)], {}, None, log)
    try:
        deadline = time.monotonic() + 30
        while "listening" not in box.read_text(log):
            assert box.group_alive(pgid), box.read_text(log)
            assert time.monotonic() < deadline, f"server did not start: {box.read_text(log)}"
            time.sleep(0.1)
        yield BoxServer(port, pgid)
    finally:
        box.signal_group(pgid, "KILL")
        box.wait_group_gone(pgid, 10)
