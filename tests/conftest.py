"""Shared fixtures: paths into the repository and a runner for the CLI as a real subprocess."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.threads import one_blas_thread
from tests.cli_fork import ForkServer

# Before any test module imports numpy: the analysis's arithmetic on one BLAS thread, as the
# `harness` command runs it (harness/threads.py), in this process and the CLIs it starts.
one_blas_thread()

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
# Compiled code that calls into another module's compiled code: numba's on-disk cache checks
# only the caller's own file, so an edit to the policy kernels would leave the fast replay's
# cached loops running the old drain.
_KERNEL_SOURCES = ("harness/policy/kernels.py", "harness/sim/fastloop.py")


# `make test` runs the suite on two xdist workers (the suite alone keeps one core of two busy:
# most of its time is spent waiting on runtimes, boxes and schedulers). Tests run side by side
# only where nothing they share can collide, so each test belongs to a group that one worker runs
# whole:
# - the real engines (vLLM, llama.cpp, ds4), whose profiles list each other as competing
#   processes (a guard would refuse a cohort beside another worker's engine), and which build
#   into one ~/.cache/harness folder when it is missing;
# - the one-node Slurm clusters (one node name, one host);
# - otherwise the test's file, so a module's fixture boots once.
# (xdist's own `xdist_group` mark is read through Item._nodeid, which pytest 9.2 no longer uses.)
_ENGINE_FILES = ("tests/engines/", "tests/importers/test_import.py", "tests/execute/test_guards.py")


@functools.cache  # the scheduler asks once per test, the answer is per file
def xdist_group(test_file: str) -> str:
    """The group of the tests in ``test_file`` (a path relative to the repository)."""
    if test_file.startswith(_ENGINE_FILES):
        return "engines"
    path = REPO / test_file
    if path.is_file() and "tests.slurm" in path.read_text(encoding="utf-8"):
        return "slurm"
    return test_file


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand each worker whole groups (above), in collection order as workers free up."""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("::", 1)[0])

    return GroupScheduling(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Drop numba's cached machine code when the kernel sources changed since it was built.

    Only the controlling process does it: an xdist worker deleting files another worker is
    compiling into would race it.
    """
    if hasattr(session.config, "workerinput"):
        return
    digest = hashlib.sha256()
    for name in _KERNEL_SOURCES:
        digest.update((REPO / name).read_bytes())
    marker = REPO / "harness" / "__pycache__" / "kernels.sha256"
    if marker.exists() and marker.read_text() == digest.hexdigest():
        return
    for pattern in ("*.nbi", "*.nbc"):
        for stale in (REPO / "harness").rglob(pattern):
            stale.unlink()
    marker.parent.mkdir(exist_ok=True)
    marker.write_text(digest.hexdigest())


def shipped_card_variant(card: str, folder: Path, replace: dict[str, str]) -> Path:
    """A copy of ``campaigns/CARD`` in ``folder`` with some text replaced (each piece must be
    there), beside links to the shipped prompts and maps its paths name."""
    text = (REPO / "campaigns" / card).read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    (folder / card).write_text(text, encoding="utf-8")
    return folder / card


@dataclass
class CliResult:
    """What a CLI subprocess did."""

    code: int
    stdout: str
    stderr: str


@functools.cache  # one per test process
def _fork_server() -> ForkServer | None:
    if os.environ.get("HARNESS_TEST_CLI") == "spawn":
        return None
    return ForkServer()


def run_cli(*args: str, cwd: Path = REPO, timeout_s: float = 120) -> CliResult:
    """Run ``harness ARGS`` in a process of its own, as a user would: forked from a harness that
    has imported its stages already (tests/cli_fork.py), or ``python -m harness`` where a fork
    cannot stand in for it."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    server = _fork_server()
    if server is not None and server.fits(env):
        forked = server.run(list(args), cwd, env, timeout_s)
        return CliResult(forked.code, forked.stdout, forked.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def flat_text(terminal: str) -> str:
    """Terminal output with table rules dropped and whitespace collapsed, so that a sentence a
    table wrapped over lines (where it breaks depends on the figures in it) reads whole."""
    return re.sub(r"\s+", " ", re.sub(r"[│┃|─━┏┓┗┛┡┩└┘┌┐]", " ", terminal))


def start_campaign(card: Path, reports: Path) -> subprocess.Popen[bytes]:
    """``harness run CARD --quiet`` in a session of its own, left running (for a test that
    stops it with a signal); its output is dropped."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(card), "--reports", str(reports), "--quiet"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def finished_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small finished campaign made by ``harness run`` (tests.campaign_dirs), shared by the
    tests that change campaign directories; read-only: copy it (``copy_campaign``) first."""
    from tests.campaign_dirs import run_tiny

    return run_tiny(tmp_path_factory.mktemp("finished-campaign"))
