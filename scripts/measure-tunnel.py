"""What the SSH tunnel and the on-box driver cost, measured on the loopback sshd of the tests.

Usage: .venv/bin/python scripts/measure-tunnel.py [REPEATS]

Starts a throwaway sshd on 127.0.0.1 (tests/sshd.py), so the "box" is this machine and a direct
connection to its loopback is possible for comparison. Prints:

- one-byte echo round trips to a server on the box's 127.0.0.1: direct, through the tunnel, and
  the SSH channel alone (``SshBox.round_trips``, as ``boxes/<box>.json`` records it);
- 40 streamed completions (64 tokens 5 ms apart, concurrency 4) from a small aiohttp server on
  the box (tests/box_servers.py): TTFT, the gaps between chunks and E2EL, driven directly,
  through the tunnel, and from the box (``drive: on-box``), with the on-box drive's wall time.

The figures in docs/design.md ("Boxes") came from this script on two busy cores.
"""

from __future__ import annotations

import asyncio
import itertools
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.boxes.boxes import SshBox  # noqa: E402
from harness.boxes.tunnel import _ECHO_SNIPPET, _read_line  # noqa: E402
from harness.card import load_runtime_profile  # noqa: E402
from harness.drive.client import DriveSpec, PhasePlan, RequestResult, WorkItem, drive  # noqa: E402
from harness.drive.remote import ship_driver  # noqa: E402
from harness.profiles.schema import BoxSpec  # noqa: E402
from harness.runtimes.boot import BootSpec, RunningRuntime  # noqa: E402
from tests.box_servers import STREAMING, box_server  # noqa: E402
from tests.sshd import start_sshd, stop_process  # noqa: E402


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * len(ordered))]
    return f"median {statistics.median(ordered) * 1000:.3f} ms, p90 {p90 * 1000:.3f} ms"


def _echo(port: int, count: int = 500) -> list[float]:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        samples = []
        for index in range(count + 5):
            started = time.perf_counter()
            conn.sendall(b"x")
            if conn.recv(8) != b"x":
                raise RuntimeError("the echo answered wrongly")
            if index >= 5:
                samples.append(time.perf_counter() - started)
    return samples


def _summary(label: str, results: list[RequestResult]) -> None:
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{label}: {len(failed)} requests failed: {failed[:3]}")
    ttft = [r.ttft_s or 0.0 for r in results]
    gaps = [b - a for r in results for a, b in itertools.pairwise(r.chunk_times_s)]
    e2el = [r.e2el_s or 0.0 for r in results]
    print(f"{label:7s} TTFT {_ms(ttft)} | chunk gap {_ms(gaps)} | E2EL {_ms(e2el)}")


def main() -> None:
    """Measure and print; stops the sshd it started."""
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    folder = Path(tempfile.mkdtemp(prefix="harness-tunnel-"))
    server, process = start_sshd(folder / "sshd")
    spec = BoxSpec(
        kind="ssh",
        host=server.host,
        port=server.port,
        user=server.user,
        key=str(server.client_key),
        known_hosts=str(server.known_hosts),
        python=sys.executable,
        drive="on-box",
    )
    box = SshBox("loopback", spec, known_hosts=[server.known_hosts])
    try:
        for _ in range(repeats):
            rtt = box.round_trips()
            print(f"round_trips: tunnel {rtt['tunnel']}, SSH channel {rtt['ssh_channel']}")
        command = f"{shlex.quote(sys.executable)} -c {shlex.quote(_ECHO_SNIPPET)}"
        channel = box.exec_channel(command, 300)
        channel.settimeout(10)
        port = int(_read_line(channel, bytearray(), time.monotonic() + 30))
        tunnel = box.tunnels.open(port)
        for _ in range(repeats):
            print(f"echo direct: {_ms(_echo(port))}")
            print(f"echo tunnel: {_ms(_echo(tunnel.local_port))}")
        box.release_http(port)
        channel.shutdown_write()
        channel.close()

        profile = load_runtime_profile(
            ROOT / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml"
        )
        with box_server(box, STREAMING, str(folder / "box")) as streaming:
            url = box.http_base(streaming.port)
            boot = BootSpec([], {}, None, {}, streaming.port, "", "")
            runtime = RunningRuntime(box, profile, boot, pgid=0, base_url=url)
            time.sleep(2)  # the server's "listening" line comes just before it binds
            items = tuple(WorkItem(f"p{i}", "en", "main", 0, 64, prompt="hi") for i in range(40))
            phases = [PhasePlan("main", 0, items)]
            driver = ship_driver(box, str(folder / "box"))
            for _ in range(repeats):
                for label, base in (
                    ("direct", f"http://127.0.0.1:{streaming.port}"),
                    ("tunnel", url),
                ):
                    settings = DriveSpec(base, "completions", "m", concurrency=4, timeout_s=30)
                    _summary(label, asyncio.run(drive(settings, phases)))
                settings = DriveSpec(url, "completions", "m", concurrency=4, timeout_s=30)
                started = time.perf_counter()
                results = driver.drive(
                    runtime,
                    settings,
                    phases,
                    phase_live=lambda phase: None,
                    on_result=lambda result: None,
                    origin=None,
                    mark_first=True,
                )
                wall = time.perf_counter() - started
                _summary("on-box", results)
                print(f"on-box drive: {wall:.2f} s wall, interpreter start on the box included")
    finally:
        box.close()
        stop_process(process)


if __name__ == "__main__":
    main()
