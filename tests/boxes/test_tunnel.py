"""The SSH tunnel to a box's loopback (harness/boxes/tunnel.py), over the real loopback sshd.

Servers run on the box's 127.0.0.1 (tests/box_servers.py); the harness side reaches them only
through :meth:`SshBox.http_base`, as the runner does.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.boxes.ssh import SshBox
from harness.drive.client import DriveSpec, PhasePlan, RuntimeHung, WorkItem, drive
from harness.errors import BoxError
from harness.profiles.box import BoxSpec
from harness.runtimes.boot import http_json, http_text
from tests.box_servers import STREAMING, box_server
from tests.sshd import LoopbackSshd, sshd, start_sshd, stop_process  # noqa: F401 - the fixture


def _spec(server: LoopbackSshd) -> BoxSpec:
    return BoxSpec(
        kind="ssh",
        host=server.host,
        port=server.port,
        user=server.user,
        key=str(server.client_key),
        known_hosts=str(server.known_hosts),
    )


@pytest.fixture
def box(sshd: LoopbackSshd) -> Iterator[SshBox]:  # noqa: F811
    opened = SshBox("loopback", _spec(sshd), known_hosts=[sshd.known_hosts])
    try:
        yield opened
    finally:
        opened.close()


def _wait_up(url: str, timeout_s: float = 30) -> int:
    """Poll ``url`` until it answers; returns how many probes were refused first."""
    refused = 0
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, _ = http_text(url, timeout_s=2)
            if status == 200:
                return refused
        except ConnectionRefusedError:
            refused += 1
        assert time.monotonic() < deadline, f"{url} never answered"
        time.sleep(0.05)


async def _stream_all(base_url: str, count: int) -> list[bytes]:
    async with aiohttp.ClientSession() as session:

        async def one() -> bytes:
            async with session.get(base_url + "/s") as response:
                assert response.status == 200
                return await response.read()

        return await asyncio.gather(*(one() for _ in range(count)))


def test_many_concurrent_streams_share_the_tunnel_with_commands(
    box: SshBox, tmp_path: Path
) -> None:
    with box_server(box, STREAMING, str(tmp_path / "box")) as server:
        base_url = box.http_base(server.port)
        _wait_up(base_url + "/health")

        async def streams_and_commands() -> tuple[list[bytes], list[str]]:
            # Commands on the same SSH connection, from another thread, while 32 streams run.
            commands = [asyncio.to_thread(lambda i=i: box.sh(f"echo {i}").stdout) for i in range(4)]
            streamed, echoed = await asyncio.gather(
                _stream_all(base_url, 32), asyncio.gather(*commands)
            )
            return streamed, list(echoed)

        streamed, echoed = asyncio.run(streams_and_commands())
        expected = b"".join(f"data: {i}\n\n".encode() for i in range(20))
        assert streamed == [expected] * 32
        assert [line.strip() for line in echoed] == ["0", "1", "2", "3"]
        [tunnel] = box.tunnels.open_tunnels()
        assert tunnel.remote == ("127.0.0.1", server.port)
        assert tunnel.connections >= 32  # each stream had a connection of its own
        assert box.http_base(server.port) == base_url  # one tunnel per port, reused


def test_a_restart_on_a_new_port_gets_a_new_tunnel_and_the_old_one_closes(
    box: SshBox, tmp_path: Path
) -> None:
    port = box.free_port()
    old_url = box.http_base(port)  # as a boot does: the tunnel first, then readiness probes
    with pytest.raises(ConnectionRefusedError):
        http_text(old_url + "/health")
    with box_server(box, STREAMING, str(tmp_path / "box"), port) as first:
        # The refused probe did not end the tunnel (as one ends fabric's forward_local).
        _wait_up(old_url + "/health")
    box.release_http(first.port)
    old_port = int(old_url.rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", old_port)):
        pass  # the old tunnel's listener is closed
    with box_server(box, STREAMING, str(tmp_path / "box")) as second:
        new_url = box.http_base(second.port)
        _wait_up(new_url + "/health")
        assert new_url != old_url
        assert [t.remote[1] for t in box.tunnels.open_tunnels()] == [second.port]
    box.close()
    assert box.tunnels.open_tunnels() == []


def test_forwarding_is_allowed_on_the_loopback_box(box: SshBox) -> None:
    box.check_forwarding()  # nothing listens on the box's port 1: refused there, allowed here
    assert box.tunnels.open_tunnels() == []


def test_a_refused_connection_reads_as_refused_through_the_tunnel(box: SshBox) -> None:
    port = box.free_port()  # nothing listens there
    base_url = box.http_base(port)
    with pytest.raises(ConnectionRefusedError, match="nothing listens there"):
        http_text(base_url + "/health")
    with pytest.raises(ConnectionRefusedError):
        http_json(base_url + "/live", {"phase": 0})
    # The driver takes it as a runtime that is down, and stops at once (not one failure a
    # request until a timed phase ends).
    items = tuple(WorkItem(f"p{i}", "en", "main", 0, 4, prompt="hi") for i in range(50))
    spec = DriveSpec(base_url=base_url, flavour="completions", model="m", concurrency=2)
    started = time.monotonic()
    with pytest.raises(RuntimeHung, match="runtime down") as caught:
        asyncio.run(drive(spec, [PhasePlan("main", 0, items, duration_s=30)]))
    assert time.monotonic() - started < 10
    # At concurrency 2 either request may be the one refused first; the other is cancelled.
    errors = [r.error for r in caught.value.results]
    assert any("ConnectionRefusedError" in e for e in errors), errors


def test_a_box_that_refuses_forwarding_is_named_with_the_fix(tmp_path: Path) -> None:
    server, process = start_sshd(tmp_path / "sshd", ["AllowTcpForwarding no"])
    box = SshBox("noforward", _spec(server), known_hosts=[server.known_hosts])
    try:
        with pytest.raises(BoxError, match="AllowTcpForwarding yes") as caught:
            box.http_base(box.free_port())
        assert "box noforward" in str(caught.value)
        # A campaign checks this before its first run (prepare_drive), and stops there.
        with pytest.raises(BoxError, match="AllowTcpForwarding yes"):
            box.check_forwarding()
        with pytest.raises(BoxError, match="AllowTcpForwarding yes"):
            box.round_trips()
    finally:
        box.close()
        stop_process(process)
