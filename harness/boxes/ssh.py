"""The SSH box: a remote host over fabric, every command under a deadline on the box.

Over SSH every command runs under a guard on the box (``timeout``, ``gtimeout``, or perl where
neither is installed, as on stock macOS), because a command that times out here keeps running
there; a box with none of them is refused. Host keys are checked against known_hosts unless the
box opts out.
"""

import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.boxes.base import Box, CommandResult, export_prefix
from harness.boxes.tunnel import TunnelSet
from harness.errors import BoxError
from harness.formats.safe_write import atomic_path
from harness.profiles.box import BoxSpec

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
        try:
            with atomic_path(local) as tmp:
                self._connect().get(self.home_path(remote), str(tmp))
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
