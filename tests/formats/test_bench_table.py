"""Benchmark binaries' result tables, mapped onto metrics by header name (never position).

The ds4-bench fixtures carry the real headers of the fork's CSVs (andreaborio/ds4,
docs/benchmarks/raw: 39 columns in new builds; 9 in old ones), with rows written here.
"""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from pathlib import Path

import pytest

from harness.analyze.metrics import bench_metrics
from harness.card.resolve import load_runtime_profile
from harness.errors import RecordError
from harness.formats.bench_table import map_result_rows, parse_result_rows
from tests.conftest import REPO, run_cli

DATA = Path(__file__).parent.parent / "data" / "bench"
RUNTIMES = REPO / "campaigns" / "runtimes"
GIB = 2**30


def _ds4_driver():  # type: ignore[no-untyped-def]
    driver = load_runtime_profile(RUNTIMES / "ds4.yaml").driver
    assert driver is not None and driver.kind == "command" and driver.result == "csv"
    return driver


def test_new_ds4_bench_csv_gives_the_seed_table_columns() -> None:
    driver = _ds4_driver()
    text = (DATA / "ds4-bench-new.csv").read_text(encoding="utf-8")
    rows = parse_result_rows(text, "csv", "new.csv")
    assert len(rows[0]) == 39
    frame = map_result_rows(rows, driver.columns, where="new.csv", scale=driver.scale())
    assert list(frame["decode_tok_s"]) == [8.0, 2.0]
    assert list(frame["tpot_p95_ms"]) == [160.0, 640.0]
    assert frame["bytes_read"].tolist() == pytest.approx([0.329590 * GIB, 0.988770 * GIB])
    metrics = bench_metrics(frame)
    assert metrics["requests"] == 2
    assert metrics["decode_tok_s"] == pytest.approx(4.0)  # geomean over frontiers, as over prompts
    assert metrics["expert_loads"] == 200  # work done adds up
    assert metrics["hit_rate"] == pytest.approx(0.85)
    assert metrics["bytes_read"] == pytest.approx((0.329590 + 0.988770) * GIB)


def test_columns_are_found_by_name_whatever_their_order() -> None:
    driver = _ds4_driver()
    rows = parse_result_rows((DATA / "ds4-bench-new.csv").read_text(encoding="utf-8"), "csv", "x")
    headers = list(rows[0])
    random.Random(4).shuffle(headers)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=headers)
    writer.writeheader()
    writer.writerows(rows)
    shuffled = parse_result_rows(out.getvalue(), "csv", "shuffled")
    a = map_result_rows(rows, driver.columns, where="a", scale=driver.scale())
    b = map_result_rows(shuffled, driver.columns, where="b", scale=driver.scale())
    assert a.equals(b)


def test_an_old_build_fails_naming_what_it_lacks_and_what_it_has() -> None:
    driver = _ds4_driver()
    rows = parse_result_rows((DATA / "ds4-bench-old.csv").read_text(encoding="utf-8"), "csv", "o")
    with pytest.raises(RecordError) as caught:
        map_result_rows(rows, driver.columns, where="old.csv")
    message = str(caught.value)
    assert "no column ttft_ms, gen_tpot_p50_ms" in message
    assert "headers: ctx_tokens, prefill_tokens, prefill_tps, gen_tokens, gen_tps" in message
    # Mapped onto what an old build has, it reads.
    frame = map_result_rows(
        rows, {"decode_tok_s": "gen_tps", "prefill_tok_s": "prefill_tps"}, where="o"
    )
    assert frame["decode_tok_s"].tolist() == [9.41]


def test_llama_bench_json_rows_filtered_by_a_column() -> None:
    rows = [
        {"n_prompt": 16, "n_gen": 0, "avg_ts": 5000.5, "build_commit": "4227c9b"},
        {"n_prompt": 0, "n_gen": 32, "avg_ts": 674.9, "build_commit": "4227c9b"},
    ]
    text = json.dumps(rows, indent=1)
    parsed = parse_result_rows(text, "json", "bench.json")
    frame = map_result_rows(parsed, {"decode_tok_s": "avg_ts"}, where="j", keep={"n_prompt": 0})
    assert frame["decode_tok_s"].tolist() == [674.9] and frame["row"].tolist() == [1]
    lines = "\n".join(json.dumps(r) for r in rows) + "\n"  # llama-bench -o jsonl
    assert parse_result_rows(lines, "json", "bench.jsonl") == parsed
    with pytest.raises(RecordError, match="no row has n_prompt=7"):
        map_result_rows(parsed, {"decode_tok_s": "avg_ts"}, where="j", keep={"n_prompt": 7})


def test_damaged_results_are_errors_never_zero() -> None:
    with pytest.raises(RecordError, match="empty result"):
        parse_result_rows("", "csv", "r.csv")
    with pytest.raises(RecordError, match=r"r.csv:3: 3 headers but a row of another length"):
        parse_result_rows("a,b,c\n1,2,3\n4,5\n", "csv", "r.csv")
    rows = parse_result_rows("gen_tps,x\nfast,1\n", "csv", "r.csv")
    with pytest.raises(RecordError, match=r"row 1, column gen_tps \(decode_tok_s\) is 'fast'"):
        map_result_rows(rows, {"decode_tok_s": "gen_tps"}, where="r.csv")
    with pytest.raises(RecordError, match="list of objects"):
        parse_result_rows("[1, 2]", "json", "r.json")


def test_shipped_profiles_validate_and_a_bad_column_map_is_named(tmp_path: Path) -> None:
    names = ["ds4", "ds4-server", "llama-bench", "llama-cpp"]
    result = run_cli("validate", *[str(RUNTIMES / f"{n}.yaml") for n in names])
    assert result.code == 0, result.stderr
    assert (
        "ok: " in result.stdout
        and "(runtime ds4, command driver, 15 knobs, 6 log counters)" in (result.stdout)
    )
    bad = tmp_path / "runtimes" / "ds4.yaml"
    bad.parent.mkdir()
    text = (RUNTIMES / "ds4.yaml").read_text(encoding="utf-8")
    bad.write_text(text.replace("decode_tok_s: gen_tps", "decode_speed: gen_tps"), encoding="utf-8")
    result = run_cli("validate", str(bad))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "driver.columns maps onto decode_speed, not metrics or counters" in result.stderr
    assert f"{bad}:" in result.stderr


@pytest.mark.slow
def test_ds4_bench_rows_fill_the_seed_004_table_end_to_end(tmp_path: Path) -> None:
    # A command that prints the fixture CSV, mapped by ds4.yaml's own driver columns: the rows
    # reach the policy table (decode t/s, hit rate, loads, routed reads, TPOT) and record.md.
    driver = _ds4_driver()
    profile = {
        "name": "ds4-bench-replay",
        "driver": {
            "kind": "command",
            "argv": ["sh", "-c", 'cat "$CSV"'],
            "result": "csv",
            "columns": driver.columns,
            "units": driver.units,
            "tier": driver.tier,
        },
        "files": {"csv": "env:CSV"},
    }
    shutil.copytree(REPO / "campaigns" / "prompts", tmp_path / "prompts")
    shutil.copy(DATA / "ds4-bench-new.csv", tmp_path / "bench.csv")
    card = {
        "campaign": "ds4-replay",
        "runtime": profile,
        "prompts": {"pools": ["prompts/mixed.jsonl"]},
        "workload": {"warmup_requests": 0, "phases": [
            {"name": "bench", "domains": ["en-prose"], "requests": 1}]},
        "cells": {"legacy": {"files": {"csv": "bench.csv"}},
                  "adaptive": {"files": {"csv": "bench.csv"}}},
        "control": "legacy",
        "design": {"order": "abba", "cycles": 1, "cache_states": ["warm"]},
        "guards": {"enabled": False},
        "gates": [{"kind": "better", "metric": "decode_tok_s"}],
    }  # fmt: skip
    (tmp_path / "card.yaml").write_text(json.dumps(card), encoding="utf-8")
    reports = tmp_path / "reports"
    result = run_cli("run", str(tmp_path / "card.yaml"), "--reports", str(reports), "--quiet")
    assert "runs: 4 done, 0 failed" in result.stdout, result.stdout + result.stderr
    (root,) = [p for p in reports.glob("*/*") if p.is_dir()]
    summary = json.loads((root / "analysis" / "summary.json").read_text(encoding="utf-8"))
    (row,) = [r for r in summary["seed_tables"]["policy"] if r["cell"] == "adaptive"]
    values = row
    assert values["decode_tok_s"] == pytest.approx(4.0)
    assert values["hit_rate"] == pytest.approx(0.85)
    assert values["expert_loads"] == 200
    assert values["bytes_read"] == pytest.approx((0.329590 + 0.988770) * GIB)
    assert values["tpot_p50_ms"] == pytest.approx(240.0)  # geomean of 120 and 480 over frontiers
    record = (root / "record.md").read_text(encoding="utf-8")
    assert "## Per-cell evidence" in record and "| adaptive | 2/2 | 4.00 |" in record
    # Each frontier apart too, in numeric order, never only the geomean over them.
    tiers = [(t["cell"], t["tier"], t["decode_tok_s"], t["runs"]) for t in summary["tiers"]]
    assert tiers == [("legacy", "128", 8.0, 2), ("legacy", "2048", 2.0, 2),
                     ("adaptive", "128", 8.0, 2), ("adaptive", "2048", 2.0, 2)]  # fmt: skip
    assert "| legacy | 128 | 2 | 8.0 tok/s |" in record
    html = (root / "report.html").read_text(encoding="utf-8")
    assert "Per tier" in html and "8.0 tok/s" in html
