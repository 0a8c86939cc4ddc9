"""Each CLI call of the tests as its own process, forked from a harness that has imported already.

`python -m harness gate DIR` spends about a second importing pandas, pyarrow, matplotlib, scipy
and the harness's stages before it reads the directory, and the suite's fast tier makes a few
hundred such calls. A *fork server* pays that once per xdist worker: a single-threaded Python
started with the same interpreter and environment imports those modules, then forks one child per
call. The child is a real process, as before: its own pid, working directory, environment,
stdout and stderr (files the caller reads), the command's own `entry()` with `sys.argv` as
`python -m harness` sets it, its own exit code, the interpreter's own exit (atexit handlers,
flushes). Nothing a call does reaches the next one, as each is forked from the untouched server.

What a fork cannot give a call, it does not fake: an environment that changes how Python itself
starts (a `PYTHON*` variable other than `PYTHONPATH`, which only adds to `sys.path`) runs the call
as a fresh `python -m harness` instead, and so does every call when `HARNESS_TEST_CLI=spawn`
(the way to rule the fork out when a test behaves differently under it).

Run as a script, this module is the server: ``python tests/cli_fork.py SOCKET``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What `python -m harness` would find as sys.argv[0].
_MAIN = str(Path(__file__).resolve().parent.parent / "harness" / "__main__.py")
# The stages most commands import; a command that needs another imports it in its child.
_PRELOAD = (
    "harness.cli",
    "harness.spine",
    "harness.analyze.campaign",
    "harness.report",
    "harness.report.figures",
    "harness.gate.commands",
    "harness.card",
    "matplotlib.backends.backend_agg",
    "pyarrow.parquet",
    "jinja2",
)


@dataclass
class Finished:
    """What a forked call did: its exit code and its two streams, as text."""

    code: int
    stdout: str
    stderr: str


# The server.


def _serve(path: str) -> None:
    import importlib

    from harness.threads import one_blas_thread

    one_blas_thread()  # before numpy loads, as `entry()` does
    for module in _PRELOAD:
        importlib.import_module(module)
    # Arrow's jemalloc keeps a purging thread, which jemalloc's own fork handlers take care of.
    threads = [
        Path(f"/proc/self/task/{task}/comm").read_text().strip()
        for task in os.listdir("/proc/self/task")
    ]
    others = [name for name in threads[1:] if name != "jemalloc_bg_thd"]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # A fork of a process with other threads can inherit a lock one of them held: say so, and
    # the caller falls back to spawning.
    sys.stdout.write(json.dumps({"ready": not others, "threads": others}) + "\n")
    sys.stdout.flush()
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _child(connection)  # never returns
        connection.close()
        while True:  # reap the calls that have ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def _child(connection: socket.socket) -> None:
    """Run one call: read the request, become that process, exit as the command exits."""
    os.setpgid(0, 0)  # the caller's timeout stops the call and what it started, not the server
    with connection.makefile("rb") as reader:
        request = json.loads(reader.readline())
    connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(request[name], os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [_MAIN, *request["argv"]]
    from harness.cli import entry

    try:
        entry()
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc.code)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
    except BaseException:
        traceback.print_exc()
        code = 1
    # The interpreter's exit as far as anything can see it (threads joined, atexit handlers,
    # `weakref.finalize` clean-ups, flushed streams), without tearing down the modules the server
    # imported: that took longer than many a call.
    threading._shutdown()  # type: ignore[attr-defined]  # joins the command's own threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    connection.sendall(json.dumps({"code": code}).encode() + b"\n")
    os._exit(code)


def _exit_status(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    return 1  # a message: Python prints it and exits 1


# The client.


class ForkServer:
    """One server per test process, started on first use, stopped by pid when the process ends."""

    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="harness-cli-fork-")
        self.socket = os.path.join(self._folder, "socket")
        env = dict(os.environ)
        env.pop("PYTHONWARNINGS", None)
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.socket],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert self.process.stdout is not None
        hello = json.loads(self.process.stdout.readline() or '{"ready": false}')
        self.ready = bool(hello["ready"])
        # Why it is not (the threads it found, or that it did not start): calls then spawn.
        self.why_not = "" if self.ready else f"threads beside the main one: {hello.get('threads')}"
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a call with ``env`` may be forked: every variable that changes how Python
        starts is as the server started with it."""

        def starting(variables: dict[str, str]) -> dict[str, str]:
            return {
                k: v for k, v in variables.items() if k.startswith("PYTHON") and k != "PYTHONPATH"
            }

        return self.ready and self.process.poll() is None and starting(env) == starting(self.env)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> Finished:
        """Run ``harness ARGV`` in a forked child; TimeoutExpired past ``timeout_s`` (the call
        and its process group killed first), as `subprocess.run` would raise it."""
        with tempfile.TemporaryDirectory(prefix="call-", dir=self._folder) as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            for name in (out, err):
                Path(name).touch()
            request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err}
            code = self._call(request, timeout_s, argv)
            return Finished(code, _text(out), _text(err))

    def _call(self, request: dict[str, Any], timeout_s: float, argv: list[str]) -> int:
        deadline = time.monotonic() + timeout_s
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(self.socket)
            connection.sendall(json.dumps(request).encode() + b"\n")
            messages: list[dict[str, int]] = []
            buffer = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    _kill(messages)
                    raise subprocess.TimeoutExpired(["harness", *argv], timeout_s)
                connection.settimeout(left)
                try:
                    chunk = connection.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                messages += [json.loads(line) for line in lines if line]
                if any("code" in m for m in messages):
                    break  # reported: a process it forked may still hold the connection
        codes = [m["code"] for m in messages if "code" in m]
        # A call killed by a signal never reported: read as Python's -N would be.
        return codes[-1] if codes else -signal.SIGKILL


def _kill(messages: list[dict[str, int]]) -> None:
    pids = [m["pid"] for m in messages if "pid" in m]
    if pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pids[0], signal.SIGKILL)


def _text(path: str) -> str:
    # As `subprocess.run(text=True)` decodes: the locale's encoding, universal newlines.
    with open(path, encoding=None, errors="strict") as stream:
        return stream.read()


if __name__ == "__main__":
    _serve(sys.argv[1])
