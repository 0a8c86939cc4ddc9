"""Boxes: where commands run. ``local`` runs subprocesses here; ``ssh`` runs them through fabric.

Both boxes run the same shell text built by :func:`shell_command`, so quoting is written once and
tested on both paths: every argv item and env value is ``shlex.quote``-d, the environment goes
inline (sshd drops protocol env), and a background server is started with ``setsid nohup … &`` so
its PID is also its process-group id and the whole group can be signalled.
"""

from __future__ import annotations

import shlex
import subprocess
import tarfile
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import BoxError
from harness.profiles import BoxSpec

# Evicts files from the page cache without root: POSIX_FADV_DONTNEED drops their clean pages.
_EVICT_SNIPPET = (
    "import os,sys\n"
    "for p in sys.argv[1:]:\n"
    "    fd=os.open(p,os.O_RDONLY)\n"
    "    os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)\n"
)
_FREE_PORT_SNIPPET = (
    "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])"
)


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
        parts.extend(shlex.quote(f"{key}={value}") for key, value in env.items())
    parts.extend(shlex.quote(item) for item in argv)
    return " ".join(parts)


def quote_path(path: str) -> str:
    """Quote a path for the shell, keeping a leading ``~/`` expandable."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class Box(ABC):
    """A place commands run; subclasses provide ``sh`` and file transfer."""

    def __init__(self, name: str, spec: BoxSpec) -> None:
        self.name = name
        self.spec = spec

    @abstractmethod
    def sh(self, command: str, *, timeout_s: float = 60, check: bool = True) -> CommandResult:
        """Run shell text; raise BoxError on a non-zero exit when ``check``."""

    @abstractmethod
    def put_file(self, local: Path, remote: str) -> None:
        """Copy one file onto the box."""

    @abstractmethod
    def get_file(self, remote: str, local: Path) -> None:
        """Copy one file from the box."""

    @property
    @abstractmethod
    def http_host(self) -> str:
        """Host name the harness uses to reach servers on the box."""

    @property
    def bind_host(self) -> str:
        """Address servers on the box should listen on."""
        return "127.0.0.1" if self.spec.kind == "local" else "0.0.0.0"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    # ---- derived operations, written once over sh() ------------------------------------------

    def home_path(self, path: str) -> str:
        """Absolute form of a path that may start with ``~/``."""
        if not path.startswith("~"):
            return path
        home = self.sh('printf %s "$HOME"').stdout
        return home + path[1:]

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
        """Start a server detached from this shell; returns its PID, which is also its group id."""
        inner = shell_command(argv, env)
        cd = f"cd {quote_path(cwd)} && " if cwd else ""
        command = (
            f"{cd}setsid nohup sh -c {shlex.quote('exec ' + inner)} "
            f"</dev/null >{quote_path(log_path)} 2>&1 & echo $!"
        )
        result = self.sh(command, timeout_s=30)
        try:
            return int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise BoxError(f"box {self.name}: could not start {argv[0]}: {result.stderr}") from None

    def group_alive(self, pgid: int) -> bool:
        """True while any process of the group is alive."""
        return self.sh(f"kill -0 -- -{int(pgid)} 2>/dev/null", check=False).code == 0

    def signal_group(self, pgid: int, signal: str) -> None:
        """Send ``signal`` (TERM, INT, KILL) to the whole process group."""
        self.sh(f"kill -s {shlex.quote(signal)} -- -{int(pgid)} 2>/dev/null", check=False)

    def free_port(self) -> int:
        """A TCP port free on the box right now."""
        command = shell_command([self.spec.python_path(), "-c", _FREE_PORT_SNIPPET])
        return int(self.sh(command).stdout.strip())

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
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "dir.tar"
            self.get_file(staging, archive)
            local.mkdir(parents=True, exist_ok=True)
            with tarfile.open(archive) as tar:
                tar.extractall(local, filter="data")
        self.sh(f"rm -f {quote_path(staging)}", check=False)


class LocalBox(Box):
    """This machine: commands run as subprocesses of the harness."""

    @property
    def http_host(self) -> str:
        """Servers on this machine are reached on loopback."""
        return "127.0.0.1"

    def sh(self, command: str, *, timeout_s: float = 60, check: bool = True) -> CommandResult:
        """Run shell text with bash; a timeout kills the whole process group."""
        env_prefix = shell_command([], self.spec.env) + " " if self.spec.env else ""
        try:
            done = subprocess.run(
                ["bash", "-c", env_prefix + command],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BoxError(f"box {self.name}: timed out after {timeout_s:g} s: {command}") from exc
        result = CommandResult(done.returncode, done.stdout, done.stderr)
        if check and result.code != 0:
            raise BoxError(
                f"box {self.name}: command failed (exit {result.code}): {command}\n"
                f"{result.stderr.strip()[-2000:]}"
            )
        return result

    def put_file(self, local: Path, remote: str) -> None:
        """Copy a file on this machine."""
        self.sh(f"mkdir -p {quote_path(str(Path(remote).parent))}")
        self.sh(f"cp {shlex.quote(str(local))} {quote_path(remote)}")

    def get_file(self, remote: str, local: Path) -> None:
        """Copy a file on this machine."""
        local.parent.mkdir(parents=True, exist_ok=True)
        self.sh(f"cp {quote_path(remote)} {shlex.quote(str(local))}")


class SshBox(Box):
    """A remote host over SSH (fabric), honouring ~/.ssh/config and known_hosts."""

    def __init__(self, name: str, spec: BoxSpec) -> None:
        super().__init__(name, spec)
        self._connection: Any = None

    @property
    def http_host(self) -> str:
        """Servers on the box are reached at its host name."""
        assert self.spec.host is not None
        return self.spec.host

    def _connect(self) -> Any:
        if self._connection is not None:
            return self._connection
        import paramiko
        from fabric import Config, Connection

        connect_kwargs: dict[str, Any] = {}
        if self.spec.key:
            connect_kwargs["key_filename"] = str(Path(self.spec.key).expanduser())
        config = Config(overrides={"run": {"hide": True, "warn": True}})
        gateway = Connection(self.spec.gateway, config=config) if self.spec.gateway else None
        connection = Connection(
            host=self.spec.host,
            user=self.spec.user,
            port=self.spec.port,
            config=config,
            gateway=gateway,
            connect_kwargs=connect_kwargs,
            connect_timeout=15,
        )
        client = connection.client
        client.load_system_host_keys()
        known = Path("~/.ssh/known_hosts").expanduser()
        if known.is_file():
            client.load_host_keys(str(known))
        policy = (
            paramiko.AutoAddPolicy()
            if self.spec.insecure_accept_unknown_host_key
            else paramiko.RejectPolicy()
        )
        client.set_missing_host_key_policy(policy)
        try:
            connection.open()
        except paramiko.SSHException as exc:
            hint = (
                "; add the host key (ssh-keyscan) to ~/.ssh/known_hosts or set "
                "insecure_accept_unknown_host_key: true on the box"
                if "not found in known_hosts" in str(exc)
                else ""
            )
            raise BoxError(f"box {self.name}: ssh to {self.spec.host}: {exc}{hint}") from exc
        except OSError as exc:
            raise BoxError(f"box {self.name}: cannot reach {self.spec.host}: {exc}") from exc
        self._connection = connection
        return connection

    def sh(self, command: str, *, timeout_s: float = 60, check: bool = True) -> CommandResult:
        """Run shell text remotely; ``timeout`` on the box kills it there, not only here."""
        env_prefix = shell_command([], self.spec.env) + " " if self.spec.env else ""
        guarded = f"timeout -k 5 {int(timeout_s) + 1} bash -c {shlex.quote(env_prefix + command)}"
        connection = self._connect()
        try:
            result = connection.run(
                guarded, timeout=timeout_s + 15, hide=True, warn=True, in_stream=False
            )
        except Exception as exc:  # fabric/invoke/paramiko raise many types; wrap them all
            raise BoxError(f"box {self.name}: {type(exc).__name__}: {exc}: {command}") from exc
        outcome = CommandResult(result.exited, result.stdout, result.stderr)
        if outcome.code == 124:
            raise BoxError(
                f"box {self.name}: timed out after {timeout_s:g} s (killed there): {command}"
            )
        if check and outcome.code != 0:
            raise BoxError(
                f"box {self.name}: command failed (exit {outcome.code}): {command}\n"
                f"{outcome.stderr.strip()[-2000:]}"
            )
        return outcome

    def put_file(self, local: Path, remote: str) -> None:
        """Upload one file (sftp)."""
        target = self.home_path(remote)
        self.mkdirs(str(Path(target).parent))
        try:
            self._connect().put(str(local), target)
        except Exception as exc:
            raise BoxError(f"box {self.name}: upload {local} -> {remote}: {exc}") from exc

    def get_file(self, remote: str, local: Path) -> None:
        """Download one file (sftp)."""
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._connect().get(self.home_path(remote), str(local))
        except Exception as exc:
            raise BoxError(f"box {self.name}: download {remote}: {exc}") from exc

    def close(self) -> None:
        """Close the SSH connection."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def open_box(name: str, spec: BoxSpec) -> Box:
    """The box for a spec."""
    return LocalBox(name, spec) if spec.kind == "local" else SshBox(name, spec)
