"""Boxes: where commands run. ``local`` runs subprocesses here; ``ssh`` runs them through fabric.

Both boxes run the same shell text built by :func:`shell_command`, so quoting is written once and
tested on both paths: every argv item and env value is ``shlex.quote``-d, the environment goes
inline (sshd drops protocol env), and a background server is started with ``setsid nohup … &`` so
its PID is also its process-group id and the whole group can be signalled.

Servers on every box listen on 127.0.0.1; an SSH box reaches them through tunnels over its own
connection (:mod:`.tunnel`), so the server under test is never open to the network.

Over SSH every command runs under a guard on the box (``timeout``, ``gtimeout``, or perl where
neither is installed, as on stock macOS), because a command that times out here keeps running
there; a box with none of them is refused. Host keys are checked against known_hosts unless the
box opts out.

It stays whole past the ~500-line mark: the local and SSH boxes are one job, two sides of one
interface over one shell text, and are best read side by side.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.boxes.tunnel import TunnelSet
from harness.errors import BoxError
from harness.profiles.schema import BoxSpec

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
_KILL_AFTER_S = 5
# Seconds to wait for the box's sshd to open a channel.
_CHANNEL_OPEN_TIMEOUT_S = 15
# Extra seconds the local side waits beyond the remote guard before giving up on the channel.
_LOCAL_SLACK_S = 15
# coreutils' `timeout` where there is none (stock macOS has perl): the command runs in its own
# process group, TERM goes to the whole group at the deadline and KILL after the grace, and the
# exit status is timeout's (124 after TERM, 137 after KILL, 128+N for a signal, else the code).
# Perl's waitpid retries after a signal handler runs, so the alarm needs no polling loop.
_PERL_GUARD = """
use POSIX ();
my ($limit, $grace) = splice(@ARGV, 0, 2);
my $pid = fork();
die "harness guard: fork: $!\\n" unless defined $pid;
if ($pid == 0) {
    setpgrp(0, 0);
    exec { $ARGV[0] } @ARGV;
    print STDERR "harness guard: $ARGV[0]: $!\\n";
    POSIX::_exit(127);
}
setpgrp($pid, $pid);
my $signalled = 0;
$SIG{ALRM} = sub {
    $signalled++;
    kill($signalled == 1 ? "TERM" : "KILL", -$pid);
    alarm($grace) if $signalled == 1;
};
alarm($limit);
waitpid($pid, 0);
my $status = $?;
alarm(0);
if ($signalled) {
    kill("KILL", -$pid);
    exit($signalled > 1 ? 137 : 124);
}
exit($status & 127 ? 128 + ($status & 127) : $status >> 8);
"""
# Exit status and stderr line of a box with no guard at all: the command is not run.
_NO_GUARD_EXIT = 125
_NO_GUARD = "harness: cannot guard commands: neither timeout, gtimeout nor perl is on the PATH"


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


class LocalBox(Box):
    """This machine: commands run as subprocesses of the harness."""

    def http_base(self, port: int) -> str:
        """Servers on this machine are reached on loopback, directly."""
        return f"http://127.0.0.1:{port}"

    def free_port(self) -> int:
        """A free loopback port, found in-process (no interpreter start per run)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
            return port

    def groups_marked(self, name: str, value: str) -> list[int]:
        """Process groups whose environment has ``name=value``, read from /proc in-process."""
        if not sys.platform.startswith("linux"):
            return super().groups_marked(name, value)
        wanted = f"{name}={value}".encode()
        groups = set()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if wanted in environ.read_bytes().split(b"\0"):
                    groups.add(os.getpgid(int(environ.parent.name)))
            except (OSError, ValueError):
                continue  # gone, or not ours to read
        return sorted(g for g in groups if g > 1)

    def group_alive(self, pgid: int) -> bool:
        """Read /proc directly on Linux (a `ps` per poll costs more than the poll interval)."""
        if not sys.platform.startswith("linux"):
            return super().group_alive(pgid)
        # The leader itself first: right after the fork, before `setsid` has run, its group
        # id is still the shell's, so a scan by group alone would call it dead.
        with contextlib.suppress(OSError, IndexError):
            leader = Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()
            if leader[0] != "Z":
                return True
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # the process exited while we looked
            # fields[0] is the state (Z = zombie, already dead), fields[2] the process group.
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False

    def sh(self, command: str, *, timeout_s: float = 60, check: bool = True) -> CommandResult:
        """Run shell text with bash; a timeout kills the whole process group."""
        script = export_prefix(self.spec.env) + command
        # A new session makes bash a group leader, so a timeout can kill its children too
        # (subprocess.run would kill bash alone and leave them running).
        with subprocess.Popen(
            ["bash", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as process:
            try:
                out, err = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.communicate(timeout=5)  # a setsid'd child may hold the pipes
                raise BoxError(
                    f"{self.where}: timed out after {timeout_s:g} s (killed): {command}"
                ) from exc
        # Bytes decoded by hand: text mode would turn "\r" into "\n" (universal newlines).
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        result = CommandResult(process.returncode, stdout, stderr)
        if check and result.code != 0:
            raise self._failed(command, result)
        return result

    def local_path(self, path: str) -> Path | None:
        """Every path on this machine opens in-process."""
        return Path(os.path.expanduser(path))

    def swapout_pages(self) -> int | None:
        """Linux's pswpout read in-process (twice a run); other systems through the shell."""
        if not sys.platform.startswith("linux"):
            return super().swapout_pages()
        try:
            with open("/proc/vmstat") as vmstat:
                for line in vmstat:
                    if line.startswith("pswpout "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return None

    # File operations in-process: a shell per read, test or copy cost a bash start each (about
    # 25 a run), the harness's own CPU that a fleet on a two-core machine competes with.

    def mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""
        try:
            Path(os.path.expanduser(path)).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BoxError(f"{self.where}: cannot create {path}: {exc.strerror}") from exc

    def read_text(self, path: str, *, tail_bytes: int | None = None) -> str:
        """Text of a file on this machine ('' when missing or unreadable)."""
        try:
            with open(os.path.expanduser(path), "rb") as handle:
                if tail_bytes:
                    size = handle.seek(0, os.SEEK_END)
                    handle.seek(max(0, size - int(tail_bytes)))
                data = handle.read()
        except OSError:
            return ""
        return data.decode("utf-8", "replace")

    def exists(self, path: str) -> bool:
        """True when ``path`` exists on this machine."""
        return os.path.lexists(os.path.expanduser(path))

    def put_file(self, local: Path, remote: str) -> None:
        """Copy a file on this machine."""
        self._copy(local, Path(os.path.expanduser(remote)))

    def get_file(self, remote: str, local: Path) -> None:
        """Copy a file on this machine."""
        self._copy(Path(os.path.expanduser(remote)), local)

    def _copy(self, source: Path, target: Path) -> None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)  # content and mode bits, as cp
        except OSError as exc:
            raise BoxError(
                f"{self.where}: cannot copy {source} -> {target}: {exc.strerror}"
            ) from exc


def remote_guard(command: str, timeout_s: float) -> str:
    """Shell text that runs ``command`` under a deadline on the box.

    ``timeout`` (``gtimeout`` with Homebrew's coreutils) puts itself in a new process group and
    signals the whole group when time is up, so children of the command die too; ``-k`` follows
    TERM with KILL. Without either, perl does the same (``_PERL_GUARD``). A box with none of them
    does not run the command: it exits ``_NO_GUARD_EXIT`` with ``_NO_GUARD`` on stderr, which
    :meth:`SshBox.sh` turns into an error with the remedy. The login shell must not ``exec`` the
    guard: bash started by sshd at SHLVL below 2 sources ~/.bashrc again, which doubled the cost
    of every command on a box with a heavy .bashrc.
    """
    limit_s = int(timeout_s) + 1
    body = shlex.quote(command)
    perl = f"perl -e {shlex.quote(_PERL_GUARD)} {limit_s} {_KILL_AFTER_S} bash -c {body}"
    return (
        "if command -v timeout >/dev/null 2>&1; then "
        f"timeout -k {_KILL_AFTER_S} {limit_s} bash -c {body}; "
        "elif command -v gtimeout >/dev/null 2>&1; then "
        f"gtimeout -k {_KILL_AFTER_S} {limit_s} bash -c {body}; "
        f"elif command -v perl >/dev/null 2>&1; then {perl}; "
        f"else echo {shlex.quote(_NO_GUARD)} >&2; exit {_NO_GUARD_EXIT}; fi"
    )


def _host_key_fix(host: str, port: int) -> str:
    target = f"-p {port} {host}" if port != 22 else host
    return (
        f"; check the key out of band, then add it with `ssh-keyscan {target} >> "
        "~/.ssh/known_hosts` (or set `insecure_accept_unknown_host_key: true` on the box)"
    )


class SshBox(Box):
    """A remote host over SSH (fabric), honouring ~/.ssh/config and checking known_hosts.

    Host keys come from ``~/.ssh/known_hosts``, the ssh config's ``UserKnownHostsFile`` and
    ``GlobalKnownHostsFile``, and the files in ``known_hosts``; an unknown key is refused unless
    the spec sets ``insecure_accept_unknown_host_key`` (accepted keys are never written to disk).
    """

    def __init__(self, name: str, spec: BoxSpec, *, known_hosts: Sequence[str | Path] = ()) -> None:
        super().__init__(name, spec)
        self.known_hosts = [Path(p).expanduser() for p in known_hosts]
        self._connection: Any = None
        self._target = f"{spec.user + '@' if spec.user else ''}{spec.host}"
        if spec.port:
            self._target += f":{spec.port}"
        self.tunnels = TunnelSet(self._open_direct, self.where)

    def http_base(self, port: int) -> str:
        """A tunnel's local URL: the server listens on the box's 127.0.0.1 only (:mod:`.tunnel`)."""
        self._connect()
        return self.tunnels.url(port)

    def release_http(self, port: int) -> None:
        """Close the tunnel to a server that has stopped."""
        self.tunnels.release(port)

    def _open_direct(self, remote: tuple[str, int], peer: tuple[str, int]) -> Any:
        """A ``direct-tcpip`` channel to ``remote`` on the box (called from tunnel threads; the
        transport is read afresh, so a reconnect by the main thread is picked up)."""
        connection = self._connection
        if connection is None or connection.transport is None:
            raise EOFError("not connected")
        return connection.transport.open_channel(
            "direct-tcpip", remote, peer, timeout=_CHANNEL_OPEN_TIMEOUT_S
        )

    def exec_channel(self, command: str, timeout_s: float) -> Any:
        """Start shell text under the box's guard on a channel of its own and return the channel
        (paramiko's), for a caller that streams stdin and stdout; ``timeout_s`` bounds it there."""
        guarded = remote_guard(export_prefix(self.spec.env) + command, timeout_s)
        try:
            channel = self._connect().transport.open_session(timeout=_CHANNEL_OPEN_TIMEOUT_S)
            channel.exec_command(guarded)
        except Exception as exc:  # paramiko raises many types; name the box
            raise BoxError(f"{self.where}: cannot start {command[:200]}: {exc}") from exc
        return channel

    def check_forwarding(self) -> None:
        """Raise BoxError, with the fix, when the box's sshd refuses to forward ports."""
        self._connect()
        self.tunnels.probe()

    def round_trips(self) -> dict[str, Any]:
        """Round-trip times of a tunnel and of the SSH channel (:func:`.echo_round_trips`)."""
        self._connect()

        def start_echo(command: str) -> Any:
            return self.exec_channel(command, 60)

        return self.tunnels.round_trips(start_echo, self.spec.python_path())

    @property
    def where(self) -> str:
        """The box and the ssh target it resolves to (user@host:port)."""
        return f"box {self.name} ({self._target})"

    def _secure(self, connection: Any) -> None:
        """Host-key policy for a connection and each gateway under it (fabric auto-adds)."""
        import paramiko

        client = connection.client
        client.load_system_host_keys()  # ~/.ssh/known_hosts, read only (never saved to)
        extra = list(self.known_hosts)
        for key in ("userknownhostsfile", "globalknownhostsfile"):
            value = connection.ssh_config.get(key)
            if isinstance(value, list):
                value = " ".join(value)
            if value:
                extra.extend(Path(p).expanduser() for p in str(value).split())
        extra.append(Path("/etc/ssh/ssh_known_hosts"))
        for path in extra:
            if path.is_file():
                try:
                    client.load_system_host_keys(str(path))
                except (OSError, paramiko.SSHException) as exc:
                    raise BoxError(f"{self.where}: cannot read known_hosts {path}: {exc}") from exc
            elif path in self.known_hosts:
                raise BoxError(f"{self.where}: known_hosts file {path} does not exist")
        policy = (
            paramiko.AutoAddPolicy()
            if self.spec.insecure_accept_unknown_host_key
            else paramiko.RejectPolicy()
        )
        client.set_missing_host_key_policy(policy)
        gateway = getattr(connection, "gateway", None)
        if gateway is not None and not isinstance(gateway, str):
            self._secure(gateway)

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
        try:
            connection = Connection(
                host=self.spec.host,
                user=self.spec.user,
                port=self.spec.port,
                config=config,
                gateway=gateway,
                connect_kwargs=connect_kwargs,
                connect_timeout=15,
            )
        except Exception as exc:  # fabric parses ssh config and host strings; name the box
            raise BoxError(f"{self.where}: bad ssh settings: {exc}") from exc
        self._target = f"{connection.user}@{connection.host}:{connection.port}"
        self.tunnels.where = self.where
        self._secure(connection)
        try:
            connection.open()
        except paramiko.BadHostKeyException as exc:
            raise BoxError(
                f"{self.where}: the host key does not match known_hosts ({exc}); if the host "
                "was really reinstalled, remove the old line with `ssh-keygen -R HOST`, "
                "otherwise do not connect"
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise BoxError(
                f"{self.where}: authentication failed ({exc}); check `user` and `key` on the "
                f"box, and that the key is in the box's authorized_keys (`ssh-copy-id`)"
            ) from exc
        except paramiko.SSHException as exc:
            hint = (
                _host_key_fix(connection.host, int(connection.port))
                if "not found in known_hosts" in str(exc)
                else ""
            )
            raise BoxError(f"{self.where}: ssh: {exc}{hint}") from exc
        except OSError as exc:
            raise BoxError(
                f"{self.where}: cannot reach the host: {exc}; check `host` and `port`, and that "
                "sshd runs there"
            ) from exc
        self._connection = connection
        return connection

    def sh(self, command: str, *, timeout_s: float = 60, check: bool = True) -> CommandResult:
        """Run shell text remotely; ``timeout`` on the box kills it there, not only here."""
        guarded = remote_guard(export_prefix(self.spec.env) + command, timeout_s)
        connection = self._connect()
        started = time.monotonic()
        try:
            result = connection.run(
                guarded, timeout=timeout_s + _LOCAL_SLACK_S, hide=True, warn=True, in_stream=False
            )
        except Exception as exc:  # fabric/invoke/paramiko raise many types; wrap them all
            raise BoxError(f"{self.where}: {type(exc).__name__}: {exc}: {command}") from exc
        elapsed_s = time.monotonic() - started
        outcome = CommandResult(result.exited, result.stdout, result.stderr)
        if outcome.code == _NO_GUARD_EXIT and _NO_GUARD in outcome.stderr:
            raise BoxError(
                f"{self.where}: cannot guard commands: neither timeout, gtimeout nor perl is on "
                "the box's PATH, so a command that timed out here would keep running there "
                f"(not run: {command}); install coreutils (macOS: `brew install coreutils`) or "
                "perl on the box"
            )
        # timeout exits 124 after its TERM (137 after the KILL); the command may exit so itself,
        # so only count it as a timeout when the guard's limit has really passed.
        if outcome.code in (124, 137) and elapsed_s >= int(timeout_s) + 0.5:
            raise BoxError(
                f"{self.where}: timed out after {timeout_s:g} s (killed there): {command}"
            )
        if check and outcome.code != 0:
            raise self._failed(command, outcome)
        return outcome

    def _transfer_error(self, what: str, exc: Exception) -> BoxError:
        text = str(exc).lower()
        hint = ""
        if any(sign in text for sign in ("sftp", "eof during negotiation", "channel closed")):
            hint = "; transfers need SFTP on the box (Debian: apt-get install openssh-sftp-server)"
        return BoxError(f"{self.where}: {what}: {type(exc).__name__}: {exc}{hint}")

    def put_file(self, local: Path, remote: str) -> None:
        """Upload one file (sftp)."""
        target = self.home_path(remote)
        self.mkdirs(os.path.dirname(target) or ".")
        try:
            self._connect().put(str(local), target)
        except Exception as exc:
            raise self._transfer_error(f"upload {local} -> {remote}", exc) from exc

    def get_file(self, remote: str, local: Path) -> None:
        """Download one file (sftp)."""
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._connect().get(self.home_path(remote), str(local))
        except Exception as exc:
            raise self._transfer_error(f"download {remote} -> {local}", exc) from exc

    def close(self) -> None:
        """Close the tunnels and the SSH connection (and its gateway)."""
        self.tunnels.close()
        if self._connection is not None:
            self._connection.close()
            gateway = getattr(self._connection, "gateway", None)
            if gateway is not None and not isinstance(gateway, str):
                gateway.close()
            self._connection = None


def open_box(name: str, spec: BoxSpec) -> Box:
    """The box for a spec."""
    if spec.kind == "local":
        return LocalBox(name, spec)
    if spec.kind == "slurm":
        # Its cohorts run as jobs on the cluster's nodes (execute/slurm); no shell to open.
        raise BoxError(
            f"box {name} is a slurm box: its cohorts run as Slurm jobs, not commands over a shell; "
            "run it through a campaign, or check it with `harness box check`"
        )
    return SshBox(name, spec, known_hosts=[spec.known_hosts] if spec.known_hosts else [])
