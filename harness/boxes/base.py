"""The box interface: where commands run, and the one shell text every box runs.

Every box runs the same shell text built by :func:`shell_command`, so quoting is written once and
tested on both paths: every argv item and env value is ``shlex.quote``-d, the environment goes
inline (sshd drops protocol env), and a background server is started with ``setsid nohup … &`` so
its PID is also its process-group id and the whole group can be signalled. :class:`Box` is the
interface and what its kinds share (starting, signalling and waiting for process groups, cache
eviction, free ports); :mod:`.local` runs subprocesses here, :mod:`.ssh` runs them through fabric.

Servers on every box listen on 127.0.0.1; an SSH box reaches them through tunnels over its own
connection (:mod:`.tunnel`), so the server under test is never open to the network.
"""

import re
import shlex
import tarfile
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BoxError
from harness.profiles.box import BoxSpec

# Evicts files from the page cache without root: POSIX_FADV_DONTNEED drops their clean pages.
_EVICT_SNIPPET = (
    "import os,sys\n"
    "for p in sys.argv[1:]:\n"
    "    fd=os.open(p,os.O_RDONLY)\n"
    "    os.fsync(fd)\n"
    "    os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)\n"
)
_GLOB_SNIPPET = (
    "import glob,sys\nfor p in sys.argv[1:]:\n    print(*sorted(glob.glob(p)), sep=chr(10))"
)
_FREE_PORT_SNIPPET = (
    "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Seconds between the remote timeout's TERM and its KILL.


@dataclass(frozen=True)
class CommandResult:
    """Exit status and output of one command on a box."""

    code: int
    stdout: str
    stderr: str


def shell_command(
    argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> str:
    """Shell text that runs ``argv`` with ``env`` in ``cwd``; every value is quoted literally."""
    parts: list[str] = []
    if cwd:
        parts.append(f"cd {quote_path(cwd)} &&")
    if env:
        parts.append("env")
        for key, value in env.items():
            if not key or "=" in key:
                raise BoxError(f"environment variable name {key!r} is invalid (empty or has '=')")
            parts.append(shlex.quote(f"{key}={value}"))
    parts.extend(shlex.quote(item) for item in argv)
    return " ".join(parts)


def export_prefix(env: Mapping[str, str]) -> str:
    """``export K=V; …`` text that sets ``env`` for a whole shell script, not one command."""
    exports = []
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(key):
            raise BoxError(f"box env: {key!r} is not a valid environment variable name")
        exports.append(f"export {shlex.quote(f'{key}={value}')}; ")
    return "".join(exports)


def quote_path(path: str) -> str:
    """Quote a path for the shell, keeping a leading ``~/`` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _group_alive_command(pgid: int) -> str:
    # `kill -0` succeeds on zombies, and a server whose parent shell has exited is reparented to
    # PID 1, which in containers often never reaps it; so a zombie-only group counts as gone.
    # The leader (pid == pgid) counts too: right after the fork, before `setsid` has run, its
    # group id is still the shell's.
    group = int(pgid)
    return (
        "if command -v ps >/dev/null 2>&1; then "
        f"ps -A -o pid= -o pgid= -o stat= | awk -v g={group} "
        "'($1 == g || $2 == g) && $3 !~ /^Z/ {alive = 1} END {exit !alive}'; "
        f"else kill -0 -- -{group} 2>/dev/null || kill -0 {group} 2>/dev/null; fi"
    )


class Box(ABC):
    """A place commands run; subclasses provide ``sh`` and file transfer."""

    def __init__(self, name: str, spec: BoxSpec) -> None:
        self.name = name
        self.spec = spec
        self._home: str | None = None

    @abstractmethod
    def sh(self, command: str, *, timeout_s: float = 60, check: bool = True) -> CommandResult:
        """Run shell text; raise BoxError on a non-zero exit when ``check``."""

    @abstractmethod
    def put_file(self, local: Path, remote: str) -> None:
        """Copy one file onto the box."""

    @abstractmethod
    def get_file(self, remote: str, local: Path) -> None:
        """Copy one file from the box."""

    @abstractmethod
    def http_base(self, port: int) -> str:
        """The URL the harness reaches a server on the box's 127.0.0.1:``port`` at."""

    def local_path(self, path: str) -> Path | None:
        """``path`` as this process can open it, when the box is this machine; else None (a
        caller copies the file instead)."""
        return None

    def release_http(self, port: int) -> None:  # noqa: B027 - optional hook
        """The server at ``port`` has stopped: release what :meth:`http_base` opened for it."""

    @property
    def where(self) -> str:
        """The box as error messages name it."""
        return f"box {self.name}"

    @property
    def bind_host(self) -> str:
        """Address servers on the box listen on: loopback only, on every box (an SSH box's are
        reached through a tunnel), so nobody else can talk to the server under test."""
        return "127.0.0.1"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def _failed(self, command: str, result: CommandResult) -> BoxError:
        return BoxError(
            f"{self.where}: command failed (exit {result.code}): {command}\n"
            f"{result.stderr.strip()[-2000:]}"
        )

    # ---- derived operations, written once over sh() ------------------------------------------

    def home_path(self, path: str) -> str:
        """Absolute form of a path that may start with ``~/`` (the box's $HOME, asked once)."""
        if not path.startswith("~"):
            return path
        if self._home is None:
            self._home = self.sh('printf %s "$HOME"').stdout
        return self._home + path[1:]

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""
        self.sh(f"mkdir -p {quote_path(path)}")

    def read_text(self, path: str, *, tail_bytes: int | None = None) -> str:
        """Text of a file on the box ('' when missing)."""
        reader = f"tail -c {int(tail_bytes)}" if tail_bytes else "cat"
        result = self.sh(f"{reader} {quote_path(path)} 2>/dev/null", check=False)
        return result.stdout

    def exists(self, path: str) -> bool:
        """True when ``path`` exists on the box."""
        return self.sh(f"test -e {quote_path(path)}", check=False).code == 0

    def start_background(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log_path: str
    ) -> int:
        """Start a server detached from this shell; returns its PID, which is also its group id.

        ``setsid`` is exec'd by a background job, which is never a group leader, so it calls
        setsid() itself without forking; ``nohup``, ``sh`` and ``env`` exec in turn, so the PID
        ``$!`` reports is the server's, and the server leads its own session and process group.
        The ``cd`` runs inside that ``sh``: ``cd X && cmd &`` would background a subshell instead.
        """
        inner = "exec " + shell_command(argv, env)
        if cwd:
            inner = f"cd {quote_path(cwd)} && {inner}"
        command = (
            f"setsid nohup sh -c {shlex.quote(inner)} "
            f"</dev/null >{quote_path(log_path)} 2>&1 & echo $!"
        )
        result = self.sh(command, timeout_s=30)
        try:
            return int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BoxError(f"{self.where}: could not start {argv[0]}: {result.stderr}") from None

    def group_alive(self, pgid: int) -> bool:
        """True while any process of the group is alive (zombies do not count)."""
        return self.sh(_group_alive_command(pgid), check=False).code == 0

    def groups_marked(self, name: str, value: str) -> list[int]:
        """Process groups of processes whose environment has ``name=value`` (Linux /proc;
        elsewhere none are found). The runner marks each runtime it boots this way."""
        wanted = shlex.quote(f"{name}={value}")
        script = (
            "for f in /proc/[0-9]*/environ; do "
            f"if tr '\\0' '\\n' < \"$f\" 2>/dev/null | grep -qxF -- {wanted}; then "
            'p=${f#/proc/}; p=${p%/environ}; ps -o pgid= -p "$p" 2>/dev/null; fi; done'
        )
        found = self.sh(script, check=False, timeout_s=60).stdout.split()
        return sorted({int(g) for g in found if g.isdigit() and int(g) > 1})

    def signal_group(self, pgid: int, signal: str) -> None:
        """Send ``signal`` (TERM, INT, KILL) to the whole process group."""
        self.sh(f"kill -s {shlex.quote(signal)} -- -{int(pgid)} 2>/dev/null", check=False)

    def wait_group_gone(self, pgid: int, timeout_s: float) -> bool:
        """Poll until no process of the group is alive; False if one still is at the deadline."""
        deadline = time.monotonic() + timeout_s
        pause = 0.01  # most runtimes are gone within milliseconds of the signal: look soon
        while True:
            if not self.group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(0.1, pause * 2)

    def free_port(self) -> int:
        """A TCP port free on the box right now."""
        command = shell_command([self.spec.python_path(), "-c", _FREE_PORT_SNIPPET])
        text = self.sh(command).stdout.strip()
        try:
            return int(text)
        except ValueError:
            raise BoxError(f"{self.where}: free port probe printed {text!r}") from None

    def glob(self, patterns: Sequence[str]) -> list[str]:
        """Files on the box matching glob patterns (expanded by Python there, not a shell)."""
        if not patterns:
            return []
        command = shell_command([self.spec.python_path(), "-c", _GLOB_SNIPPET, *patterns])
        return [line for line in self.sh(command).stdout.splitlines() if line]

    def evict_from_page_cache(self, paths: Sequence[str]) -> bool:
        """Drop files from the page cache (Linux fadvise, macOS ``purge``); False if impossible."""
        if not paths:
            return True
        if self.spec.platform == "macos-metal":
            return self.sh("sudo -n purge", check=False).code == 0
        command = shell_command([self.spec.python_path(), "-c", _EVICT_SNIPPET, *paths])
        return self.sh(command, check=False).code == 0

    def swapout_pages(self) -> int | None:
        """Pages swapped out since boot (Linux pswpout, macOS vm_stat), or None when unknown."""
        if self.spec.platform == "macos-metal":
            result = self.sh("vm_stat", check=False)
            for line in result.stdout.splitlines():
                if line.startswith("Swapouts:"):
                    return int(line.split(":")[1].strip().rstrip("."))
            return None
        result = self.sh("grep '^pswpout ' /proc/vmstat", check=False)
        if result.code != 0:
            return None
        return int(result.stdout.split()[1])

    def sha256(self, path: str) -> str | None:
        """SHA-256 of a file on the box, or None when unreadable."""
        result = self.sh(
            f"(sha256sum {quote_path(path)} || shasum -a 256 {quote_path(path)}) 2>/dev/null",
            check=False,
        )
        return result.stdout.split()[0] if result.code == 0 and result.stdout else None

    def put_dir(self, local: Path, remote: str) -> None:
        """Copy a directory onto the box as one tar (put/get move single files)."""
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "dir.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(local, arcname=".")
            staging = f"{remote.rstrip('/')}.upload.tar"
            self.mkdirs(remote)
            self.put_file(archive, staging)
            unpack = f"tar -xf {quote_path(staging)} -C {quote_path(remote)}"
            self.sh(f"{unpack} && rm -f {quote_path(staging)}")

    def get_dir(self, remote: str, local: Path) -> None:
        """Copy a directory from the box as one tar."""
        staging = f"{remote.rstrip('/')}.download.tar"
        self.sh(f"tar -cf {quote_path(staging)} -C {quote_path(remote)} .")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                archive = Path(tmp) / "dir.tar"
                self.get_file(staging, archive)
                local.mkdir(parents=True, exist_ok=True)
                with tarfile.open(archive) as tar:
                    tar.extractall(local, filter="data")
        finally:
            self.sh(f"rm -f {quote_path(staging)}", check=False)
