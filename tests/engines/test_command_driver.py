"""The command driver for real (slow): llama-bench as the run, its CSV rows as the run record.

campaigns/llama-bench-threads.yaml is run end to end as shipped but for two fixed cycles (two cells,
A/B/B/A, 8 runs, each
one llama-bench process), then analysed, gated and reported; a command that fails and one past
its time limit fail their runs with the reason and the log tail.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.report.tables import LABEL_CLASS
from harness.runtimes.llamacpp import build
from harness.runtimes.llamacpp.gguf_model import write_tiny_moe
from tests.conftest import REPO, run_cli

CARD = REPO / "campaigns" / "llama-bench-threads.yaml"
PROFILE = REPO / "campaigns" / "runtimes" / "llama-bench.yaml"
SHIPPED_DESIGN = (
    "  {order: abba, cycles: 3, max_cycles: 8, sequential: true, look_every: 1, repeats: 1,\n"
    "   cache_states: [warm], seed: 11}"
)
TWO_CYCLES = "  {order: abba, cycles: 2, repeats: 1, cache_states: [warm], seed: 11}"
ONE_CYCLE = "  {order: abba, cycles: 1, repeats: 1, cache_states: [warm], seed: 11}"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not build.built():
        if os.environ.get("HARNESS_LLAMA_NO_BUILD") == "1":
            pytest.skip("llama.cpp is not built; run `make llama-server`")
        build.ensure_built()
    path = tmp_path_factory.mktemp("model") / "tiny-moe.gguf"
    write_tiny_moe(path, build.default_vocab(), seed=1)
    return path


def card_dir(tmp_path: Path, model: Path, *, card: str = "", profile: str = "") -> Path:
    """The shipped card (or ``card``) beside its prompts, the model and (optionally) a profile."""
    shutil.copytree(REPO / "campaigns" / "prompts", tmp_path / "prompts")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny-moe.gguf").symlink_to(model)
    if profile:
        (tmp_path / "runtimes").mkdir()
        (tmp_path / "runtimes" / "llama-bench.yaml").write_text(profile, encoding="utf-8")
    path = tmp_path / "card.yaml"
    path.write_text(card or CARD.read_text(encoding="utf-8"), encoding="utf-8")
    return path


def _campaign(reports: Path) -> Path:
    (found,) = [p for p in (reports).glob("*/*") if p.is_dir()]
    return found


def test_llama_bench_threads_runs_end_to_end(tiny_model: Path, tmp_path: Path) -> None:
    # As shipped, but for the competing-process guard (tests/execute/test_guards.py holds it): on a
    # shared test machine, another test's runtime may be running, which would rightly refuse the
    # cohort. The shipped design is sequential (3 to 8 cycles); two fixed cycles check the driver.
    text = CARD.read_text(encoding="utf-8") + "guards: {competing: false}\n"
    assert SHIPPED_DESIGN in text
    text = text.replace(SHIPPED_DESIGN, TWO_CYCLES)
    card = card_dir(tmp_path, tiny_model, card=text)
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=600)
    assert "runs: 8 done, 0 failed" in result.stdout, result.stdout + result.stderr
    root = _campaign(reports)
    runs = sorted((root / "runs").iterdir())
    assert len(runs) == 8
    for run in runs:
        bench = pd.read_parquet(run / "bench.parquet")
        assert len(bench) == 1 and bench["decode_tok_s"].iloc[0] > 0
        raw = (run / "result.csv").read_text(encoding="utf-8")
        assert raw.startswith("build_commit,") and "avg_ts" in raw.splitlines()[0]
        counters = json.loads((run / "counters.json").read_text(encoding="utf-8"))
        assert counters["missing"] == {}
        assert counters["delta"]["eval_runs"] > 0 and counters["delta"]["graphs_reused"] >= 0
        assert "llama_perf_context_print" in (run / "server.log").read_text(encoding="utf-8")
        record = json.loads((run / "run.json").read_text(encoding="utf-8"))
        assert record["knobs"]["threads"] in {"1", "2"}
    summary = json.loads((root / "analysis" / "summary.json").read_text(encoding="utf-8"))
    (comparison,) = [c for c in summary["comparisons"] if c["metric"] == "decode_tok_s"]
    assert comparison["cell"] == "t2" and comparison["ratio"] > 0 and comparison["n_cycles"] == 2
    assert {cell: row["runs_ok"] for cell, row in summary["cells"].items()} == {"t1": 4, "t2": 4}
    assert all(row["decode_tok_s"] > 0 for row in summary["cells"].values())
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    assert {g["kind"] for g in verdict["gates"]} == {"counter", "better"}
    assert verdict["incomplete_runs"] == []
    html = (root / "report.html").read_text(encoding="utf-8")
    record = (root / "record.md").read_text(encoding="utf-8")
    assert record.startswith(f"# {root.name[:4]}-{root.name[4:6]}-{root.name[6:8]} ")
    box = json.loads((root / "boxes" / "local.json").read_text(encoding="utf-8"))
    assert f"binary SHA-256: `{box['runtime']['binary_sha256']}`" in record
    # The same figures as the page: the comparison row's ratio and interval texts in both.
    (row,) = [line for line in record.splitlines() if line.startswith("| t2 | t1 | warm |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    ratio, interval, label = cells[6], cells[7], cells[8]
    assert ratio in html and interval in html and label in LABEL_CLASS
    assert "## Invalid cohorts" in record and "## Gates" in record


def test_a_failing_command_and_a_time_limit_fail_their_runs(
    tiny_model: Path, tmp_path: Path
) -> None:
    text = CARD.read_text(encoding="utf-8")
    assert SHIPPED_DESIGN in text
    text = text.replace(SHIPPED_DESIGN, ONE_CYCLE)
    # t2 runs a file that is no model: llama-bench exits non-zero.
    text = text.replace(
        "    description: two threads\n    files: {model: models/tiny-moe.gguf}",
        "    description: two threads\n    files: {model: prompts/mixed.jsonl}",
    )
    profile = PROFILE.read_text(encoding="utf-8").replace("timeout_s: 600", "timeout_s: 1.5")
    # t1 generates far more tokens than fit in 1.5 s.
    text = text.replace("threads: 1, n_gen: 32, repetitions: 3", "threads: 1, n_gen: 4000")
    card = card_dir(tmp_path, tiny_model, card=text, profile=profile)
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=300)
    assert "runs: 0 done, 4 failed" in result.stdout, result.stdout + result.stderr
    root = _campaign(reports)
    for run in sorted((root / "runs").iterdir()):
        record = json.loads((run / "run.json").read_text(encoding="utf-8"))
        assert record["status"] == "failed"
        if record["cell"] == "t1":
            assert "stopped: past the time limit of 1.5 s" in record["reason"]
        else:
            assert "command failed (exit status" in record["reason"]
            assert "llama-bench" in record["log_tail"] or "error" in record["log_tail"].lower()
    gate = run_cli("gate", str(root))
    assert gate.code == 3, gate.stdout + gate.stderr
