"""Driving from the box itself (``drive: on-box``): ship the driver, run it over SSH, fetch back.

The harness zips its own package (only ``.py`` files, with fixed timestamps, so the same code
gives the same archive and is uploaded once per campaign) and runs it with the box's ``python``
on an SSH channel of its own (:mod:`.drive_box` speaks the protocol). The workload, the drive
settings and each phase's live knob go in as JSON on stdin; every request's result comes back on
stdout as it completes, so the run's records are built from the very same
:class:`~harness.drive.client.RequestResult` objects as a tunnelled drive's.

What a drive here honours, it honours there: the phases and their live knob, the request
timeout, the hung-runtime verdict (:class:`~harness.drive.client.RuntimeHung`, raised here with
the box's results), and checkpointed pieces of a timed phase (their time origin is translated
into the box's clock by a ping). A stop signal here ends the driver there: its stdin closes
(which cancels it), and a driver still alive after a grace period is killed by process group; a
driver whose harness died is cancelled by the same closed stdin, and ``timeout`` on the box
bounds it in any case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.boxes.base import Box, shell_command
from harness.boxes.ssh import SshBox
from harness.drive.client import DriveSpec, PhasePlan, RequestResult, RuntimeHung
from harness.errors import BoxError, RuntimeBootError
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import RunningRuntime
from harness.version import PACKAGE_DIR

_MAIN = """\
import sys
if sys.version_info < (3, 11):
    sys.stdout.write('{"error": "the on-box driver needs Python 3.11 or newer, not %s"}\\n'
                     % sys.version.split()[0])
    sys.exit(3)
from harness.drive.on_box import main
sys.exit(main())
"""
_START_S = 60.0  # interpreter start, handshake and aiohttp import, allowed once per drive
_PHASE_LIVE_S = 10.0  # a phase's live-knob request
_READ_POLL_S = 1.0
_STOP_GRACE_S = 5.0  # how long a cancelled driver gets to exit before its group is killed
_SLACK_S = 30.0  # beyond the box's own deadline, before this side stops waiting

PhaseLive = Callable[[PhasePlan], dict[str, Any] | None]
OnResult = Callable[[RequestResult], None]


def driver_archive() -> tuple[bytes, str]:
    """The harness package as a runnable zip, and its SHA-256 (the same code, the same bytes)."""
    package = PACKAGE_DIR
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        entries = [("__main__.py", _MAIN.encode())]
        for path in sorted(package.rglob("*.py")):
            if "__pycache__" not in path.parts:
                name = "harness/" + path.relative_to(package).as_posix()
                entries.append((name, path.read_bytes()))
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def drive_deadline_s(spec: DriveSpec, phases: Sequence[PhasePlan]) -> float:
    """An upper bound on one drive: every request of a counted phase timing out in turn, a
    timed phase's length plus one timeout. The driver is killed on the box past it."""
    total = _START_S
    for phase in phases:
        total += _PHASE_LIVE_S
        if phase.duration_s is not None:
            total += phase.duration_s + spec.timeout_s
        else:
            total += math.ceil(len(phase.items) / max(spec.concurrency, 1)) * spec.timeout_s
    return total


class _Session:
    """One driver process on the box: JSON lines to its stdin, from its stdout."""

    def __init__(self, box: SshBox, channel: Any, deadline_s: float) -> None:
        self.box = box
        self.channel = channel
        self.deadline = time.monotonic() + deadline_s + _SLACK_S
        self.pgid: int | None = None
        self._buffer = bytearray()
        self._stderr = bytearray()
        channel.settimeout(_READ_POLL_S)

    def send(self, message: dict[str, Any]) -> None:
        self.channel.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def _drain_stderr(self) -> None:
        while self.channel.recv_stderr_ready():
            self._stderr.extend(self.channel.recv_stderr(65536))
            del self._stderr[:-8192]

    def receive(self) -> dict[str, Any]:
        """The next message; a BoxError when the driver exits without one or overruns."""
        while b"\n" not in self._buffer:
            self._drain_stderr()
            if time.monotonic() > self.deadline:
                raise BoxError(f"{self.box.where}: the on-box driver overran its deadline")
            try:
                data = self.channel.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise self._exited()
            self._buffer.extend(data)
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        try:
            message: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            raise BoxError(
                f"{self.box.where}: the on-box driver wrote {line[:200]!r}, not a JSON line"
            ) from None
        return message

    def _exited(self) -> BoxError:
        code = self.channel.recv_exit_status()
        self._drain_stderr()
        tail = self._stderr.decode("utf-8", "replace").strip()[-2000:]
        what = "was killed at its deadline" if code in (124, 137) else f"exited {code}"
        return BoxError(f"{self.box.where}: the on-box driver {what} mid-drive:\n{tail}")

    def stop(self) -> None:
        """End the driver: close its stdin (it cancels itself), then kill its group if need be."""
        with contextlib.suppress(OSError, EOFError):
            self.channel.shutdown_write()
        deadline = time.monotonic() + _STOP_GRACE_S
        while not self.channel.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.channel.exit_status_ready() and self.pgid is not None:
            with contextlib.suppress(BoxError, OSError):
                self.box.signal_group(self.pgid, "KILL")

    def close(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.channel.close()


class BoxDriver:
    """The driver shipped to one SSH box (``drive: on-box``), ready to run drives there."""

    def __init__(self, box: SshBox, archive: str, python: str) -> None:
        self.box = box
        self.archive = archive
        self.python = python
        self.hello: dict[str, Any] = {}

    @property
    def command(self) -> str:
        """The shell text that starts the driver on the box."""
        return shell_command([self.python, self.archive])

    def _start(self, deadline_s: float) -> _Session:
        session = _Session(self.box, self.box.exec_channel(self.command, deadline_s), deadline_s)
        try:
            first = session.receive()
            if "hello" not in first:
                raise BoxError(self._refusal(str(first.get("error", first)), first.get("missing")))
            self.hello = first["hello"]
            session.pgid = int(self.hello["pgid"])
            if not str(self.hello.get("harness", "")).startswith(self.archive):
                raise BoxError(
                    f"{self.box.where}: the on-box driver imported harness from "
                    f"{self.hello.get('harness')}, not from the archive the harness shipped; "
                    "something on the box's python path shadows it"
                )
        except BaseException:  # a refusal, or a stop signal while it starts
            session.stop()
            session.close()
            raise
        return session

    def _refusal(self, error: str, missing: object) -> str:
        if missing == "aiohttp":
            return (
                f"{self.box.where}: `drive: on-box` runs the workload driver with {self.python} "
                f"on the box, which cannot import aiohttp ({error}); install it there "
                f"(`{self.python} -m pip install aiohttp`), or drop `drive: on-box` to drive "
                "through the tunnel"
            )
        return f"{self.box.where}: the on-box driver cannot start: {error}"

    def check(self) -> dict[str, Any]:
        """Start the driver for its hello only: Python, aiohttp and the archive are usable."""
        session = self._start(_START_S)
        try:
            session.stop()
        finally:
            session.close()
        return self.hello

    def drive(
        self,
        runtime: RunningRuntime,
        spec: DriveSpec,
        phases: Sequence[PhasePlan],
        *,
        phase_live: PhaseLive,
        on_result: OnResult,
        origin: float | None,
        mark_first: bool,
    ) -> list[RequestResult]:
        """Drive ``phases`` from the box, as :func:`~harness.drive.client.drive` would here.

        ``origin`` is this machine's ``perf_counter`` origin (None: the drive's start); raises
        :class:`RuntimeHung` with the results when the driver judged the runtime hung or down.
        """
        box_spec = dataclasses.replace(spec, base_url=f"http://127.0.0.1:{runtime.spec.port}")
        deadline_s = drive_deadline_s(spec, phases)
        session = self._start(deadline_s)
        try:
            sent = time.perf_counter()
            session.send({"ping": 0})
            pong = float(session.receive()["pong"])
            offset = pong - (sent + time.perf_counter()) / 2  # the box's clock minus this one's
            job = {
                "spec": dataclasses.asdict(box_spec),
                "phases": [dataclasses.asdict(phase) for phase in phases],
                "phase_live": [phase_live(phase) for phase in phases],
                "live_path": runtime.profile.telemetry.live_knobs_http,
                "live_headers": runtime.admin_headers,
                "origin": None if origin is None else origin + offset,
                "mark_first": mark_first,
            }
            session.send({"job": job})
            received: dict[int, RequestResult] = {}
            while True:
                message = session.receive()
                if "result" in message:
                    result = RequestResult(**message["result"])
                    received[int(message["seq"])] = result
                    on_result(result)
                elif "end" in message:
                    break
                elif message.get("kind") == "live":
                    raise RuntimeBootError(str(message["error"]))
                else:
                    raise BoxError(
                        f"{self.box.where}: the on-box driver failed: {message.get('error')}"
                    )
        except BaseException:
            session.stop()  # a stop signal here, or a failure: the driver there stops too
            raise
        finally:
            session.close()
        end = message["end"]
        results = [received[seq] for seq in end["order"]]
        for seq in end["first_after_boot"]:
            received[seq].first_after_boot = True
        if end["hung"] is not None:
            raise RuntimeHung(str(end["hung"]), results)
        return results


def prepare_drive(box: Box, profile: RuntimeProfile, remote_root: str) -> BoxDriver | None:
    """Make sure a campaign's runtime can be driven, before its first run; the on-box driver,
    shipped and checked, when the box drives on the box (``drive: on-box``).

    An SSH box must forward ports (every HTTP call reaches the runtime through its tunnel); a
    BoxError with the fix stops the campaign here rather than failing every run. A command
    driver's runtime is not reached over HTTP and runs on the box anyway: nothing to do.
    """
    if profile.driver is not None or not isinstance(box, SshBox):
        return None
    box.check_forwarding()
    if not box.spec.drives_on_box:
        return None
    return ship_driver(box, remote_root)


def ship_driver(box: SshBox, remote_root: str) -> BoxDriver:
    """Upload the driver archive under ``remote_root`` (once per code version) and check that
    it starts on the box; a BoxError with the remedy if it does not (no aiohttp there)."""
    data, digest = driver_archive()
    remote = box.home_path(f"{remote_root}/driver/harness-driver-{digest[:16]}.zip")
    if not box.exists(remote):
        with tempfile.TemporaryDirectory(prefix="harness-driver-") as tmp:
            local = Path(tmp) / "driver.zip"
            local.write_bytes(data)
            box.put_file(local, remote + ".part")
        box.sh(f"mv -f {shell_command([remote + '.part', remote])}")
    driver = BoxDriver(box, remote, box.spec.python_path())
    driver.check()
    return driver
