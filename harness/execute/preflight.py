"""Preflight: is a box ready to run a campaign? (``harness box check NAME [--card CARD]``)

Each check says what it found and, when it fails, the one line that fixes it. The checks cost a
few commands on the box and never start a runtime, so they are cheap enough to run before every
campaign. An unreachable box stops the list there: every later check would fail the same way.
"""

from __future__ import annotations

import re
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.boxes.base import Box, quote_path, shell_command
from harness.boxes.boxes import open_box
from harness.boxes.checks import MIN_PYTHON, Check, uses_python
from harness.boxes.ssh import SshBox
from harness.drive.remote import ship_driver
from harness.errors import BoxError, KnobError
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import render
from harness.version import __version__

MIN_FREE_BYTES = 5 * 1024**3
MAX_CLOCK_SKEW_S = 2.0
_VERSION_SNIPPET = "import sys;print('%d.%d.%d' % sys.version_info[:3])"
_HARNESS_SNIPPET = "import harness;print(harness.__version__)"
_CLOCK_SNIPPET = "import time;print(repr(time.time()))"


def _runs_harness(profile: RuntimeProfile) -> bool:
    """True for the bundled reference runtime (its boot command imports the harness)."""
    return profile.name == "refbox" or any(
        re.match(r"harness(\.|$)", item) for item in profile.boot.command
    )


def _reachable(box: Box) -> Check:
    started = time.monotonic()
    try:
        box.sh("true", timeout_s=30)
    except BoxError as exc:
        text = str(exc)
        if "known_hosts" in text:
            fix = "add the box's host key to known_hosts (the message above says how)"
        elif "cannot guard commands" in text:
            fix = "install coreutils (macOS: `brew install coreutils`) or perl on the box"
        elif "authentication" in text:
            fix = "check `user` and `key` on the box and the box's authorized_keys"
        else:
            fix = "check `host`, `port` and `gateway`, and that sshd runs on the box"
        return Check("reachable", False, text, fix)
    took_s = time.monotonic() - started
    return Check("reachable", True, f"{box.where}: a command round trip took {took_s:.2f} s")


def _timeout_tool(box: Box) -> Check:
    # The same order remote_guard tries; a box with none of them fails `reachable` already.
    probe = "command -v timeout || command -v gtimeout || command -v perl"
    found = box.sh(probe, check=False).stdout.strip()
    if not found:
        return Check(
            "remote timeout",
            False,
            "neither `timeout`, `gtimeout` nor `perl` is on the box's PATH: a timed-out command "
            "would keep running there",
            "install coreutils (macOS: `brew install coreutils`) or perl on the box",
        )
    how = " (no timeout or gtimeout: perl enforces the deadline)" if found.endswith("perl") else ""
    return Check("remote timeout", True, f"commands are guarded by {found}{how}")


def _python(box: Box, spec: BoxSpec, profile: RuntimeProfile | None) -> tuple[Check, bool]:
    python = spec.python_path()
    result = box.sh(shell_command([python, "-c", _VERSION_SNIPPET]), check=False)
    fix = f"install Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ on the box, or set `python:` on the box"
    if result.code != 0:
        detail = f"{python} does not run on the box: {result.stderr.strip()[-300:]}"
        return Check("python", False, detail, fix), False
    version = result.stdout.strip()
    parts = tuple(int(p) for p in version.split("."))
    if profile is not None and uses_python(profile) and parts < MIN_PYTHON:
        wanted = f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
        detail = f"{python} is {version}; runtime {profile.name} needs {wanted}+"
        return Check("python", False, detail, fix), True
    return Check("python", True, f"{python} is Python {version}"), True


def _harness(box: Box, spec: BoxSpec) -> Check:
    python = spec.python_path()
    result = box.sh(shell_command([python, "-m", "harness", "--version"]) + " 2>&1", check=False)
    fix = f"install the harness on the box: `{python} -m pip install harness=={__version__}`"
    if result.code != 0:
        return Check(
            "harness on box", False, f"{python} cannot import harness: {result.stdout[-300:]}", fix
        )
    remote = result.stdout.strip().rsplit(" ", 1)[-1]
    if remote != __version__:
        detail = f"the box has harness {remote}, this machine {__version__}"
        return Check("harness on box", False, detail, fix)
    return Check("harness on box", True, f"harness {remote} importable by {python}")


def _runtime_binary(box: Box, spec: BoxSpec, profile: RuntimeProfile) -> Check:
    template = profile.boot.command[0]
    try:
        binary = render(template, {"python": spec.python_path()})
    except KnobError as exc:
        return Check("runtime binary", False, f"boot.command[0] {template!r}: {exc}", "")
    found = box.sh(f"command -v {quote_path(binary)}", check=False).stdout.strip()
    if found:
        return Check("runtime binary", True, f"{binary} -> {found}")
    return Check(
        "runtime binary",
        False,
        f"{binary} (boot.command[0] of runtime {profile.name}) is not on the box",
        f"install {binary} on the box, or fix boot.command[0] in the runtime profile",
    )


def _transfer(box: Box, workdir: str) -> Check:
    payload = f"harness preflight {secrets.token_hex(8)}\n"
    remote = f"{workdir}/.preflight-{secrets.token_hex(4)}.txt"
    with tempfile.TemporaryDirectory() as tmp:
        sent = Path(tmp) / "sent.txt"
        back = Path(tmp) / "back.txt"
        sent.write_text(payload, encoding="utf-8")
        try:
            box.put_file(sent, remote)
            box.get_file(remote, back)
        except BoxError as exc:
            fix = "install the SFTP server on the box (Debian: openssh-sftp-server)"
            return Check("file transfer", False, str(exc), fix)
        finally:
            box.sh(f"rm -f {quote_path(remote)}", check=False)
        if back.read_text(encoding="utf-8") != payload:
            return Check("file transfer", False, "a file came back changed", "")
    return Check("file transfer", True, "upload and download of a file round-trip")


def _free_disk(box: Box, workdir: str) -> Check:
    result = box.sh(f"df -Pk {quote_path(workdir)} | tail -n 1", check=False)
    fields = result.stdout.split()
    if result.code != 0 or len(fields) < 4 or not fields[3].isdigit():
        return Check("free disk", False, f"df failed in {workdir}: {result.stderr.strip()}", "")
    free_bytes = int(fields[3]) * 1024
    detail = f"{free_bytes / 1024**3:.1f} GiB free in {workdir}"
    if free_bytes < MIN_FREE_BYTES:
        need = f"{MIN_FREE_BYTES / 1024**3:.0f} GiB"
        fix = f"free space there, or point `workdir:` at a disk with {need} free"
        return Check("free disk", False, detail + f" (need {need})", fix)
    return Check("free disk", True, detail)


def _cache_drop(box: Box, spec: BoxSpec, workdir: str) -> Check:
    if spec.platform == "macos-metal":
        if box.sh("sudo -n purge", check=False, timeout_s=120).code == 0:
            return Check("cache drop", True, "`sudo -n purge` works")
        return Check(
            "cache drop",
            False,
            "`sudo -n purge` is not allowed: cold runs cannot drop the file cache",
            "allow it without a password: `USER ALL=(root) NOPASSWD: /usr/sbin/purge` (visudo)",
        )
    template = f"{quote_path(workdir)}/.preflight-evict.XXXXXX"
    made = box.sh(f'f=$(mktemp {template}) && printf x >"$f" && echo "$f"', check=False)
    path = made.stdout.strip()
    if made.code != 0 or not path:
        return Check("cache drop", False, f"cannot write a file in {workdir}: {made.stderr}", "")
    try:
        ok = box.evict_from_page_cache([path])
    finally:
        box.sh(f"rm -f {quote_path(path)}", check=False)
    if ok:
        return Check("cache drop", True, "posix_fadvise(DONTNEED) works on a file in the workdir")
    return Check(
        "cache drop",
        False,
        f"{spec.python_path()} could not posix_fadvise a file: cold runs would stay warm",
        "use a Linux box whose Python has os.posix_fadvise (CPython 3.3+ on Linux)",
    )


def _clock(box: Box, spec: BoxSpec, have_python: bool) -> Check:
    if spec.kind == "local":
        return Check("clock", True, "the local box shares this machine's clock")
    command = (
        shell_command([spec.python_path(), "-c", _CLOCK_SNIPPET]) if have_python else "date +%s"
    )
    before = time.time()
    result = box.sh(command, check=False)
    after = time.time()
    try:
        remote = float(result.stdout.strip())
    except ValueError:
        return Check("clock", False, f"could not read the box's clock: {result.stderr}", "")
    # The box read its clock somewhere between `before` and `after`; only beyond that is skew.
    skew_s = max(before - remote, remote - after, 0.0)
    slack_s = MAX_CLOCK_SKEW_S + (0.0 if have_python else 1.0)  # `date +%s` truncates
    detail = f"the box's clock is within {skew_s:.2f} s of this machine's"
    if skew_s > slack_s:
        return Check(
            "clock",
            False,
            f"the box's clock is {remote - (before + after) / 2:+.1f} s off this machine's",
            "enable time sync on the box (timedatectl set-ntp true, or chrony)",
        )
    return Check("clock", True, detail)


def _swap_counter(box: Box, spec: BoxSpec) -> Check:
    try:
        pages = box.swapout_pages()
    except (BoxError, ValueError) as exc:
        pages = None
        reason = str(exc)
    else:
        reason = ""
    if pages is not None:
        return Check("swap-out counter", True, f"{pages} pages swapped out since boot")
    source = "vm_stat" if spec.platform == "macos-metal" else "/proc/vmstat pswpout"
    return Check(
        "swap-out counter",
        False,
        f"cannot read {source} on the box {reason}".strip(),
        "the new_swapout_pages gate needs it: run on a host (not a container hiding /proc)",
    )


def _platform(box: Box, spec: BoxSpec, profile: RuntimeProfile | None) -> Check:
    system = box.sh("uname -s", check=False).stdout.strip()
    expected = "Darwin" if spec.platform == "macos-metal" else "Linux"
    if system != expected:
        return Check(
            "platform",
            False,
            f"the box says platform {spec.platform} but runs {system or 'an unknown system'}",
            "set `platform:` on the box to what it is",
        )
    if profile is not None and not {"any", spec.platform} & set(profile.platforms):
        return Check(
            "platform",
            False,
            f"runtime {profile.name} runs on {', '.join(profile.platforms)}, not {spec.platform}",
            "pick a box of a platform the runtime supports",
        )
    return Check("platform", True, f"{system}, {spec.platform}")


def _forwarding(box: SshBox) -> Check:
    """The tunnel every HTTP call to the runtime takes: allowed, and how long a round trip is."""
    try:
        rtt = box.round_trips()
    except BoxError as exc:
        if "AllowTcpForwarding" in str(exc):
            fix = "set `AllowTcpForwarding yes` for the ssh user in the box's sshd_config"
        else:
            fix = "check that `python` on the box runs (the probe is a small echo server)"
        return Check("port forwarding", False, str(exc), fix)
    tunnel, channel = rtt["tunnel"]["median_ms"], rtt["ssh_channel"]["median_ms"]
    return Check(
        "port forwarding",
        True,
        f"a tunnel to the box's 127.0.0.1 round-trips in {tunnel:.2f} ms (median of "
        f"{rtt['samples']}; the SSH channel alone: {channel:.2f} ms)",
    )


def _on_box_driver(box: SshBox, spec: BoxSpec, workdir: str) -> Check:
    """``drive: on-box``: the shipped driver starts with the box's python and aiohttp."""
    try:
        driver = ship_driver(box, f"{workdir}/.preflight")
    except BoxError as exc:
        fix = f"`{spec.python_path()} -m pip install aiohttp` on the box, or drop `drive: on-box`"
        return Check("on-box driver", False, str(exc), fix)
    hello = driver.hello
    return Check(
        "on-box driver",
        True,
        f"the driver starts on the box (Python {hello['python']}, aiohttp {hello['aiohttp']})",
    )


def check_box(
    name: str, spec: BoxSpec, profile: RuntimeProfile | None = None, *, box: Box | None = None
) -> list[Check]:
    """Check that box ``name`` can run campaigns (with ``profile``, that runtime's too).

    ``box`` may be given already open (tests do); otherwise it is opened from ``spec`` and closed
    afterwards.
    """
    if spec.kind == "slurm":
        # Not commands over a shell: sinfo, the partition, the shared folder and a trivial job.
        from harness.execute.slurm.preflight import check_slurm_box

        return check_slurm_box(name, spec, profile)
    owned = box is None
    target = open_box(name, spec) if box is None else box
    try:
        reach = _reachable(target)
        if not reach.ok:
            return [reach]
        checks = [reach, _platform(target, spec, profile)]
        if spec.kind == "ssh":
            checks.append(_timeout_tool(target))
        python_check, have_python = _python(target, spec, profile)
        checks.append(python_check)
        if profile is not None:
            if _runs_harness(profile):
                checks.append(_harness(target, spec))
            checks.append(_runtime_binary(target, spec, profile))
        workdir = target.home_path(spec.workdir)
        steps: list[Callable[[], Check]] = [
            lambda: _free_disk(target, workdir),
            lambda: _cache_drop(target, spec, workdir),
            lambda: _clock(target, spec, have_python),
            lambda: _swap_counter(target, spec),
        ]
        try:
            target.mkdirs(workdir)
        except BoxError as exc:
            fix = "point `workdir:` at a directory the ssh user may create"
            checks.append(Check("workdir", False, str(exc), fix))
            steps = steps[2:]
        else:
            if isinstance(target, SshBox):
                ssh = target
                steps.insert(0, lambda: _transfer(ssh, workdir))
                if profile is None or profile.driver is None:  # reached over HTTP
                    steps.insert(1, lambda: _forwarding(ssh))
                    if spec.drives_on_box:
                        steps.insert(2, lambda: _on_box_driver(ssh, spec, workdir))
        checks.extend(step() for step in steps)
        return checks
    finally:
        if owned:
            target.close()
