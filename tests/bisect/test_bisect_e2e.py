"""A real bisect: a git history of the reference runtime, one commit making decode slower.

The repository is made here: the harness package as it stands (the reference runtime runs from
it), then eight commits, the fifth of which sleeps 3 ms in every decode step of the runtime's
engine. ``harness bisect`` builds each commit it needs once (the refbox profile's ``build``:
export and byte-compile), boots every arm from its build's folder, and must name that commit.
The bisect is killed after its reproduction and resumed, as a campaign is. The card is an
ordinary one; a bisect measures its control cell's settings on each build.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness
from tests.conftest import DATA, REPO, run_cli

pytestmark = pytest.mark.slow

SLOW_LINE = "            t0 = time.perf_counter_ns()\n"
CARD = """\
campaign: bisect-decode
box: local
runtime: refbox
prompts:
  pools: [{pool}]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload: {{max_tokens: 16, warmup_requests: 1, passes: 1, request_timeout_s: 60}}
cells:
  current:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8", REFBOX_HOT_SLOTS: "4", REFBOX_POLICY: frozen}}
  adaptive:
    env: {{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8", REFBOX_HOT_SLOTS: "4", REFBOX_POLICY: adaptive}}
control: current
design: {{order: abba, cycles: 3, repeats: 1, cache_states: [warm], retries: 1, washout: 0.25}}
gates:
  - {{kind: better, metric: decode_tok_s}}
"""


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _history(tmp_path: Path) -> tuple[Path, list[str]]:
    """Nine commits of the runtime; the sixth (the fifth after the good one) is slower."""
    repo = tmp_path / "runtime"
    shutil.copytree(
        Path(harness.__file__).parent,
        repo / "harness",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "test")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the runtime as released")
    engine = repo / "harness" / "refbox" / "engine.py"
    notes = repo / "harness" / "refbox" / "CHANGES"
    for n in range(1, 9):
        notes.write_text(f"change {n}\n")
        if n == 5:
            text = engine.read_text()
            assert text.count(SLOW_LINE) == 1
            slower = SLOW_LINE + "            if not prefill:\n                time.sleep(0.003)\n"
            engine.write_text(text.replace(SLOW_LINE, slower))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"change {n}")
    commits = _git(repo, "rev-list", "--reverse", "HEAD").split()
    return repo, commits


def test_bisect_names_the_commit_that_made_decode_slower_and_resumes(tmp_path: Path) -> None:
    repo, commits = _history(tmp_path)
    card = tmp_path / "card.yaml"
    card.write_text(CARD.format(pool=DATA / "pools" / "small.jsonl"))
    folder = tmp_path / "bisect"
    env = {**os.environ, "HARNESS_CACHE": str(tmp_path / "cache")}
    argv = [
        sys.executable, "-m", "harness", "bisect", str(card), "--repo", str(repo),
        "--good", commits[0], "--bad", commits[-1], "--out", str(folder),
        "--first-cycles", "3", "--max-cycles", "5", "--reproduce-max-cycles", "4",
    ]  # fmt: skip
    first = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None:
        state = json.loads((folder / "bisect.json").read_text()) if folder.exists() else {}
        if state.get("steps") and state.get("current"):
            break
        time.sleep(0.5)
    assert first.poll() is None, first.communicate()[0].decode()
    os.killpg(first.pid, signal.SIGTERM)
    output = first.communicate(timeout=120)[0].decode()
    assert "resume with: harness bisect --resume" in output, output

    env_cache = str(tmp_path / "cache")
    os.environ["HARNESS_CACHE"] = env_cache
    try:
        result = run_cli("bisect", "--resume", str(folder), timeout_s=900)
    finally:
        os.environ.pop("HARNESS_CACHE")
    said = result.stdout + result.stderr
    assert result.code == 0, said
    culprit = commits[5][:12]
    assert f"culprit: {culprit}" in said, said
    state = json.loads((folder / "bisect.json").read_text())
    steps = state["steps"]
    assert steps[0]["build"] == 8 and steps[0]["call"] == "bad", steps
    assert len(steps) <= 5, steps
    calls = {s["build"]: s["call"] for s in steps}
    assert calls[5] == "bad" and calls[4] == "good", calls
    for step in steps:  # every step's campaign is kept, sealed and reported
        root = folder / step["campaign"]
        assert (root / "verdict.json").is_file() and (root / "report.html").is_file()
        assert step["box_s"] > 0
    report = (folder / "report.md").read_text()
    assert f"culprit: {culprit}" in report
    assert report.count("| search |") == len(steps) - 1
    built = sorted(p.name for p in (tmp_path / "cache" / "bisect").iterdir())
    assert len(built) == len({s["build"] for s in steps} | {0}), built


def test_bisect_refuses_bad_input_with_the_flag_named(tmp_path: Path) -> None:
    repo, commits = _history(tmp_path)
    card = tmp_path / "card.yaml"
    card.write_text(CARD.format(pool=DATA / "pools" / "small.jsonl"))
    cases = [
        (["--repo", str(repo), "--good", commits[-1], "--bad", commits[0]], "must be an ancestor"),
        (["--repo", str(repo), "--good", "nope", "--bad", commits[0]], "--good nope: no such"),
        (["--repo", str(tmp_path), "--good", "a", "--bad", "b"], "not a git repository"),
        (["--builds", str(tmp_path)], "at least two folders"),
        (["--repo", str(repo), "--good", commits[0]], "give --repo DIR --good REV --bad REV"),
        (
            ["--repo", str(repo), "--good", commits[0], "--bad", commits[1], "--max-cycles", "2"],
            "3 <= first cycles <= max cycles",
        ),
    ]
    for extra, expected in cases:
        result = run_cli("bisect", str(card), "--out", str(tmp_path / "b"), *extra)
        assert result.code == 2, (extra, result.stdout, result.stderr)
        assert expected in result.stderr, (extra, result.stderr)
        assert "Traceback" not in result.stderr
    result = run_cli("bisect", "--resume", str(tmp_path))
    assert result.code == 2 and "no bisect.json there" in result.stderr, result.stderr
