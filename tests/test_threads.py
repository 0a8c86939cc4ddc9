"""The harness's arithmetic on one BLAS thread, and the runtimes it boots on the box's own setting.

Each OpenBLAS copy (numpy's, scipy's) is asked for its own thread count through its C API, in a
fresh process: the setting only takes when it is made before the library loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.boxes.local import LocalBox
from harness.profiles.box import BoxSpec
from harness.threads import MARK, VARIABLE

# Runs `harness validate` through the console entry, then reports each loaded OpenBLAS copy's
# thread count (importing numpy and scipy.linalg at exit if validate had not).
PROBE = """
import atexit, ctypes, json, sys

def report():
    import numpy, scipy.linalg  # noqa: F401
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    counts = {}
    for path in libs:
        lib = ctypes.CDLL(path)
        name = next(n for n in ("scipy_openblas_get_num_threads64_",
                                "scipy_openblas_get_num_threads") if hasattr(lib, n))
        counts[path.rsplit("/", 1)[-1]] = getattr(lib, name)()
    print(json.dumps(counts))

atexit.register(report)
sys.argv = ["harness", "--version"]
from harness.cli import entry
entry()
"""


def _counts(env: dict[str, str]) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    counts: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    assert len(counts) == 2, counts  # numpy's copy and scipy's
    return counts


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (VARIABLE, MARK)}
    return {**env, **extra}


def test_the_command_runs_one_blas_thread_unless_the_user_chose_a_count() -> None:
    assert set(_counts(_env()).values()) == {1}
    assert set(_counts(_env(**{VARIABLE: "2"})).values()) == {2}  # the user's own choice
    # Set by a harness that started this one (a benchmark's campaign): still the harness's own.
    assert set(_counts(_env(**{VARIABLE: "1", MARK: "1"})).values()) == {1}


def test_a_runtime_on_the_local_box_gets_the_box_setting_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box = LocalBox("local", BoxSpec())
    show = f'echo "${{{VARIABLE}-none}} ${{{MARK}-none}}"'
    monkeypatch.setenv(VARIABLE, "1")
    monkeypatch.setenv(MARK, "1")
    assert box.sh(show).stdout.split() == ["none", "none"]  # only the harness had set it
    monkeypatch.delenv(MARK)
    monkeypatch.setenv(VARIABLE, "3")
    assert box.sh(show).stdout.split() == ["3", "none"]  # the user's setting reaches it
