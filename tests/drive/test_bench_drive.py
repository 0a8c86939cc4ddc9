"""The driver-fidelity and overhead benchmarks: the fake server and the measurements agree.

Correctness only: the schedule server emits what it promises and never early, our driver and the
plain loop read it back within a generous bound, and both benchmarks return their figures.
How fast anything is belongs to ``harness bench drive`` / ``harness bench overhead``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import aiohttp
import numpy as np
import pandas as pd
import pytest

from harness.analyze.metrics import request_metrics
from harness.benchmarks import Figure
from harness.benchmarks import drive as bench_drive
from harness.benchmarks import overhead as bench_overhead
from harness.benchmarks.drive import (
    Schedule,
    ScheduleServer,
    StreamTiming,
    TrueTiming,
    measure_driver,
    measure_plain_loop,
    tpot_errors_pct,
)
from harness.errors import InfrastructureError

pytestmark = pytest.mark.slow  # boots real server processes

SCHEDULE = Schedule(ttft_ms=50.0, tpot_ms=20.0, tokens=16)


@pytest.fixture(scope="module")
def server() -> Iterator[ScheduleServer]:
    """One schedule server for the module."""
    with ScheduleServer(SCHEDULE) as running:
        yield running


async def _raw_stream(url: str, prompt: str, tokens: int) -> list[bytes]:
    body = {"model": "schedule", "prompt": prompt, "max_tokens": tokens, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return [line async for line in response.content]


def test_server_emits_n_tokens_then_usage_then_done(server: ScheduleServer) -> None:
    lines = asyncio.run(_raw_stream(server.base_url + "/v1/completions", "raw-1", 7))
    events = [line.strip() for line in lines if line.strip()]
    assert all(e.startswith(b"data: ") for e in events)
    assert events[-1] == b"data: [DONE]"
    payloads = [json.loads(e[len(b"data: ") :]) for e in events[:-1]]
    tokens = [p for p in payloads if p["choices"]]
    assert len(tokens) == 7
    assert all(p["choices"][0]["text"] for p in tokens)
    assert payloads[-1]["choices"] == []
    assert payloads[-1]["usage"]["completion_tokens"] == 7
    assert len(payloads) == 8  # the tokens and one usage chunk, nothing else


def test_server_never_sends_a_token_before_its_deadline(server: ScheduleServer) -> None:
    asyncio.run(_raw_stream(server.base_url + "/v1/completions", "deadline-1", 5))
    true = server.truth()["deadline-1"]
    assert true.tokens == 5
    assert true.first_s >= SCHEDULE.ttft_ms / 1e3
    assert true.last_s >= (SCHEDULE.ttft_ms + 4 * SCHEDULE.tpot_ms) / 1e3
    assert true.late_max_ms >= 0


@pytest.mark.parametrize("measure", [measure_driver, measure_plain_loop])
def test_clients_read_the_schedule_back_at_c1(
    server: ScheduleServer, measure: Callable[..., dict[str, StreamTiming]]
) -> None:
    keys = [f"{measure.__name__}-{i}" for i in range(3)]
    measured = measure(server.base_url, keys, 1, SCHEDULE.tokens)
    truth = server.truth()
    assert set(measured) == set(keys)
    for key, timing in measured.items():
        assert timing.tokens == SCHEDULE.tokens
        # TTFT includes the connection and the request's trip: never before the server sent it.
        assert timing.ttft_s >= max(SCHEDULE.ttft_ms / 1e3, truth[key].first_s)
        assert timing.tpot_s == pytest.approx(SCHEDULE.tpot_ms / 1e3, rel=0.2)
        assert timing.tpot_s == pytest.approx(truth[key].tpot_s, rel=0.2)
    # The client's own share of TTFT (connecting, the request's trip, reading the chunk): the
    # least of the three stays under most of a token interval, so a client that counted from
    # the wrong point or a token late fails; any one may be slowed by a busy box (61.8 ms
    # against a 50 ms schedule once, beside the suite's other worker).
    shares = [measured[k].ttft_s - truth[k].first_s for k in keys]
    assert min(shares) < 0.75 * SCHEDULE.tpot_ms / 1e3, shares
    errors = tpot_errors_pct(measured, truth)
    expected = [abs(measured[k].tpot_s - truth[k].tpot_s) / truth[k].tpot_s * 100 for k in measured]
    np.testing.assert_allclose(errors, expected, rtol=1e-12)


def test_stream_tpot_is_the_metrics_module_formula() -> None:
    timings = [StreamTiming(0.05, 1.31, 64), StreamTiming(0.2, 0.5, 2), StreamTiming(0.1, 0.9, 9)]
    frame = pd.DataFrame(
        {
            "request": range(len(timings)),
            "first_after_boot": False,
            "domain": "bench",
            "prompt_id": [f"p{i}" for i in range(len(timings))],
            "phase": "bench",
            "ok": True,
            "warmup": False,
            "ttft_s": [t.ttft_s for t in timings],
            "e2el_s": [t.e2el_s for t in timings],
            "completion_tokens": [t.tokens for t in timings],
            "prompt_tokens": 1,
        }
    )
    scored = request_metrics(frame)
    np.testing.assert_allclose(scored["tpot_ms"], [t.tpot_s * 1e3 for t in timings], rtol=1e-12)


def test_a_server_record_that_does_not_match_is_an_error() -> None:
    measured = {"a": StreamTiming(0.05, 1.0, 10)}
    with pytest.raises(InfrastructureError, match="request a"):
        tpot_errors_pct(measured, {"a": TrueTiming(0.05, 1.0, 11, 0.0)})
    with pytest.raises(InfrastructureError, match="request a"):
        tpot_errors_pct(measured, {})


def _check_figures(figures: list[Figure]) -> None:
    assert figures
    for figure in figures:
        assert isinstance(figure, Figure)
        assert np.isfinite(figure.value) and figure.value >= 0
        assert (figure.passed is None) == (not figure.target)


def test_drive_bench_quick_returns_its_figures() -> None:
    figures = bench_drive.run_bench(quick=True)
    _check_figures(figures)
    by_name = {f.name: f for f in figures}
    assert len(by_name) == len(figures) == 12
    for c, target in ((1, "< 1 %"), (16, "< 1 %"), (64, "< 3 %")):
        median = by_name[f"TPOT error at C{c}, median (n={c})"]
        p95 = by_name[f"TPOT error at C{c}, p95 (n={c})"]
        for figure in (median, p95):
            assert figure.unit == "%" and figure.target == target
            assert "plain aiohttp loop" in figure.baseline
        assert median.value <= p95.value
        ratio = by_name[f"TPOT error at C{c}, driver / plain loop (median)"]
        assert ratio.unit == "x" and ratio.passed is not None
        assert by_name[f"server schedule deviation at C{c}, p95 (context)"].unit == "%"


@pytest.fixture(scope="module")
def overhead_runs() -> tuple[list[bench_overhead.RunTimes], float]:
    """The quick overhead campaign (1 ABBA cycle), measured once for the tests below."""
    return bench_overhead.measure_overhead(cycles=1)


def test_overhead_parts_add_up_to_each_run(
    overhead_runs: tuple[list[bench_overhead.RunTimes], float],
) -> None:
    runs, setup_s = overhead_runs
    assert len(runs) == 4 and setup_s > 0
    for run in runs:
        assert run.boot_s > 0 and run.drive_s > 0 and run.overhead_s > 0
        parts = sum(run.overhead_steps_s().values()) + run.boot_s + run.drive_s
        assert parts == pytest.approx(run.total_s, rel=1e-9)
        assert run.shell_commands > 0


def test_overhead_figures_of_the_quick_campaign(
    overhead_runs: tuple[list[bench_overhead.RunTimes], float],
) -> None:
    figures = bench_overhead.overhead_figures(*overhead_runs)  # what run_bench(quick=True) returns
    _check_figures(figures)
    head = figures[0]
    assert head.name == "orchestration overhead per run, median of 4"
    assert head.unit == "s" and head.target == "< 1 s" and head.passed is not None
    assert "boot" in head.baseline and "drive" in head.baseline
    steps = [f for f in figures if f.name.startswith("overhead step: ")]
    assert 1 <= len(steps) <= 5 and all(f.unit == "s" for f in steps)
    # The steps are parts of the overhead, ranked largest first.
    assert all(f.value <= head.value * 1.0001 for f in steps)
    assert [f.value for f in steps] == sorted((f.value for f in steps), reverse=True)
    assert figures[-1].name.startswith("campaign setup")
