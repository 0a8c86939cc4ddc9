"""A real OpenSSH server on 127.0.0.1 for the SSH box tests.

``start_sshd`` writes a throwaway host key, client key, ``authorized_keys``, ``known_hosts`` and
``sshd_config`` into a temporary folder and starts ``sshd -D -e`` as a child process on a free
loopback port; ``stop_sshd`` ends that process by its PID. Nothing outside the folder is touched,
except that sshd insists on its privilege-separation directory (``/run/sshd``) existing when it
runs as root, which Debian's service unit normally creates at boot.

Test modules use the session fixture by importing it: ``from tests.sshd import sshd``.
``sshd_with_path`` starts another one whose sessions lack some commands (``timeout``, ``perl``),
to stand for a box such as stock macOS.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/opt/homebrew/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")


class SshdError(RuntimeError):
    """The loopback sshd could not be started (test infrastructure, not the code under test)."""


@dataclass(frozen=True)
class LoopbackSshd:
    """A running loopback sshd and the files a client needs to reach it."""

    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_public_key: str
    directory: Path
    log_path: Path
    pid: int

    @property
    def host(self) -> str:
        """The address it listens on."""
        return "127.0.0.1"

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of sshd's own log (``-e``), for failure messages."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-max_chars:]
        except OSError:
            return ""


def find_sshd() -> str | None:
    """The sshd binary, or None when openssh-server is not installed."""
    found = shutil.which("sshd")
    if found:
        return found
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair without passphrase; returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text(encoding="utf-8").strip()


def _config_text(directory: Path, port: int, extra: Sequence[str] = ()) -> str:
    # Every path is absolute and inside `directory`; nothing reads the system sshd_config.
    return "\n".join(
        [
            *extra,
            "ListenAddress 127.0.0.1",
            f"Port {port}",
            f"HostKey {directory / 'host_ed25519'}",
            f"PidFile {directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            "AuthenticationMethods publickey",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "PermitRootLogin yes",
            "MaxSessions 64",
            "MaxStartups 64",
            "LogLevel INFO",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def _wait_listening(process: subprocess.Popen[bytes], port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                # sshd sends its banner first; a banner means it really is sshd on that port.
                if conn.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            time.sleep(0.05)
    return False


def start_sshd(
    directory: Path, extra_config: Sequence[str] = ()
) -> tuple[LoopbackSshd, subprocess.Popen[bytes]]:
    """Write keys and config into ``directory`` and start sshd on a free loopback port.

    ``extra_config`` lines go first in ``sshd_config`` (e.g. ``SetEnv PATH=…`` for a box whose
    sessions see a different PATH)."""
    binary = find_sshd()
    if binary is None:
        raise SshdError(
            "sshd is not installed; the SSH box tests need a real sshd on 127.0.0.1. "
            "Install it with `make sysdeps` (Debian: apt-get install openssh-server)"
        )
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        # sshd running as root refuses to start without its privsep chroot (root-owned, 0755).
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    host_public = _keygen(directory / "host_ed25519", "harness-test-host")
    client_public = _keygen(directory / "client_ed25519", "harness-test-client")
    (directory / "authorized_keys").write_text(client_public + "\n", encoding="utf-8")
    log_path = directory / "sshd.log"
    last_log = ""
    for _attempt in range(3):  # a free port can be taken between probing and binding
        port = _free_loopback_port()
        config = directory / "sshd_config"
        config.write_text(_config_text(directory, port, extra_config), encoding="utf-8")
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [binary, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if _wait_listening(process, port, timeout_s=10):
            key_type, key_text = host_public.split()[:2]
            known_hosts = directory / "known_hosts"
            known_hosts.write_text(f"[127.0.0.1]:{port} {key_type} {key_text}\n", encoding="utf-8")
            server = LoopbackSshd(
                port=port,
                user=getpass.getuser(),
                client_key=directory / "client_ed25519",
                known_hosts=known_hosts,
                host_public_key=f"{key_type} {key_text}",
                directory=directory,
                log_path=log_path,
                pid=process.pid,
            )
            return server, process
        stop_process(process)
        last_log = log_path.read_text(encoding="utf-8", errors="replace")
    raise SshdError(f"sshd ({binary}) did not start on 127.0.0.1; its log:\n{last_log[-4000:]}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop the sshd child by its PID: TERM, then KILL after 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@contextlib.contextmanager
def sshd_with_path(directory: Path, hidden: Sequence[str]) -> Iterator[LoopbackSshd]:
    """A loopback sshd whose sessions' PATH holds every command of this machine's PATH except
    ``hidden`` (e.g. ``timeout``, to stand for a stock macOS box); stopped on exit."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in sorted(os.listdir(folder)):
            target = Path(folder) / entry
            link = bin_dir / entry
            if entry in hidden or link.exists() or link.is_symlink():
                continue
            if target.is_file() and os.access(target, os.X_OK):
                link.symlink_to(target)
    try:
        server, process = start_sshd(directory / "sshd", [f"SetEnv PATH={bin_dir}"])
    except (SshdError, subprocess.CalledProcessError, OSError) as exc:
        pytest.fail(f"loopback sshd unavailable: {exc}", pytrace=False)
    try:
        yield server
    finally:
        stop_process(process)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSshd]:
    """A loopback sshd for the whole session; fails (never skips) when sshd is missing."""
    directory = tmp_path_factory.mktemp("sshd")
    try:
        server, process = start_sshd(directory)
    except (SshdError, subprocess.CalledProcessError, OSError) as exc:
        pytest.fail(f"loopback sshd unavailable: {exc}", pytrace=False)
    try:
        yield server
    finally:
        stop_process(process)
