"""``drive: on-box``: the workload driver shipped to the box and run there (drive_remote.py).

Over the real loopback sshd: a campaign driven on the box leaves the records a tunnelled one
does; and, against small servers on the box (tests/box_servers.py), the on-box driver honours
phases, live knobs and the time origin, judges a hung runtime hung, stops when the harness is
interrupted, and a box without aiohttp is refused with the remedy.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.boxes.ssh import SshBox
from harness.card import load_card, load_runtime_profile
from harness.drive.client import DriveSpec, PhasePlan, RequestResult, RuntimeHung, WorkItem
from harness.drive.remote import BoxDriver, prepare_drive
from harness.errors import BoxError
from harness.execute.campaign import new_campaign_dir
from harness.execute.preflight import check_box
from harness.execute.run import CampaignRunner
from harness.formats.records import RUN_OK, read_json, read_parquet
from harness.plan.build import Run, build_plan
from harness.profiles.box import BoxSpec
from harness.runtimes.boot import BootSpec, RunningRuntime, http_json
from tests.box_servers import STALLING, STREAMING, box_server
from tests.conftest import REPO
from tests.execute.test_execute_ssh import runtime_processes, write_card
from tests.sshd import LoopbackSshd, sshd  # noqa: F401 - the session fixture

# Over the loopback sshd, with a driver shipped and started on the box: the slow tier.
pytestmark = pytest.mark.slow

PROFILE = load_runtime_profile(REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml")


def _spec(server: LoopbackSshd, python: str = sys.executable) -> BoxSpec:
    return BoxSpec(
        kind="ssh",
        host=server.host,
        port=server.port,
        user=server.user,
        key=str(server.client_key),
        known_hosts=str(server.known_hosts),
        python=python,
        drive="on-box",
    )


@pytest.fixture
def box(sshd: LoopbackSshd) -> Iterator[SshBox]:  # noqa: F811
    opened = SshBox("loopback", _spec(sshd), known_hosts=[sshd.known_hosts])
    try:
        yield opened
    finally:
        opened.close()


def _runtime(box: SshBox, port: int) -> RunningRuntime:
    """A runtime record for a server on the box, as a boot leaves one (refbox's profile)."""
    spec = BootSpec(argv=[], env={}, cwd=None, live={}, port=port, run_dir="", log_path="")
    return RunningRuntime(box, PROFILE, spec, pgid=0, base_url=box.http_base(port))


def _items(phase: str, index: int, count: int) -> tuple[WorkItem, ...]:
    return tuple(WorkItem(f"{phase}-{i}", "en", phase, index, 4, prompt="hi") for i in range(count))


def _phase_live(phase: PhasePlan) -> dict[str, Any] | None:
    return {"phase": phase.index} if phase.index >= 0 else None


def _driver_processes(box: SshBox, driver: BoxDriver) -> list[str]:
    return runtime_processes(box, driver.archive)


def _wait_driver_gone(box: SshBox, driver: BoxDriver, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while found := _driver_processes(box, driver):
        assert time.monotonic() < deadline, f"the driver still runs on the box: {found}"
        time.sleep(0.2)


def test_on_box_drive_keeps_phases_live_knobs_and_the_time_origin(
    box: SshBox, tmp_path: Path
) -> None:
    workdir = str(tmp_path / "box")
    with box_server(box, STREAMING, workdir) as server:
        runtime = _runtime(box, server.port)
        driver = prepare_drive(box, PROFILE, workdir)
        assert driver is not None and driver.hello["harness"].startswith(driver.archive)
        phases = [
            PhasePlan("timed", 0, _items("timed", 0, 3), duration_s=1.5),
            PhasePlan("count", 1, _items("count", 1, 4)),
            PhasePlan("quality", -2, _items("quality", -2, 2)),
        ]
        spec = DriveSpec(runtime.base_url, "completions", "m", concurrency=2, timeout_s=10)
        streamed: list[RequestResult] = []
        origin = time.perf_counter() - 100.0  # a run that started 100 s ago, as a segment has
        results = driver.drive(
            runtime,
            spec,
            phases,
            phase_live=_phase_live,
            on_result=streamed.append,
            origin=origin,
            mark_first=True,
        )
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        assert sorted(map(id, results)) == sorted(map(id, streamed))  # the very objects
        assert {r.completion_tokens for r in results} == {4}
        assert all(r.output_text == "t0 t1 t2 t3 " and len(r.chunk_times_s) == 4 for r in results)
        # The harness's origin, translated into the box's clock: 100 s ago, give or take.
        starts = sorted(r.t_start_s for r in results)
        assert 100 <= starts[0] < 110, starts[:3]
        [first] = [r for r in results if r.first_after_boot]
        assert first.t_start_s == starts[0]
        assert len([r for r in results if r.phase == "timed"]) > 3  # the timed phase cycled
        assert [r.phase for r in results][-2:] == ["quality", "quality"]
        status, seen = http_json(runtime.base_url + "/admin/seen")
        assert status == 200 and seen == [{"phase": 0}, {"phase": 1}]


def test_a_hung_runtime_is_judged_hung_on_the_box(box: SshBox, tmp_path: Path) -> None:
    workdir = str(tmp_path / "box")
    with box_server(box, STALLING, workdir) as server:
        runtime = _runtime(box, server.port)
        driver = prepare_drive(box, PROFILE, workdir)
        assert driver is not None
        spec = DriveSpec(runtime.base_url, "completions", "m", concurrency=2, timeout_s=1)
        started = time.monotonic()
        with pytest.raises(RuntimeHung, match="runtime hung") as caught:
            driver.drive(
                runtime,
                spec,
                [PhasePlan("main", 0, _items("main", 0, 8))],
                phase_live=lambda phase: None,
                on_result=lambda result: None,
                origin=None,
                mark_first=True,
            )
        assert time.monotonic() - started < 20
        assert "6 not sent" in str(caught.value)
        errors = [r.error for r in caught.value.results]
        assert len(errors) == 2 and any("timed out after 1 s" in e for e in errors), errors
        _wait_driver_gone(box, driver)


def test_an_interrupt_here_stops_the_driver_there(
    box: SshBox,
    sshd: LoopbackSshd,  # noqa: F811
    tmp_path: Path,
) -> None:
    workdir = str(tmp_path / "box")
    checker = SshBox("checker", _spec(sshd), known_hosts=[sshd.known_hosts])
    with box_server(box, STALLING, workdir) as server:
        runtime = _runtime(box, server.port)
        driver = prepare_drive(box, PROFILE, workdir)
        assert driver is not None
        running: list[list[str]] = []

        stop = threading.Event()

        def interrupt() -> None:
            # Once the driver runs on the box (waiting on the stall), Ctrl-C here.
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                found = _driver_processes(checker, driver)
                if found:
                    running.append(found)
                    time.sleep(1.0)  # past its handshake, into the requests
                    if not stop.is_set():  # the drive did not fail first
                        # A real SIGINT, as Ctrl-C sends: unlike _thread.interrupt_main() it
                        # also wakes a main thread blocked reading the driver's channel.
                        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                    return
                time.sleep(0.2)

        spec = DriveSpec(runtime.base_url, "completions", "m", concurrency=2, timeout_s=120)
        # Ctrl-C's own handler, whatever this process inherited: a shell without job control
        # starts a background job (`make test &`) with SIGINT ignored, and Python keeps that.
        inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
        timer = threading.Thread(target=interrupt, daemon=True)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                driver.drive(
                    runtime,
                    spec,
                    [PhasePlan("main", 0, _items("main", 0, 4))],
                    phase_live=lambda phase: None,
                    on_result=lambda result: None,
                    origin=None,
                    mark_first=True,
                )
            assert running and running[0], "the driver was not running on the box"
            _wait_driver_gone(checker, driver)
        finally:
            stop.set()
            timer.join()
            signal.signal(signal.SIGINT, inherited)
            checker.close()


def test_a_box_without_aiohttp_is_refused_with_the_remedy(
    sshd: LoopbackSshd,  # noqa: F811
    tmp_path: Path,
) -> None:
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # this Python, none of its packages
    python = str(bare / "bin" / "python")
    box = SshBox("bare", _spec(sshd, python), known_hosts=[sshd.known_hosts])
    try:
        with pytest.raises(BoxError) as caught:
            prepare_drive(box, PROFILE, str(tmp_path / "box"))
        text = str(caught.value)
        assert "cannot import aiohttp" in text
        assert f"`{python} -m pip install aiohttp`" in text and "drop `drive: on-box`" in text
        # `harness box check` says so too, beside the checks that pass.
        checks = {c.name: c for c in check_box("bare", box.spec, box=box)}
        assert checks["port forwarding"].ok, checks["port forwarding"]
        assert not checks["on-box driver"].ok and "aiohttp" in checks["on-box driver"].fix
    finally:
        box.close()


def test_box_check_starts_the_on_box_driver(box: SshBox) -> None:
    checks = {c.name: c for c in check_box("loopback", box.spec, box=box)}
    assert checks["on-box driver"].ok and "aiohttp" in checks["on-box driver"].detail


def _run_campaign(card: Path, root: Path) -> tuple[Any, Any, list[int], dict[str, Any]]:
    """Run a card's campaign; returns its plan, directory, the number of connections its
    tunnel carried at each scored request, and the on-box driver's hello (if it had one)."""
    loaded = load_card(card)
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, root)
    carried: list[int] = []

    def progress(event: str, run: Run | None, info: dict[str, Any]) -> None:
        if event == "request" and not info["result"].warmup:
            # Mid-drive: a drive from here holds a connection through the tunnel (aiohttp
            # keeps it alive for the next request); one from the box holds none.
            [tunnel] = runner.box.tunnels.open_tunnels()
            carried.append(tunnel.open_links)

    runner = CampaignRunner(loaded, plan, campaign, progress)
    outcome = runner.execute()
    assert outcome.failed == [] and not outcome.interrupted
    driver = runner.driving.box_driver
    hello = driver.hello if driver is not None else {}
    return plan, campaign, carried, hello


def test_an_on_box_campaign_leaves_the_records_of_a_tunnelled_one(
    sshd: LoopbackSshd,  # noqa: F811
    tmp_path: Path,
) -> None:
    tunnel_card = write_card(sshd, tmp_path)
    on_box_dir = tmp_path / "on-box"
    on_box_dir.mkdir()
    on_box_card = write_card(sshd, on_box_dir)
    text = on_box_card.read_text(encoding="utf-8")
    on_box_card.write_text(
        text.replace("  platform: linux-cpu\n", "  platform: linux-cpu\n  drive: on-box\n"),
        encoding="utf-8",
    )
    plan, tunnelled, tunnel_links, no_hello = _run_campaign(tunnel_card, tmp_path / "t")
    _, on_box, box_links, hello = _run_campaign(on_box_card, tmp_path / "b")
    assert no_hello == {} and len(tunnel_links) == 2 * len(plan.runs)
    # A kept-alive connection can be between close and reopen when a request is sampled (a
    # loaded box once showed 0 at one request of many): nearly every sample, not every one.
    carrying = sum(1 for links in tunnel_links if links >= 1)
    assert carrying >= 0.8 * len(tunnel_links), tunnel_links
    # Driven from the box: the shipped archive answered, and no stream crossed the tunnel.
    assert hello["harness"].startswith(str(on_box_dir / "box-workdir"))
    assert box_links == [0] * 2 * len(plan.runs)
    environment = read_json(on_box.root / "boxes" / "127.0.0.1.json")
    assert environment["drive"] == "on-box"
    for run in plan.runs:
        here, there = tunnelled.run_dir(run.run_id), on_box.run_dir(run.run_id)
        for name in ("requests.parquet", "chunks.parquet"):
            a, b = read_parquet(here / name), read_parquet(there / name)
            assert list(a.columns) == list(b.columns), name
            assert dict(a.dtypes) == dict(b.dtypes), name
            assert len(a) == len(b), name
        assert set(read_json(here / "run.json")) == set(read_json(there / "run.json"))
        assert read_json(there / "run.json")["status"] == RUN_OK
        requests = read_parquet(there / "requests.parquet")
        assert requests["ok"].all() and (requests["completion_tokens"] == 8).all()
        assert (requests["ttft_s"] > 0).all() and (requests["e2el_s"] >= requests["ttft_s"]).all()
        assert (requests["t_start_s"] >= 0).all() and (requests["n_chunks"] > 0).all()
        assert int(requests["first_after_boot"].sum()) == 1
        assert requests.loc[requests["first_after_boot"], "warmup"].all()  # the warm-up was first
        # Greedy decoding: the same outputs whichever side drove.
        same = read_parquet(here / "requests.parquet")
        assert list(requests["output_sha256"]) == list(same["output_sha256"])
