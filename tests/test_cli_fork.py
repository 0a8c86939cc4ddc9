"""The tests' forked CLI calls (tests/cli_fork.py) behave as `python -m harness` does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_fork import ForkServer
from tests.conftest import DATA, REPO, _fork_server


def _spawned(*args: str, cwd: Path = REPO) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def _ready() -> ForkServer:
    """The shared server; a machine where it cannot fork safely spawns every call, and then
    there is no fork to check."""
    server = _fork_server()
    if server is None or not server.ready:
        pytest.skip(f"calls are spawned here: {server.why_not if server else 'HARNESS_TEST_CLI'}")
    return server


@pytest.mark.parametrize(
    "args",
    [
        ("--version",),
        ("validate", "campaigns/demo.yaml"),
        ("validate", str(DATA / "cards" / "invalid" / "schema-and-semantic.yaml")),
        ("gate", "--no-such-flag"),
        ("ring", "show", "no-such-ring.bin"),
    ],
    ids=["version", "valid", "invalid", "usage", "missing-file"],
)
def test_a_forked_call_prints_and_exits_as_a_spawned_one(args: tuple[str, ...]) -> None:
    server = _ready()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    forked = server.run(list(args), REPO, env, 120)
    assert (forked.code, forked.stdout, forked.stderr) == _spawned(*args)


def test_a_call_past_its_timeout_is_stopped_and_the_server_serves_on(tmp_path: Path) -> None:
    server = _ready()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(["refbox", "serve", "--port", "0"], tmp_path, env, 1.5)
    assert time.monotonic() - started < 20
    assert server.run(["--version"], tmp_path, env, 60).code == 0  # the next call is served


def test_a_stopped_server_is_gone(tmp_path: Path) -> None:
    server = ForkServer()
    server.stop()
    assert server.process.poll() is not None
