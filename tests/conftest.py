"""Shared fixtures: paths into the repository and a runner for the CLI as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"


@dataclass
class CliResult:
    """What a CLI subprocess did."""

    code: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path = REPO, timeout_s: float = 120) -> CliResult:
    """Run ``python -m harness ARGS`` in a subprocess, as a user would."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
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


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO
