"""The SSH tunnel to a runtime on a remote box, and the tunnel's round-trip time.

Runtimes on SSH boxes listen on the box's 127.0.0.1 only; the harness reaches each one through a
:class:`Tunnel`: a listening socket on this machine's 127.0.0.1 whose every connection is carried
to the runtime's port on a ``direct-tcpip`` channel of the box's SSH connection. Every HTTP call
(readiness probe, live knobs, counters, the driver's streams) goes through it unchanged, as a
plain URL.

It is written here over paramiko rather than taken from fabric's ``forward_local``, which opens
each channel in its one manager thread (a single refused connection, as every readiness probe
before the runtime listens is, ends the whole tunnel), polls its listener every 10 ms and
copies in 1 KiB pieces. Here the listener only accepts; each connection opens its channel and
copies both ways on threads of its own, so many concurrent streams never wait on each other.

A direct connection to a runtime that is down is refused at connect time, which the driver
takes as "the runtime is down" (:class:`~harness.drive.client.RuntimeHung`). Through a tunnel
the local connect always succeeds, and only the channel is refused; so the tunnel answers such a
connection with ``502`` and the :data:`REFUSED_HEADER`, and the HTTP helpers and the driver treat
that answer exactly as a refused connection (:func:`refusal`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.errors import BoxError

REFUSED_HEADER = "X-Harness-Tunnel"
_BUFFER_BYTES = 64 * 1024
_ACCEPT_POLL_S = 0.25  # how often the listener looks whether it was closed
_REFUSAL_LINGER_S = 2.0  # reading the refused client's request, so the close is a FIN, not a RST
# The SSH channel codes of RFC 4254 §5.1 that say why a forward was refused.
_PROHIBITED = 1
_CONNECT_FAILED = 2

OpenChannel = Callable[[tuple[str, int], tuple[str, int]], Any]


class _QuietRefusals(logging.Filter):
    """Drops paramiko's ERROR line for each refused channel: every readiness probe before a
    runtime listens is one, and the tunnel answers it as a refusal (unconfigured logging would
    print them all on stderr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusals())


def refusal(status: int, headers: Mapping[str, str]) -> str | None:
    """``"refused"`` when a response is the tunnel's stand-in for a refused connection."""
    if status == 502 and headers.get(REFUSED_HEADER):
        return str(headers[REFUSED_HEADER])
    return None


def forwarding_fix(where: str) -> str:
    """What to change on a box whose sshd refuses to forward."""
    return (
        f"{where}: its sshd refuses TCP forwarding, which the harness needs to reach the "
        "runtime on the box's 127.0.0.1: set `AllowTcpForwarding yes` (or `local`) for the ssh "
        "user in the box's sshd_config, without `DisableForwarding yes`, and reload sshd"
    )


def describe_channel_error(exc: BaseException, where: str, remote: tuple[str, int]) -> str:
    """Why a channel to ``remote`` could not be opened, in words."""
    import paramiko

    host, port = remote
    if isinstance(exc, paramiko.ChannelException):
        if exc.code == _CONNECT_FAILED:
            return f"connection refused at {host}:{port} on {where}: nothing listens there"
        if exc.code == _PROHIBITED:
            return forwarding_fix(where)
        return f"{where}: the ssh channel to {host}:{port} was refused: {exc.text}"
    if isinstance(exc, paramiko.SSHException | EOFError):
        return f"{where}: the ssh connection is down ({type(exc).__name__}: {exc})"
    return f"{where}: tunnel to {host}:{port}: {type(exc).__name__}: {exc}"


class _Link:
    """One tunnelled connection: a local socket and its channel, copied both ways."""

    def __init__(self, sock: socket.socket, channel: Any) -> None:
        self.sock = sock
        self.channel = channel
        self._closed = False
        self._lock = threading.Lock()

    def run(self) -> None:
        """Copy until both directions have ended, then close both ends."""
        back = threading.Thread(target=self._channel_to_socket, name="tunnel-back", daemon=True)
        back.start()
        self._socket_to_channel()
        back.join()
        self.close()

    def _socket_to_channel(self) -> None:
        try:
            while data := self.sock.recv(_BUFFER_BYTES):
                self.channel.sendall(data)
            self.channel.shutdown_write()  # the client has sent all: EOF to the runtime
        except (OSError, EOFError):
            self.close()  # wakes the other direction

    def _channel_to_socket(self) -> None:
        try:
            while data := self.channel.recv(_BUFFER_BYTES):
                self.sock.sendall(data)
            self.sock.shutdown(socket.SHUT_WR)  # the runtime has sent all: EOF to the client
        except (OSError, EOFError):
            self.close()

    def close(self) -> None:
        """Close both ends (idempotent, from any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError, EOFError):
            self.channel.close()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in the other thread
        with contextlib.suppress(OSError):
            self.sock.close()


class Tunnel:
    """A port on this machine's 127.0.0.1 forwarded to ``remote`` on the box, until closed.

    ``open_channel(remote, peer)`` opens one ``direct-tcpip`` channel (the box supplies it over
    its connection; paramiko's transport is safe to open channels on from many threads).
    """

    def __init__(self, open_channel: OpenChannel, remote: tuple[str, int], where: str) -> None:
        self.remote = remote
        self.where = where
        self.connections = 0  # accepted so far, for the record and the tests
        self.refused = 0
        self._open_channel = open_channel
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(_ACCEPT_POLL_S)
        self.local_port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"tunnel-{remote[1]}", daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        """The runtime's URL as the harness uses it."""
        return f"http://127.0.0.1:{self.local_port}"

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.05)  # out of file descriptors, say: try again, do not spin
                continue
            self.connections += 1
            worker = threading.Thread(
                target=self._serve, args=(sock, peer), name="tunnel-link", daemon=True
            )
            worker.start()

    def _serve(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        sock.settimeout(None)
        # Streamed tokens are small writes; Nagle would hold each one back until the last is
        # acknowledged (OpenSSH's own forwarding sets this too).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            channel = self._open_channel(self.remote, peer)
        except Exception as exc:  # paramiko raises several types; each is a refusal here
            self._refuse(sock, describe_channel_error(exc, self.where, self.remote))
            return
        link = _Link(sock, channel)
        with self._lock:
            if self._closed.is_set():
                link.close()
                return
            self._links.add(link)
        try:
            link.run()
        finally:
            with self._lock:
                self._links.discard(link)

    def _refuse(self, sock: socket.socket, reason: str) -> None:
        """Answer in place of a runtime that refused: 502 with :data:`REFUSED_HEADER`."""
        self.refused += 1
        body = reason.encode("utf-8")
        head = (
            "HTTP/1.1 502 Bad Gateway\r\n"
            f"{REFUSED_HEADER}: refused\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            sock.sendall(head.encode("ascii") + body)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(_REFUSAL_LINGER_S)
            while sock.recv(_BUFFER_BYTES):
                pass
        except OSError:
            pass
        finally:
            sock.close()

    @property
    def open_links(self) -> int:
        """Connections being carried right now."""
        with self._lock:
            return len(self._links)

    def close(self) -> None:
        """Stop accepting and close every carried connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links = list(self._links)
            self._links.clear()
        for link in links:
            link.close()
        self._thread.join(timeout=2 * _ACCEPT_POLL_S + 1)


class TunnelSet:
    """The tunnels of one box, one per runtime port: opened on first use, closed with the run.

    A runtime restarted on a new port gets a new tunnel; the old one is closed when its runtime
    is stopped (:meth:`release`), and every one left when the box is closed.
    """

    def __init__(self, open_channel: OpenChannel, where: str) -> None:
        self._open_channel = open_channel
        self.where = where
        self._tunnels: dict[int, Tunnel] = {}
        self._lock = threading.Lock()

    def open(self, port: int) -> Tunnel:
        """The tunnel to ``port`` on the box's 127.0.0.1, opened on first use.

        Opening it first opens one channel there to learn whether the box forwards at all:
        "connection refused" (the runtime is not up yet) is fine, "prohibited" is a BoxError
        with the fix (:meth:`probe`).
        """
        with self._lock:
            tunnel = self._tunnels.get(port)
            if tunnel is None:
                self.probe(port)
                tunnel = Tunnel(self._open_channel, ("127.0.0.1", port), self.where)
                self._tunnels[port] = tunnel
            return tunnel

    def url(self, port: int) -> str:
        """The local URL of the runtime at ``port`` on the box's 127.0.0.1."""
        return self.open(port).base_url

    def open_tunnels(self) -> list[Tunnel]:
        """The tunnels open now (one per running runtime)."""
        with self._lock:
            return list(self._tunnels.values())

    def probe(self, port: int = 1) -> None:
        """A BoxError, with the fix, when the box's sshd forbids forwarding (to ``port`` on its
        127.0.0.1). Whether anything listens there does not matter: refused there or answered,
        the forward was allowed; port 1 has nothing listening on any real box."""
        import paramiko

        remote = ("127.0.0.1", port)
        try:
            channel = self._open_channel(remote, ("127.0.0.1", 0))
        except paramiko.ChannelException as exc:
            if exc.code == _PROHIBITED:
                raise BoxError(forwarding_fix(self.where)) from None
            return  # refused there, or another channel error each connection will report
        except Exception as exc:  # the connection is down, say: paramiko raises many types
            raise BoxError(describe_channel_error(exc, self.where, remote)) from exc
        with contextlib.suppress(OSError, EOFError):
            channel.close()

    def round_trips(self, start_echo: Callable[[str], Any], python: str) -> dict[str, Any]:
        """:func:`echo_round_trips` through a tunnel of this set, closed after; a BoxError
        naming the box when it cannot be measured."""
        opened: list[int] = []

        def open_tunnel(port: int) -> Tunnel:
            opened.append(port)
            return self.open(port)

        try:
            return echo_round_trips(start_echo, open_tunnel, python)
        except BoxError:
            raise
        except Exception as exc:  # paramiko, sockets, a python missing on the box
            what = f"{type(exc).__name__}: {exc}"
            raise BoxError(f"{self.where}: measuring the tunnel: {what}") from exc
        finally:
            for port in opened:
                self.release(port)

    def release(self, port: int) -> None:
        """Close the tunnel to ``port`` (its runtime has stopped)."""
        with self._lock:
            tunnel = self._tunnels.pop(port, None)
        if tunnel is not None:
            tunnel.close()

    def close(self) -> None:
        """Close every tunnel."""
        with self._lock:
            tunnels = list(self._tunnels.values())
            self._tunnels.clear()
        for tunnel in tunnels:
            tunnel.close()


# ---- round-trip time -------------------------------------------------------------------------

# Runs on the box: a TCP echo server on 127.0.0.1 (its port printed first), and an echo of stdin
# lines to stdout; it exits when stdin ends (the harness closed the channel).
_ECHO_SNIPPET = (
    "import os,socket,sys,threading\n"
    "s=socket.socket();s.bind(('127.0.0.1',0));s.listen(4)\n"
    "print(s.getsockname()[1],flush=True)\n"
    "def lines():\n"
    "    for line in sys.stdin:\n"
    "        sys.stdout.write(line);sys.stdout.flush()\n"
    "    os._exit(0)\n"
    "threading.Thread(target=lines,daemon=True).start()\n"
    "while True:\n"
    "    c,_=s.accept();c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
    "    while True:\n"
    "        d=c.recv(64)\n"
    "        if not d: break\n"
    "        c.sendall(d)\n"
    "    c.close()\n"
)
RTT_SAMPLES = 50
_RTT_WARMUP = 5


def _summary_ms(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 4),
        "p90_ms": round(p90 * 1000, 4),
        "min_ms": round(ordered[0] * 1000, 4),
    }


def _read_line(channel: Any, buffer: bytearray, deadline: float) -> bytes:
    while b"\n" not in buffer:
        if time.monotonic() > deadline:
            raise TimeoutError("no answer from the echo on the box")
        data = channel.recv(4096)
        if not data:
            raise EOFError("the echo on the box exited")
        buffer.extend(data)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def echo_round_trips(
    start_echo: Callable[[str], Any],
    open_tunnel: Callable[[int], Tunnel],
    python: str,
    samples: int = RTT_SAMPLES,
) -> dict[str, Any]:
    """Median round trip of one byte through a tunnel, and of one line over the SSH channel.

    ``start_echo(command)`` runs :data:`_ECHO_SNIPPET` on the box and returns its channel;
    ``open_tunnel(port)`` opens a tunnel to a port on the box (closed here after). The channel
    figure is the SSH
    connection's own latency; the tunnel's adds this machine's loopback hop, the box's, and the
    copying at both ends.
    """
    import shlex

    channel = start_echo(f"{shlex.quote(python)} -c {shlex.quote(_ECHO_SNIPPET)}")
    tunnel: Tunnel | None = None
    try:
        channel.settimeout(10)
        buffer = bytearray()
        deadline = time.monotonic() + 30
        port = int(_read_line(channel, buffer, deadline))
        over_channel: list[float] = []
        for index in range(samples + _RTT_WARMUP):
            started = time.perf_counter()
            channel.sendall(b"x\n")
            _read_line(channel, buffer, deadline)
            if index >= _RTT_WARMUP:
                over_channel.append(time.perf_counter() - started)
        tunnel = open_tunnel(port)
        through_tunnel: list[float] = []
        with socket.create_connection(("127.0.0.1", tunnel.local_port), timeout=10) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for index in range(samples + _RTT_WARMUP):
                started = time.perf_counter()
                conn.sendall(b"x")
                if conn.recv(64) != b"x":
                    raise EOFError("the echo through the tunnel answered wrongly or closed")
                if index >= _RTT_WARMUP:
                    through_tunnel.append(time.perf_counter() - started)
        return {
            "samples": samples,
            "tunnel": _summary_ms(through_tunnel),
            "ssh_channel": _summary_ms(over_channel),
            "method": (
                "one byte echoed by a TCP server on the box's 127.0.0.1 through the tunnel, "
                "vs one line echoed over an SSH session channel; medians after "
                f"{_RTT_WARMUP} warm-up round trips"
            ),
        }
    finally:
        if tunnel is not None:
            tunnel.close()
        with contextlib.suppress(OSError, EOFError):
            channel.shutdown_write()  # the echo exits at the end of its stdin
        with contextlib.suppress(OSError, EOFError):
            channel.close()
