"""Boxes, local and over a real sshd on 127.0.0.1: commands, quoting, process groups, transfers.

Every behaviour is checked on both boxes through one parametrized fixture, because both run the
same shell text and must agree. Injection-shaped values carry harmless payloads (they would create
sentinel files), so a quoting bug fails the test instead of damaging the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.boxes.base import Box, CommandResult, shell_command
from harness.boxes.local import LocalBox
from harness.boxes.ssh import SshBox
from harness.errors import BoxError
from harness.execute.preflight import check_box
from harness.profiles.box import BoxSpec
from tests.sshd import LoopbackSshd, sshd, sshd_with_path  # noqa: F401 - the session fixture

# A tiny program that records exactly what it was given: argv and the named env variables.
RECORDER = (
    "import json,os,sys\n"
    "names = os.environ['REC_NAMES'].split(',')\n"
    "out = {'argv': sys.argv[1:], 'env': {n: os.environ.get(n) for n in names}}\n"
    "open(os.environ['REC_OUT'], 'w', encoding='utf-8').write(json.dumps(out))\n"
)
# A program that starts a child in its own process group and waits on it forever.
PARENT_WITH_CHILD = (
    "import subprocess,sys,time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    "open(sys.argv[1], 'w').write(str(child.pid))\n"
    "time.sleep(300)\n"
)


def hostile_values(sentinels: Path) -> list[str]:
    """Values that break naive quoting; any that runs as shell creates a file in ``sentinels``."""
    return [
        f"x; touch {sentinels}/semicolon",
        f"$(touch {sentinels}/dollar-paren)",
        f"`touch {sentinels}/backtick`",
        f"a'b\"c'; touch {sentinels}/quotes; echo '",
        f"line1\nline2; touch {sentinels}/newline",
        f"| touch {sentinels}/pipe",
        f"&& touch {sentinels}/and",
        "*",
        "~",
        "$HOME",
        "${PATH}",
        "back\\slash\\\\",
        "-n",
        "--flag=value with spaces",
        "",
        "tab\there",
        "x; rm -rf ~/harness-test-does-not-exist",
        "unicode: ✓ 日本語 \u00e9",
        "!event",
        "#not-a-comment",
    ]


def _spec(server: LoopbackSshd, **overrides: object) -> BoxSpec:
    fields: dict[str, object] = {
        "kind": "ssh",
        "host": server.host,
        "port": server.port,
        "user": server.user,
        "key": str(server.client_key),
        "python": sys.executable,
    }
    fields.update(overrides)
    return BoxSpec.model_validate(fields)


@pytest.fixture(scope="module")
def ssh_box(sshd: LoopbackSshd) -> Iterator[SshBox]:  # noqa: F811 - pytest fixture injection
    """One SSH box for the module, checking the loopback host key."""
    box = SshBox("loopback", _spec(sshd), known_hosts=[sshd.known_hosts])
    yield box
    box.close()


@pytest.fixture(params=["local", "ssh"])
def box(request: pytest.FixtureRequest) -> Box:
    """Each test runs on the local box and on the SSH box."""
    if request.param == "local":
        return LocalBox("local", BoxSpec())
    ssh: SshBox = request.getfixturevalue("ssh_box")
    return ssh


def _alive_not_zombie(box: Box, pid: int) -> bool:
    state = box.sh(f"ps -o stat= -p {int(pid)}", check=False).stdout.strip()
    return bool(state) and not state.startswith("Z")


def _wait_gone(box: Box, pgid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not box.group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


# ---- quoting ----------------------------------------------------------------------------------


def _recorder_env(values: list[str], out: Path) -> dict[str, str]:
    env = {f"HOSTILE_{i}": value for i, value in enumerate(values)}
    return {**env, "REC_NAMES": ",".join(env), "REC_OUT": str(out)}


def test_hostile_values_arrive_literally_through_sh(box: Box, tmp_path: Path) -> None:
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    values = hostile_values(sentinels)
    out = tmp_path / "record.json"
    env = _recorder_env(values, out)
    box.sh(shell_command([sys.executable, "-c", RECORDER, *values], env), timeout_s=30)
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["argv"] == values
    assert record["env"] == {k: v for k, v in env.items() if k.startswith("HOSTILE_")}
    assert list(sentinels.iterdir()) == []


def test_hostile_values_arrive_literally_through_start_background(box: Box, tmp_path: Path) -> None:
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    values = hostile_values(sentinels)
    out = tmp_path / "record.json"
    env = _recorder_env(values, out)
    odd_cwd = tmp_path / "a dir; with 'quotes'"
    odd_cwd.mkdir()
    pgid = box.start_background(
        [sys.executable, "-c", RECORDER, *values], env, str(odd_cwd), str(tmp_path / "rec.log")
    )
    assert _wait_gone(box, pgid)
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["argv"] == values
    assert record["env"] == {k: v for k, v in env.items() if k.startswith("HOSTILE_")}
    assert list(sentinels.iterdir()) == []


def test_box_env_reaches_compound_commands(box: Box, tmp_path: Path) -> None:
    spec = box.spec.model_copy(update={"env": {"BOX_VALUE": "a b; $(echo no) `echo no`"}})
    with_env: Box = LocalBox("local", spec)
    if isinstance(box, SshBox):
        with_env = SshBox("env", spec, known_hosts=box.known_hosts)
    try:
        result = with_env.sh(f'cd {tmp_path} && printf %s "$BOX_VALUE"')
    finally:
        with_env.close()
    assert result.stdout == "a b; $(echo no) `echo no`"


SHELL_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))


@settings(max_examples=40, deadline=None)
@given(items=st.lists(SHELL_TEXT, max_size=4))
def test_any_text_round_trips_through_shell_command(items: list[str]) -> None:
    local = LocalBox("local", BoxSpec())
    argv = ["printf", "%s\\0", "first", *items]
    result = local.sh(shell_command(argv, {"ROUND_TRIP": "".join(items)}))
    assert result.stdout.split("\0")[1:-1] == items
    echoed = local.sh(shell_command(["printenv", "ROUND_TRIP"], {"ROUND_TRIP": "".join(items)}))
    assert echoed.stdout == "".join(items) + "\n"


# ---- commands and process groups --------------------------------------------------------------


def test_failed_command_raises_box_error_naming_the_box(box: Box) -> None:
    with pytest.raises(BoxError, match=r"box (local|loopback).*exit 3"):
        box.sh("echo oops >&2; exit 3")
    assert box.sh("exit 3", check=False).code == 3


def test_timed_out_command_is_killed_on_the_box(box: Box, tmp_path: Path) -> None:
    pid_file = tmp_path / "sleep.pid"
    with pytest.raises(BoxError, match="timed out"):
        box.sh(f"sleep 120 & echo $! > {pid_file}; wait", timeout_s=1)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive_not_zombie(box, pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive_not_zombie(box, pid), "the timed-out command's child still runs"


def test_background_server_leads_its_group_and_dies_with_it(box: Box, tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    pgid = box.start_background(
        [sys.executable, "-c", PARENT_WITH_CHILD, str(child_file)], {}, None, str(tmp_path / "log")
    )
    deadline = time.monotonic() + 10
    while not child_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(child_file.read_text())
    groups = box.sh(f"ps -o pid= -o pgid= -p {pgid} -p {child}").stdout.split()
    assert groups == [str(pgid), str(pgid), str(child), str(pgid)]
    assert box.group_alive(pgid)
    box.signal_group(pgid, "TERM")
    assert _wait_gone(box, pgid)
    assert not _alive_not_zombie(box, child)


def test_dead_group_is_not_alive(box: Box, tmp_path: Path) -> None:
    pgid = box.start_background(["true"], {}, None, str(tmp_path / "log"))
    assert _wait_gone(box, pgid)
    assert not box.group_alive(pgid)


# ---- files ------------------------------------------------------------------------------------


def test_file_round_trip_and_queries(box: Box, tmp_path: Path) -> None:
    payload = os.urandom(200_000) + b"\nlast line\n"
    local = tmp_path / "source file 'x'.bin"
    local.write_bytes(payload)
    remote = str(tmp_path / "remote dir" / "copy; of it.bin")
    box.put_file(local, remote)
    back = tmp_path / "back" / "copy.bin"
    box.get_file(remote, back)
    assert back.read_bytes() == payload
    assert box.exists(remote) and not box.exists(remote + ".missing")
    assert box.sha256(remote) == hashlib.sha256(payload).hexdigest()
    assert box.sha256(remote + ".missing") is None
    assert box.read_text(remote, tail_bytes=10) == "last line\n"
    assert box.read_text(remote + ".missing") == ""


def test_a_download_replaces_a_link_at_its_target_and_never_writes_through_it(
    box: Box, tmp_path: Path
) -> None:
    remote = tmp_path / "remote.bin"
    remote.write_bytes(b"downloaded\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("not ours\n")
    back = tmp_path / "back" / "ring.bin"
    back.parent.mkdir()
    back.symlink_to(victim)
    box.get_file(str(remote), back)
    assert victim.read_text() == "not ours\n"
    assert not back.is_symlink() and back.read_bytes() == b"downloaded\n"
    assert sorted(p.name for p in back.parent.iterdir()) == ["ring.bin"]  # no temp file left


def test_directory_round_trip(box: Box, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    (source / "a" / "b c").mkdir(parents=True)
    (source / "top.txt").write_text("top", encoding="utf-8")
    (source / "a" / "b c" / "deep's.json").write_text('{"k": 1}', encoding="utf-8")
    remote = str(tmp_path / "remote tree")
    box.put_dir(source, remote)
    back = tmp_path / "back"
    box.get_dir(remote, back)
    assert (back / "top.txt").read_text(encoding="utf-8") == "top"
    assert (back / "a" / "b c" / "deep's.json").read_text(encoding="utf-8") == '{"k": 1}'
    assert not box.exists(remote + ".upload.tar") and not box.exists(remote + ".download.tar")


def test_missing_download_is_a_box_error(box: Box, tmp_path: Path) -> None:
    with pytest.raises(BoxError, match=r"box (local|loopback)"):
        box.get_file(str(tmp_path / "nope.bin"), tmp_path / "out.bin")


def test_home_port_and_counters(box: Box) -> None:
    home = box.sh('printf %s "$HOME"').stdout
    assert box.home_path("~/x/y") == f"{home}/x/y"
    assert box.home_path("/abs") == "/abs"
    assert 1 <= box.free_port() <= 65535
    pages = box.swapout_pages()
    assert isinstance(pages, int) and pages >= 0


# ---- SSH only: host keys and connection errors ------------------------------------------------


def test_unknown_host_key_is_refused_with_the_fix(sshd: LoopbackSshd) -> None:  # noqa: F811
    box = SshBox("loopback", _spec(sshd))
    with pytest.raises(BoxError) as caught:
        box.sh("true")
    message = str(caught.value)
    assert f"127.0.0.1:{sshd.port}" in message
    assert "not found in known_hosts" in message
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1" in message


def test_insecure_flag_accepts_an_unknown_host_key(sshd: LoopbackSshd) -> None:  # noqa: F811
    box = SshBox("loopback", _spec(sshd, insecure_accept_unknown_host_key=True))
    try:
        assert box.sh("echo ok").stdout == "ok\n"
    finally:
        box.close()


def test_changed_host_key_is_refused(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 {other}\n", encoding="utf-8")
    box = SshBox("loopback", _spec(sshd), known_hosts=[wrong])
    with pytest.raises(BoxError, match="does not match known_hosts"):
        box.sh("true")


def test_wrong_key_fails_authentication(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    spec = _spec(sshd, key=str(key))
    box = SshBox("loopback", spec, known_hosts=[sshd.known_hosts])
    with pytest.raises(BoxError, match="authentication failed"):
        box.sh("true")


def test_closed_port_names_the_host(sshd: LoopbackSshd) -> None:  # noqa: F811
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    spec = _spec(sshd, port=closed)
    with pytest.raises(BoxError, match=rf"127\.0\.0\.1:{closed}.*cannot reach"):
        SshBox("loopback", spec, known_hosts=[sshd.known_hosts]).sh("true")


def test_missing_known_hosts_file_is_an_error(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    box = SshBox("loopback", _spec(sshd), known_hosts=[tmp_path / "absent"])
    with pytest.raises(BoxError, match="does not exist"):
        box.sh("true")


# ---- the remote guard without coreutils' timeout (stock macOS) ----------------------------------


@pytest.mark.slow  # a loopback sshd of its own; real deadlines
def test_commands_are_guarded_without_timeout_or_gtimeout(tmp_path: Path) -> None:
    # A box like stock macOS: no `timeout`, no `gtimeout`; perl enforces the deadline instead.
    with sshd_with_path(tmp_path / "box", hidden=("timeout", "gtimeout")) as server:
        box = SshBox("bare", _spec(server), known_hosts=[server.known_hosts])
        try:
            assert box.sh("command -v timeout gtimeout", check=False).code != 0
            # The guard is the command's parent, so this reads its name.
            assert box.sh("ps -o comm= -p $PPID").stdout.strip() == "perl"
            assert box.sh("echo out; echo err >&2; exit 3", check=False) == CommandResult(
                3, "out\n", "err\n"
            )
            assert box.sh("kill -TERM $$", check=False).code == 128 + signal.SIGTERM
            pid_file = tmp_path / "sleep.pid"
            started = time.monotonic()
            with pytest.raises(BoxError, match=r"timed out after 1 s \(killed there\)"):
                box.sh(f"sleep 120 & echo $! > {pid_file}; wait", timeout_s=1)
            assert time.monotonic() - started < 10  # the guard's deadline, not the local slack
            pid = int(pid_file.read_text())
            deadline = time.monotonic() + 10
            while _alive_not_zombie(box, pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive_not_zombie(box, pid), "the timed-out command's child still runs"
            # A command that ignores TERM gets KILL after the grace.
            started = time.monotonic()
            with pytest.raises(BoxError, match="timed out"):
                box.sh("trap '' TERM; sleep 30", timeout_s=1)
            assert time.monotonic() - started < 15
            # A server started in the background outlives the guard of the command that started it.
            server_pid = box.start_background(["sleep", "60"], {}, None, str(tmp_path / "bg.log"))
            assert box.group_alive(server_pid)
            box.signal_group(server_pid, "KILL")
            assert _wait_gone(box, server_pid)
            guard = {c.name: c for c in check_box("bare", box.spec, box=box)}["remote timeout"]
            assert guard.ok and "perl enforces the deadline" in guard.detail, guard
        finally:
            box.close()


@pytest.mark.slow  # a loopback sshd of its own; real deadlines
def test_a_box_with_no_way_to_guard_commands_is_refused_with_the_remedy(tmp_path: Path) -> None:
    with sshd_with_path(tmp_path / "box", hidden=("timeout", "gtimeout", "perl")) as server:
        box = SshBox("bare", _spec(server), known_hosts=[server.known_hosts])
        marker = tmp_path / "ran"
        try:
            with pytest.raises(BoxError) as caught:
                box.sh(f"touch {marker}")
            (reach,) = check_box("bare", box.spec, box=box)
        finally:
            box.close()
    assert reach.name == "reachable" and not reach.ok
    assert reach.fix == "install coreutils (macOS: `brew install coreutils`) or perl on the box"
    assert not marker.exists(), "an unguarded command ran"
    message = str(caught.value)
    assert "cannot guard commands: neither timeout, gtimeout nor perl" in message
    assert "install coreutils (macOS: `brew install coreutils`) or perl on the box" in message


def test_a_profiles_binary_is_found_in_the_cache_the_box_names(box: Box, tmp_path: Path) -> None:
    # The llama.cpp profile's binary lives under ${HARNESS_CACHE:-~/.cache/harness}, as the
    # build script puts it: a box whose env moves the cache records the binary it will boot.
    from harness.card.resolve import PACKAGE_DATA, load_runtime_profile
    from harness.runtimes.boot import runtime_version

    server = tmp_path / "cache" / "llama.cpp" / "bin" / "llama-server"
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\necho 'version: 1 (test)'\n")
    server.chmod(0o755)
    spec = box.spec.model_copy(update={"env": {"HARNESS_CACHE": str(tmp_path / "cache")}})
    with_env: Box = LocalBox("local", spec)
    if isinstance(box, SshBox):
        with_env = SshBox("env", spec, known_hosts=box.known_hosts)
    profile = load_runtime_profile(PACKAGE_DATA / "runtimes" / "llama-cpp.yaml")
    try:
        found = runtime_version(with_env, profile, sys.executable)
    finally:
        with_env.close()
    assert found["binary"] == str(server)
    assert found["binary_sha256"] == hashlib.sha256(server.read_bytes()).hexdigest()
    assert found["version"] == "version: 1 (test)"
