"""An ``until_recovered`` extension stops on a recovery read with nothing in flight.

The runner's check reads the ring every half second while the extension's requests stream, so
it usually reads mid-request; the request in flight then finishes after the check said
"measured", and its steps join the phase. One CI run of the queue-rate ladder read "never
recovered" so: the tail moved the phase's converged span past the hold the check had seen. The
drive now asks once more after the requests in flight have finished, and goes on when the phase
as it ended is no longer measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from harness.benchmarks.drive import Schedule, ScheduleServer
from harness.drive.client import DriveSpec, PhasePlan, RequestResult, UntilHook, WorkItem, drive

pytestmark = pytest.mark.slow  # a real streaming server process


@pytest.fixture(scope="module")
def server() -> Iterator[ScheduleServer]:
    # ~70 ms a request: a half-second check lands mid-request.
    with ScheduleServer(Schedule(ttft_ms=5.0, tpot_ms=1.0, tokens=64)) as running:
        yield running


def _items(phase: str, count: int) -> tuple[WorkItem, ...]:
    return tuple(WorkItem(f"{phase}{i}", "d", phase, 1, 64, prompt="hi") for i in range(count))


def test_the_extension_ends_on_a_check_made_after_its_last_request(server: ScheduleServer) -> None:
    done: list[RequestResult] = []
    seen: list[int] = []  # requests finished when each check was made
    ended: list[str] = []

    async def measured(phase: PhasePlan) -> bool:
        # "Measured" once three extension requests have finished (the scored two come first).
        seen.append(len(done))
        return len(done) >= 5

    async def ends(phase: PhasePlan) -> None:
        ended.append(phase.name)

    phase = PhasePlan("agent", 1, _items("agent", 2), extension=_items("more", 200))
    spec = DriveSpec(base_url=server.base_url, flavour="completions", model="m", concurrency=1)
    results = asyncio.run(
        drive(spec, [phase], on_result=done.append, until=UntilHook(measured, ends=ends))
    )

    extension = [r for r in results if r.prompt_id.startswith("more")]
    assert 3 <= len(extension) < 200, len(extension)  # stopped by the check, not the cap
    # The last check saw every request the phase sent, so the phase as it ended was measured.
    assert seen[-1] == len(results), (seen, len(results))
    assert ended == ["agent"]
