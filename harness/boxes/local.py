"""The local box: commands run as subprocesses of this machine, files are copied in place."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from harness.boxes.base import Box, CommandResult, export_prefix
from harness.errors import BoxError
from harness.formats.safe_write import copy_file_atomic
from harness.threads import box_setting_prefix


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
        script = box_setting_prefix() + export_prefix(self.spec.env) + command
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
            copy_file_atomic(source, target)  # content and mode bits, as cp
        except OSError as exc:
            raise BoxError(
                f"{self.where}: cannot copy {source} -> {target}: {exc.strerror}"
            ) from exc
