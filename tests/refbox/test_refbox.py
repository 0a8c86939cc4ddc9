"""The reference runtime as a real process: HTTP API, knobs, files, faults, startup errors."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.formats.maps import fit_rowmap, write_rowmap
from harness.formats.ring_read import read_ring
from harness.refbox.model import DOMAIN_SAMPLES
from harness.refbox.options import parse_serve_args

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--layers", "3", "--experts", "16", "--top-k", "2", "--d-model", "16", "--d-ff",
         "16", "--hot-slots", "12", "--expert-bytes", "0"]  # fmt: skip


class Box:
    """One refbox process on a free port; stderr is collected in the background."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.refbox", "serve", "--port", "0", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=full_env,
        )
        self.lines: list[str] = []
        self.port: int | None = None
        self.bound_port: int | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("refbox: bound http://"):
                self.bound_port = int(line.split(";")[0].rsplit(":", 1)[1])
            if "listening on http://" in line:
                self.port = int(line.rsplit(":", 1)[1])
                self._ready.set()

    def wait_ready(self, timeout_s: float = 30.0) -> int:
        """Wait for the readiness line; returns the port."""
        assert self._ready.wait(timeout_s), self.lines
        assert self.port is not None
        return self.port

    def url(self, path: str) -> str:
        """Full URL of a path on this box."""
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _post(
    url: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": content_type, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _stream(url: str, body: dict[str, Any]) -> list[str]:
    """The raw SSE ``data:`` payloads of a streaming request, checking the framing."""
    request = urllib.request.Request(
        url, data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""  # every event ends with a blank line
    assert all(e.startswith("data: ") for e in events[:-1])
    return [e[len("data: ") :] for e in events[:-1]]


def _completion_text(payloads: list[str]) -> tuple[str, dict[str, int], int]:
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    usage = chunks[-1]["usage"]
    tokens = chunks[:-1]
    text = "".join(c["choices"][0].get("text", "") for c in tokens)
    return text, usage, len(tokens)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Box, Path]]:
    """A small refbox with ring, route trace and counters files."""
    tmp = tmp_path_factory.mktemp("box")
    b = Box(*SMALL, "--ring", str(tmp / "ring"), "--ring-capacity", "4096",
            "--route-trace", str(tmp / "trace.jsonl"), "--counters", str(tmp / "counters.json"),
            "--drain-every", "4", "--promote-threshold", "0.5", "--cold-dir", str(tmp),
            "--dump-dir", str(tmp))  # fmt: skip
    b.wait_ready()
    yield b, tmp
    b.stop()


def test_stream_usage_and_determinism_across_boots(box: tuple[Box, Path]) -> None:
    """SSE framing, one chunk per token, usage, and the same tokens on a second boot."""
    b, _ = box
    body = {"prompt": "def f(x):\n    return", "max_tokens": 20,
            "stream_options": {"include_usage": True}}  # fmt: skip
    text, usage, n = _completion_text(_stream(b.url("/v1/completions"), body))
    assert n == 20 == usage["completion_tokens"]
    assert usage["prompt_tokens"] == len(body["prompt"]) + 1  # + BOS
    assert usage["total_tokens"] == usage["prompt_tokens"] + 20
    again, _, _ = _completion_text(_stream(b.url("/v1/completions"), body))
    assert again == text
    other = Box(*SMALL, "--policy", "frozen", "--hot-slots", "4")  # other tiers, same math
    try:
        other.wait_ready()
        third, _, _ = _completion_text(_stream(other.url("/v1/completions"), body))
    finally:
        assert other.stop() == 0
    assert third == text
    status, whole = _post(b.url("/v1/completions"), {**body, "stream": False})
    assert status == 200 and whole["choices"][0]["text"] == text
    assert whole["usage"]["completion_tokens"] == 20


def test_chat_streaming_and_whole(box: tuple[Box, Path]) -> None:
    """Chat: role in the first delta, valid UTF-8 pieces, same text streamed or not."""
    b, _ = box
    body = {"messages": [{"role": "user", "content": DOMAIN_SAMPLES["japanese"][:40]}],
            "max_tokens": 15, "stream_options": {"include_usage": True}}  # fmt: skip
    payloads = _stream(b.url("/v1/chat/completions"), body)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 15 == len(chunks) - 1
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks[:-1])
    status, whole = _post(b.url("/v1/chat/completions"), body)
    assert status == 200 and whole["choices"][0]["message"]["content"] == text
    assert _get(b.url("/v1/models"))[1]["data"][0]["id"] == "refbox"
    assert _get(b.url("/health"))[0] == 200


def test_counters_knobs_and_dump(box: tuple[Box, Path]) -> None:
    """Counters move with a request; live knobs validate; the dump has the lane's format."""
    b, tmp = box
    _, before = _get(b.url("/counters"))
    _post(b.url("/v1/completions"), {"prompt": "abc", "max_tokens": 5})
    _, after = _get(b.url("/counters"))
    assert after["requests"] == before["requests"] + 1
    assert after["steps"] == before["steps"] + 5  # prefill + 4 decode steps
    assert after["lookups"] - before["lookups"] == (4 + 4) * 3 * 2
    assert after["hits"] + after["misses"] == after["lookups"]
    status, knobs = _post(b.url("/admin/knobs"), {"swaps_per_layer": 1, "phase": 7})
    assert status == 200 and knobs["swaps_per_layer"] == 1 and knobs["phase"] == 7
    for bad in ({"swaps_per_layer": -1}, {"policy": "eager"}, {"drain_every": 0},
                {"nonsense": 1}):  # fmt: skip
        status, error = _post(b.url("/admin/knobs"), bad)
        assert status == 400, bad
        assert next(iter(bad)) in error["error"]
    assert _get(b.url("/admin/knobs"))[1] == knobs
    status, dump = _post(b.url("/admin/dump"), {"path": str(tmp / "dump.json")})
    assert status == 200 and sorted(dump["layers"]) == ["0", "1", "2"]
    assert json.loads((tmp / "dump.json").read_text())["layers"] == dump["layers"]
    assert sum(dump["layers"]["0"]) > 0


def test_ring_and_trace_after_shutdown(tmp_path: Path) -> None:
    """SIGTERM flushes: the ring reads back with zero loss, one record and trace line per step."""
    b = Box(*SMALL, "--ring", str(tmp_path / "ring"), "--route-trace", str(tmp_path / "t.jsonl"),
            "--counters", str(tmp_path / "c.json"), "--drain-every", "2",
            "--promote-threshold", "0.5")  # fmt: skip
    b.wait_ready()
    _post(b.url("/v1/completions"), {"prompt": "x = 1\n", "max_tokens": 12})
    _stream(b.url("/v1/completions"), {"prompt": '{"a": 2}', "max_tokens": 6})
    assert b.stop() == 0
    counters = json.loads((tmp_path / "c.json").read_text())
    ring = read_ring(tmp_path / "ring")
    assert ring.lost == 0 and len(ring.frame) == counters["steps"] == 2 + 11 + 5
    assert int(ring.frame["tokens"].sum()) == counters["tokens"]
    assert int(ring.frame["cold_lookups"].sum()) == counters["cold_lookups"]
    assert ring.geometry is not None and ring.geometry.hot_slots == 12
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["hot_slots"] == 12
    assert set(lines[0]["knobs"]) >= {"policy", "drain_every", "swaps_per_layer"}
    steps = [x for x in lines if x["kind"] == "step"]
    assert [x["step"] for x in steps] == list(range(counters["steps"]))
    assert [x["prefill"] for x in steps].count(True) == 2
    assert len([x for x in lines if x["kind"] == "swap"]) == counters["swaps"]


@pytest.mark.parametrize(
    ("args", "env", "flag"),
    [
        (["--policy", "eager"], {}, "--policy"),
        (["--swaps-per-layer", "-1"], {}, "--swaps-per-layer"),
        (["--hot-slots", "17"], {}, "--hot-slots"),
        ([], {"REFBOX_POLICY": "eager"}, "--policy"),
        ([], {"REFBOX_DRAIN_EVERY": "soon"}, "--drain-every"),
        (["--rowmap", "/nonexistent/map.json"], {}, "--rowmap"),
        (["--cache-records", "8", "--hotlist-priority", "sometimes"], {}, "--hotlist-priority"),
        (["--top-k", "20"], {}, "--top-k"),
        (["--drain-every", "x"], {}, "--drain-every"),
        (["--carry-over-pct", "3"], {}, "--carry-over-pct"),
        (["--heat-slowdown-pct", "5"], {}, "--heat-slowdown-pct"),
        ([], {"REFBOX_HEAT_SOURCE": "1"}, "--heat-source"),
        (["--heat-source", "1.5", "--heat-state", "/nonexistent/heat.json"], {}, "--heat-source"),
        (["--heat-half-life-requests", "0"], {}, "--heat-half-life-requests"),
        (["--heat-state", "/nonexistent/heat.json"], {}, "--heat-state"),
    ],
)
def test_invalid_knobs_fail_startup(args: list[str], env: dict[str, str], flag: str) -> None:
    """Exit 2 with one line naming the flag, before binding (no readiness line)."""
    result = subprocess.run(
        [sys.executable, "-m", "harness.refbox", "serve", "--port", "0", *SMALL, *args],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"refbox: {flag}: "), lines


def test_flag_wins_over_env_and_map_fitted_on_domain_misses_less(tmp_path: Path) -> None:
    """Env sets knobs (flags win); a rowmap fitted on a domain beats the stale default on it."""
    env = {"REFBOX_POLICY": "frozen", "REFBOX_HOT_SLOTS": "99"}  # 99 is invalid: the flag wins
    cells: dict[str, float] = {}
    fit = Box(*SMALL, "--hot-slots", "16", env=env)
    try:
        fit.wait_ready()
        assert _get(fit.url("/admin/knobs"))[1]["policy"] == "frozen"
        _post(fit.url("/v1/completions"), {"prompt": DOMAIN_SAMPLES["python"][:300],
                                           "max_tokens": 150})  # fmt: skip
        _, dump = _post(fit.url("/admin/dump"), {"counts": "cumulative"})
    finally:
        fit.stop()
    counts = np.array([dump["layers"][str(i)] for i in range(3)])
    write_rowmap(tmp_path / "map.json", fit_rowmap(counts, 8), 16)
    held_out = {"prompt": DOMAIN_SAMPLES["python"][300:600], "max_tokens": 100}
    for label, extra in (("stale", []), ("fitted", ["--rowmap", str(tmp_path / "map.json")])):
        b = Box(*SMALL, "--hot-slots", "8", *extra, env=env)
        try:
            b.wait_ready()
            _, c0 = _get(b.url("/counters"))
            _post(b.url("/v1/completions"), held_out)
            _, c1 = _get(b.url("/counters"))
        finally:
            b.stop()
        cells[label] = (c1["cold_lookups"] - c0["cold_lookups"]) / (c1["lookups"] - c0["lookups"])
    assert cells["fitted"] < cells["stale"], cells


def test_fail_after_tokens_exits_mid_stream() -> None:
    """The process dies with exit code 1 after the N-th token; the stream is cut short."""
    b = Box(*SMALL, "--fail-after-tokens", "3")
    b.wait_ready()
    with pytest.raises((http.client.HTTPException, OSError, AssertionError)):
        payloads = _stream(b.url("/v1/completions"), {"prompt": "hi", "max_tokens": 10})
        assert "[DONE]" in payloads
    assert b.proc.wait(timeout=30) == 1
    assert b.stop() == 1
    assert any("--fail-after-tokens 3 reached" in line for line in b.lines)


def test_never_ready_keeps_health_503() -> None:
    """--never-ready keeps /health at 503 and prints no readiness line; SIGTERM exits 0."""
    b = Box(*SMALL, "--never-ready")
    try:
        deadline = time.monotonic() + 30
        while b.bound_port is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.bound_port is not None, b.lines
        time.sleep(1.5)  # long enough for the small model to have loaded
        assert _get(f"http://127.0.0.1:{b.bound_port}/health")[0] == 503
        assert not any("listening on" in line for line in b.lines)
    finally:
        assert b.stop() == 0


def test_carry_over_knob_slows_a_boot_only_after_another_tag(tmp_path: Path) -> None:
    """The carry-over knob: the boot before on the box (the state file) decides the slowdown."""
    state = tmp_path / "last-boot"

    def boot(tag: str, pct: str = "30") -> float:
        config = parse_serve_args(
            [*SMALL, "--carry-over-pct", pct, "--carry-over-tag", tag],
            {"REFBOX_CARRY_OVER_STATE": str(state)},
        )
        assert not isinstance(config, int)
        return config.options.carry_over_pct

    assert boot("control") == 0.0  # the first boot on the box follows nothing
    assert state.read_text() == "control"
    assert boot("control") == 0.0  # after its own kind
    assert boot("candidate", pct="0") == 0.0  # a candidate marks the box without slowing
    assert boot("control") == 30.0  # a control right after a candidate carries it over


def test_carry_over_a_boot_leaves_slows_the_next_boot_whatever_its_tag(tmp_path: Path) -> None:
    """Heat: --carry-over-leaves-pct slows the next boot on the box, its own cell included."""
    state = tmp_path / "last-boot"

    def boot(tag: str, leaves: str = "0") -> float:
        config = parse_serve_args(
            [*SMALL, "--carry-over-leaves-pct", leaves, "--carry-over-tag", tag],
            {"REFBOX_CARRY_OVER_STATE": str(state)},
        )
        assert not isinstance(config, int)
        return config.options.carry_over_pct

    assert boot("candidate", leaves="40") == 0.0  # the first boot follows nothing
    assert boot("candidate", leaves="40") == 40.0  # after itself: heat it left
    assert boot("control") == 40.0  # after the candidate, whatever the cell
    assert boot("control") == 0.0  # after a control that leaves nothing
    state.write_text("something else entirely\nnot a number")
    assert boot("control") == 0.0  # a state file not of ours leaves nothing


def test_box_heat_rises_with_a_hot_cells_traffic_slows_decode_and_cools_with_a_cool_ones(
    tmp_path: Path,
) -> None:
    """--heat-*: three boots share a heat file. A source-0 boot on a cool box leaves it at 0; a
    source-1 boot heats it towards 1 request by request (exactly S <- 1 + (S - 1) * 2^(-1/H)),
    its decode steps slowing by P% x S; a source-0 boot after it starts hot and cools it again."""
    state = tmp_path / "heat.json"
    requests, tokens = 6, 16

    def boot(name: str, source: str) -> tuple[list[float], np.ndarray]:
        """The heat after each request, and each request's decode step durations (ns)."""
        ring = tmp_path / f"{name}.ring"
        env = {"REFBOX_HEAT_STATE": str(state), "REFBOX_HEAT_HALF_LIFE_REQUESTS": "2"}
        b = Box(*SMALL, "--ring", str(ring), "--heat-source", source,
                "--heat-slowdown-pct", "900", env=env)  # fmt: skip
        heats = []
        try:
            b.wait_ready()
            for _ in range(requests):
                body = {"prompt": "x = 1\n", "max_tokens": tokens}
                status, _ = _post(b.url("/v1/completions"), body)
                assert status == 200
                heats.append(json.loads(state.read_text())["heat"])  # written before the reply
        finally:
            assert b.stop() == 0
        frame = read_ring(ring).frame
        decode = frame["dur_ns"][frame["tokens"] == 1].to_numpy(dtype=np.float64)
        return heats, decode.reshape(requests, tokens - 1)

    factor = 2.0 ** (-1 / 2)
    cool, cool_steps = boot("cool", "0")
    assert cool == [0.0] * requests  # no file: a cool box, and source-0 traffic keeps it cool
    hot, hot_steps = boot("hot", "1")
    assert hot == pytest.approx([1 - factor ** (k + 1) for k in range(requests)], rel=1e-12)
    assert all(a < b for a, b in itertools.pairwise(hot)) and hot[-1] == pytest.approx(0.875)
    after, after_steps = boot("after", "0")
    assert after == pytest.approx([hot[-1] * factor ** (k + 1) for k in range(requests)], rel=1e-12)
    assert all(a > b for a, b in itertools.pairwise(after)) and after[-1] < 0.125
    assert json.loads(state.read_text())["requests"] == 3 * requests
    # Real extra work per decode step: x(1 + 9 S). The hot boot's last three requests ran at S
    # 0.65..0.82 (6.8-8.4x the cool boot's steps; 3.6-4.3x at 400%, measured as such, or more on
    # a loaded machine), the first request after it at S 0.875 (8.9x); 2x leaves room for a busy
    # machine (a median of 45 or 15 steps; the work is proportional to each step's own time, so
    # a slower machine slows both sides).
    baseline = float(np.median(cool_steps))
    assert float(np.median(hot_steps[-3:])) > 2 * baseline, (hot_steps, cool_steps)
    assert float(np.median(after_steps[0])) > 2 * baseline, (after_steps, cool_steps)
    assert float(np.median(hot_steps[0])) < float(np.median(hot_steps[-3:]))  # S was 0 there


def test_the_admin_surface_takes_only_the_boots_token_json_and_dumps_into_its_folder(
    tmp_path: Path,
) -> None:
    # Any local process could reset the runtime to another map mid-run (the candidate then
    # measured as the control), a web page could post text/plain to it, and /admin/dump wrote
    # a file at any path. Now: the boot's token, JSON only, dumps inside --dump-dir.
    token = "0123456789abcdef0123456789abcdef"
    rowmap = tmp_path / "map.json"
    hot = {"hot": list(range(4, 16)), "cold": list(range(4))}  # SMALL's 12 hot slots
    rowmap.write_text(json.dumps({"layers": {str(i): hot for i in range(3)}}))
    b = Box(*SMALL, "--dump-dir", str(tmp_path), env={"REFBOX_ADMIN_TOKEN": token})
    try:
        b.wait_ready()
        auth = {"Authorization": f"Bearer {token}"}
        for path, body in (("/admin/reset", {"rowmap": str(rowmap)}), ("/admin/knobs", {})):
            assert _post(b.url(path), body)[0] == 401
            assert _post(b.url(path), body, {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(b.url("/admin/state"))[0] == 401
        status, _ = _post(b.url("/admin/knobs"), {"drain_every": 3}, auth, "text/plain")
        assert status == 415
        status, state = _post(b.url("/admin/reset"), {"rowmap": str(rowmap)}, auth)
        assert status == 200, state
        request = urllib.request.Request(b.url("/admin/state"), headers=auth)
        with urllib.request.urlopen(request, timeout=30) as response:
            state = json.loads(response.read())
        assert state["rowmap"] == str(rowmap) and "drain_every" in state
        outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
        for path in (str(outside), str(tmp_path / ".." / outside.name)):
            status, answer = _post(b.url("/admin/dump"), {"path": path}, auth)
            assert status == 400 and "--dump-dir" in answer["error"], answer
        assert not outside.exists()
        status, _ = _post(b.url("/admin/dump"), {"path": str(tmp_path / "d.json")}, auth)
        assert status == 200 and (tmp_path / "d.json").is_file()
        assert _get(b.url("/health"))[0] == 200  # the serving side needs no token
    finally:
        b.stop()
