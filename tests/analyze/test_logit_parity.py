"""Logit parity in the exact_outputs gate: frontier-logit dumps hashed per prompt and frontier.

The dumps are written by a real process the runner drives: a command-driver profile whose command
is a shell script writing ``frontier_NNNNNN.logits.json`` files (ds4-bench's names and fields) and a
one-row CSV, so the runner collects them, analysis hashes them and the gate compares them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from harness.analyze.logit_parity import embedded_mismatch, read_logit_dumps
from tests.conftest import REPO, run_cli

# ds4-bench's keys ("ctx" is its --ctx-alloc); `mkdir` without -p: like ds4-bench, the script
# needs the dump folder the runner creates (ds4-bench never creates it).
SCRIPT = (
    'mkdir "$0/logits/p1"; '
    "for f in 000128 002048; do "
    'printf \'{"model": "%s", "ctx": %s, "argmax_id": 7, "logits": [%s, 0.5]}\' '
    '"$MODEL" "$ALLOC" "$LOGIT$f" > "$0/logits/p1/frontier_$f.logits.json"; done; '
    'echo "ctx_tokens,gen_tps"; echo "128,$SPEED"'
)

CARD = f"""
campaign: logit-parity
box: local
runtime:
  name: fake-bench
  driver:
    kind: command
    argv: [sh, -c, {json.dumps(SCRIPT)}, "{{run_dir}}"]
    result: csv
    columns: {{decode_tok_s: gen_tps}}
  logit_dumps: {{path: "{{run_dir}}/logits"}}
  knobs:
    logit: {{env: LOGIT}}
    speed: {{env: SPEED}}
    model: {{env: MODEL}}
    alloc: {{env: ALLOC}}
prompts:
  pools: [prompts/mixed.jsonl]
workload:
  warmup_requests: 0
  phases:
    - {{name: bench, domains: [en-prose], requests: 1}}
cells:
  ctrl: {{knobs: {{logit: "1.5", speed: "10", model: /m/a.gguf, alloc: "33000"}}}}
  same: {{knobs: {{logit: "1.5", speed: "12", model: /m/a.gguf, alloc: "33000"}}}}
  differ: {{knobs: {{logit: "2.5", speed: "11", model: /m/a.gguf, alloc: "33000"}}}}
  path: {{knobs: {{logit: "1.5", speed: "10", model: /m/b.gguf, alloc: "33000"}}}}
control: ctrl
design: {{order: abba, cycles: 1, cache_states: [warm]}}
guards: {{enabled: false}}
gates:
  - {{kind: exact_outputs, min_match: all}}
"""


def test_dumps_hash_per_file_and_combined(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    bodies = {"frontier_000128": b'{"argmax_id": 1}', "frontier_002048": b'{"argmax_id": 2}'}
    for name, body in bodies.items():
        (tmp_path / "a" / f"{name}.logits.json").write_bytes(body)
    (tmp_path / "a" / "frontier_000128.decode.json").write_bytes(b"{}")  # not a logits dump
    dumps = read_logit_dumps(tmp_path)
    assert dumps.hashes == {
        f"a/{name}": hashlib.sha256(body).hexdigest() for name, body in bodies.items()
    }
    joined = "".join(h + "\n" for h in sorted(dumps.hashes.values()))
    assert dumps.combined_sha256 == hashlib.sha256(joined.encode()).hexdigest()
    assert read_logit_dumps(tmp_path / "a").combined_sha256 == dumps.combined_sha256
    assert read_logit_dumps(tmp_path / "none").combined_sha256 is None


def test_embedded_strings_that_differ_are_named() -> None:
    same = {"a": {"model": {"/m/a"}}, "b": {"model": {"/m/a"}}}
    assert embedded_mismatch(same) is None
    warning = embedded_mismatch({"a": {"model": {"/m/a"}}, "b": {"model": {"/m/b"}}})
    assert warning is not None and "model (a: /m/a, b: /m/b)" in warning
    assert "the same binary name, model path, backend, quality and --ctx-alloc" in warning


def test_ds4_identity_keys_are_read_back(tmp_path: Path) -> None:
    # The keys as ds4-bench writes them (ds4_bench.c, write_frontier_logits_json).
    body = (
        '{"source":"ds4-bench","model":"/m/a.gguf","backend":"cpu","quality":false,'
        '"quant_bits":2,"prompt_tokens":3,"ctx":8,"vocab":2,"argmax_id":0,"logits":[1.0,0.5]}'
    )
    (tmp_path / "frontier_000003.logits.json").write_text(body, encoding="utf-8")
    embedded = read_logit_dumps(tmp_path).embedded
    assert embedded == {
        "source": {"ds4-bench"},
        "model": {"/m/a.gguf"},
        "backend": {"cpu"},
        "quality": {"false"},
        "ctx": {"8"},
    }
    warning = embedded_mismatch({"a": embedded, "b": {**embedded, "ctx": {"16"}}})
    assert warning is not None and "ctx (a: 8, b: 16)" in warning


@pytest.mark.slow
def test_exact_outputs_compares_logits_per_prompt_and_frontier(tmp_path: Path) -> None:
    shutil.copytree(REPO / "campaigns" / "prompts", tmp_path / "prompts")
    card = tmp_path / "card.yaml"
    card.write_text(CARD, encoding="utf-8")
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=300)
    assert "runs: 12 done, 0 failed" in result.stdout, result.stdout + result.stderr
    (root,) = [p for p in reports.glob("*/*") if p.is_dir()]
    summary = json.loads((root / "analysis" / "summary.json").read_text(encoding="utf-8"))
    (warning,) = [w for w in summary["warnings"] if "embed different strings" in w]
    assert "ctrl: /m/a.gguf" in warning and "path: /m/b.gguf" in warning
    verdict = json.loads((root / "verdict.json").read_text(encoding="utf-8"))
    (gate,) = [g for g in verdict["gates"] if g["kind"] == "exact_outputs"]
    cells = gate["evidence"]["cells"]
    assert cells["same"]["matched"] == 2 and cells["same"]["n"] == 2
    assert sorted(cells["differ"]["mismatched"]) == ["p1/frontier_000128", "p1/frontier_002048"]
    assert cells["path"]["matched"] == 0  # identical logits, another embedded model path
    assert not gate["passed"] and not gate["incomplete"]
    records = sorted((root / "runs").iterdir())
    assert all((r / "logits" / "p1" / "frontier_000128.logits.json").is_file() for r in records)
