"""The HTML report over a real campaign directory made by the reference runtime.

One session-scoped tiny campaign (2 cells, 1 ABBA cycle, 2 held-out prompts, 8 tokens, a small
refbox geometry) feeds every test: the report's sections, its table values against the analysis,
escaping of hostile text, failed runs, the copy under ``reports/`` and the CLI verb.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from harness.analyze.campaign import CampaignAnalysis, analyze_campaign, write_analysis
from harness.analyze.cell_values import ratio_of
from harness.formats.records import Journal
from harness.gate.evaluate import evaluate_gates
from harness.report import build_context, copy_path, fmt, render_report
from harness.report.commands import register
from harness.report.context import boxes_context
from tests.conftest import run_cli

POOL = [
    {"id": "en-fit-1", "domain": "en-prose", "split": "fit", "prompt": "The river ran low."},
    {
        "id": "en-held-1",
        "domain": "en-prose",
        "split": "heldout",
        "prompt": "She opened the ledger.",
    },
    {"id": "py-fit-1", "domain": "python", "split": "fit", "prompt": "def f(x):\n    return x"},
    {"id": "py-held-1", "domain": "python", "split": "heldout", "prompt": "import os\nfor p in"},
]
ENV = {
    "REFBOX_LAYERS": "2",
    "REFBOX_EXPERTS": "8",
    "REFBOX_HOT_SLOTS": "4",
    "REFBOX_EXPERT_BYTES": "4096",
}
CARD = f"""\
campaign: tiny-report
description: Tiny campaign for the report tests
box: local
runtime: refbox
prompts:
  pools: [pool.jsonl]
  fit: {{split: fit}}
  heldout: {{split: heldout}}
workload:
  max_tokens: 8
  warmup_requests: 0
  phases:
    - {{name: prose, domains: [en-prose], requests: 2}}
    - {{name: code, domains: [python], requests: 2, shift: true}}
cells:
  control:
    description: frozen residency
    env: {json.dumps(ENV)}
    knobs: {{policy: frozen}}
  adaptive:
    description: adaptive residency
    env: {json.dumps(ENV)}
    knobs: {{policy: adaptive}}
control: control
design: {{order: abba, cycles: 1, repeats: 1, cache_states: [warm], seed: 3, retries: 0}}
analysis: {{window_s: 0.5, converged_span_s: 0.5, hold_s: 0.5}}
gates:
  - {{kind: exact_outputs, min_match: all}}
  - {{kind: counter, counter: new_swapout_pages, max: 0}}
  - {{kind: better, metric: decode_tok_s}}
"""
HOSTILE = (
    "<script>alert('x')</script><img src=x onerror=alert(1)>"
    "\n# 2026-12-01 forged: PASS\n<!-- [bold red]x[/] [link](javascript:alert(1)) | a"
)

_CACHE: dict[str, Path] = {}


def make_tiny_campaign(base: Path) -> Path:
    """Run the tiny card once per session with the real runner, through the library API
    (``harness.run_campaign``); return the campaign directory."""
    if "root" in _CACHE:
        return _CACHE["root"]
    import harness

    cards = base / "cards"
    cards.mkdir(parents=True, exist_ok=True)
    (cards / "pool.jsonl").write_text("\n".join(json.dumps(p) for p in POOL) + "\n")
    (cards / "tiny.yaml").write_text(CARD)
    result = harness.run_campaign(cards / "tiny.yaml", reports=base / "reports")
    outcome = result.outcome
    assert not outcome.failed and not outcome.interrupted, f"tiny runs failed: {outcome.failed}"
    _CACHE["root"] = result.directory
    return result.directory


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny campaign directory (read-only for tests: copy it before changing anything)."""
    return make_tiny_campaign(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="session")
def tiny(tiny_root: Path) -> tuple[CampaignAnalysis, str, dict[str, Any]]:
    """Analysis of the tiny campaign, its rendered report and the report's context."""
    analysis = analyze_campaign(tiny_root)
    verdict = evaluate_gates(analysis)
    path = render_report(tiny_root, analysis, verdict)
    context = build_context(tiny_root, analysis, verdict, figures=False)
    return analysis, path.read_text(encoding="utf-8"), context


def _copy(root: Path, dest: Path) -> Path:
    target = dest / "reports" / root.parent.name / root.name
    shutil.copytree(root, target)
    return target


def _text(page: str) -> str:
    """Visible-ish text of the page: tags dropped, entities decoded, whitespace collapsed."""
    body = re.sub(r"<style.*?</style>", " ", page, flags=re.S)
    body = re.sub(r"<[^>]+>", " ", body)
    return re.sub(r"\s+", " ", html.unescape(body))


def test_sections_are_present_in_order(tiny: tuple[CampaignAnalysis, str, dict[str, Any]]) -> None:
    _, page, _ = tiny
    ids = ["verdict", "campaign", "results", "figures", "outputs", "provenance"]
    positions = [page.index(f'<section id="{i}">') for i in ids]
    assert positions == sorted(positions)
    for anchor in ("comparisons", "recovery", "frozen", "policy"):
        assert f'id="{anchor}"' in page, anchor


def test_verdict_banner_matches_the_gates(
    tiny_root: Path, tiny: tuple[CampaignAnalysis, str, dict[str, Any]]
) -> None:
    analysis, page, _ = tiny
    verdict = evaluate_gates(analysis)
    assert f'data-verdict="{verdict.word}"' in page  # PASS, UNDECIDED or FAIL
    css = {"pass": "pass", "undecided": "undecided"}.get(verdict.outcome, "fail")
    assert f"banner {css}" in page
    text = _text(page)
    for gate in verdict.gates:
        assert gate.name in text
        assert gate.reason in text
    passed = sum(g.passed for g in verdict.gates)
    assert f"{passed} of {len(verdict.gates)} gates passed" in text


def test_tables_equal_the_analysis(tiny: tuple[CampaignAnalysis, str, dict[str, Any]]) -> None:
    analysis, page, context = tiny
    text = _text(page)
    cells = analysis.cells.set_index("cell")
    policy = {row["cell"]: row for row in context["policy"]["rows"]}
    for cell in analysis.card.cells:
        assert policy[cell]["decode"]["value"] == pytest.approx(cells.loc[cell, "decode_tok_s"])
        assert policy[cell]["loads"]["value"] == pytest.approx(cells.loc[cell, "expert_loads"])
        assert policy[cell]["bytes"]["value"] == pytest.approx(cells.loc[cell, "bytes_read"])
        assert policy[cell]["hit_rate"]["value"] == pytest.approx(cells.loc[cell, "hit_rate"])
        for shown in ("decode", "loads", "bytes", "hit_rate"):
            assert policy[cell][shown]["text"] in text
    # Comparison ratios and CIs are the analysis's, formatted to three decimals.
    table = analysis.comparison_table()
    shown_rows = context["timing_rows"] + context["deterministic_rows"]
    assert len(shown_rows) == len(table)
    for row in table.to_dict("records"):
        match = [r for r in shown_rows if r["metric"] == row["metric"] and r["cell"] == row["cell"]]
        assert len(match) == 1
        assert match[0]["ratio"] == pytest.approx(row["ratio"])
        assert match[0]["label"] == row["label"]
        assert match[0]["deterministic"] == row["deterministic"]
        assert fmt.ratio3(row["ratio"]) in text
    # T90: the median over runs of analysis.shifts, per direction.
    recovery = {row["cell"]: row for row in context["recovery"]["rows"]}
    shifts = analysis.shifts
    for cell in analysis.card.cells:
        values = shifts[shifts["cell"] == cell]["t90_s"].dropna()
        if len(values) == len(shifts[shifts["cell"] == cell]):
            assert recovery[cell]["t90"][0]["value"] == pytest.approx(values.median())
        churn = cells.loc[cell, "churn_per_min"]
        assert recovery[cell]["churn"]["value"] == pytest.approx(churn)


def test_frozen_map_table_uses_domain_medians(
    tiny: tuple[CampaignAnalysis, str, dict[str, Any]],
) -> None:
    analysis, _, context = tiny
    (table,) = context["frozen"]
    rows = {row["label"]: row for row in table["rows"]}
    domains = analysis.domains
    for domain in ("en-prose", "python"):
        pick = domains[domains["domain"] == domain]
        control = pick[pick["cell"] == "control"]["decode_tok_s"].median()
        cell = pick[pick["cell"] == "adaptive"]["decode_tok_s"].median()
        assert rows[f"{domain} C1"]["control"]["value"] == pytest.approx(control)
        assert rows[f"{domain} C1"]["cell"]["value"] == pytest.approx(cell)
        assert rows[f"{domain} C1"]["delta"] == fmt.delta(ratio_of(control, cell))


def test_campaign_section_shows_diff_design_pools_and_box(
    tiny_root: Path, tiny: tuple[CampaignAnalysis, str, dict[str, Any]]
) -> None:
    _, page, context = tiny
    cells = {c["name"]: c for c in context["cells"]}
    # Only the knob that differs is listed for the treatment; the env is identical.
    assert [s["key"] for s in cells["adaptive"]["settings"]] == ["knobs.policy"]
    assert cells["adaptive"]["settings"][0]["was"] == "frozen"
    blocks = context["design"]["strips"][0]["blocks"]
    assert "".join(b["arm"] for b in blocks) == "ABBA"
    assert all(b["ok"] for b in blocks)
    assert {r["domain"]: (r["fit"], r["heldout"]) for r in context["pools"]["rows"]} == {
        "en-prose": (1, 1),
        "python": (1, 1),
    }
    box = json.loads((tiny_root / "boxes" / "local.json").read_text())
    assert box["runtime"]["binary_sha256"] in page
    assert str(escape((tiny_root / "card.yaml").read_text())) in page


def test_report_is_self_contained(tiny: tuple[CampaignAnalysis, str, dict[str, Any]]) -> None:
    _, page, _ = tiny
    assert "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page and "url(http" not in page
    assert page.count("data:image/png;base64,") >= 3  # cold share, cycles, TPOT at least


def test_copy_goes_under_reports_with_links_rebased(tiny_root: Path) -> None:
    copy = copy_path(tiny_root, "tiny-report")
    assert copy is not None and copy.is_file()
    assert copy.name == f"tiny-report-{tiny_root.name}.html"
    page = copy.read_text()
    prefix = f"{tiny_root.parent.name}/{tiny_root.name}/"
    assert f'href="{prefix}card.yaml"' in page
    assert (copy.parent / prefix / "card.yaml").is_file()
    assert 'href="card.yaml"' in (tiny_root / "report.html").read_text()


def test_no_copy_outside_reports(tiny_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "elsewhere" / "run1"
    shutil.copytree(tiny_root, root)
    analysis = analyze_campaign(root)
    path = render_report(root, analysis, evaluate_gates(analysis))
    assert path == root / "report.html" and path.is_file()
    assert copy_path(root, "tiny-report") is None
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["run1"]


def test_hostile_prompt_and_output_text_is_escaped(tiny_root: Path, tmp_path: Path) -> None:
    root = _copy(tiny_root, tmp_path)
    analysis = analyze_campaign(root)
    outputs = analysis.outputs
    target = outputs["prompt_id"].iloc[0]
    # The treatment's output of one prompt turns hostile (and so differs from the control).
    hit = (outputs["cell"] == "adaptive") & (outputs["prompt_id"] == target)
    outputs.loc[hit, "output_text"] = HOSTILE
    outputs.loc[hit, "output_sha256"] = "f" * 64
    outputs.loc[outputs["prompt_id"] == target, "prompt_id"] = HOSTILE
    analysis.card = analysis.card.model_copy(update={"description": HOSTILE})
    verdict = evaluate_gates(analysis)
    assert not verdict.gates[0].passed, "the injected mismatch must fail exact outputs"
    page = render_report(root, analysis, verdict).read_text()
    assert "<script>" not in page and "<img src=x" not in page
    escaped = str(escape(HOSTILE))
    assert page.count(escaped) >= 3  # description, mismatch prompt id, the output itself
    assert "Exact-output mismatches" in page
    assert "<!--" not in page.split("<body", 1)[1]
    # record.md, written beside the page from the same context: inert where markdown renders.
    record = (root / "record.md").read_text()
    assert "<script>" not in record and "<img" not in record and "<!--" not in record
    assert "](javascript:" not in record and "\n# 2026-12-01 forged" not in record
    assert "&lt;script>alert('x')&lt;/script>" in record  # inert, and no more escaped than that


def test_failed_and_missing_runs_are_shown(tiny_root: Path, tmp_path: Path) -> None:
    root = _copy(tiny_root, tmp_path)
    runs = sorted((root / "runs").iterdir())
    record_path = runs[1] / "run.json"
    record = json.loads(record_path.read_text())
    record.update(
        status="failed",
        reason="boot: refbox exited with code 1 before /health turned 200",
        log_tail="refbox: --hot-slots: must be at most the expert count\nTraceback <frame>",
    )
    record_path.write_text(json.dumps(record))
    shutil.rmtree(runs[2])  # a run that never wrote its record
    # The journal as a harness that saw these ends writes it: no run_done for either run.
    journal = root / "journal.jsonl"
    kept = [
        line
        for line in journal.read_text().splitlines()
        if not (
            json.loads(line)["event"] == "run_done"
            and json.loads(line)["run_id"] in (runs[1].name, runs[2].name)
        )
    ]
    journal.write_text("\n".join(kept) + "\n")
    from tests.campaign_dirs import rechain_journal  # it imports this module's card

    rechain_journal(journal)
    Journal(journal).append("run_failed", run_id=runs[1].name, reason=record["reason"])
    analysis = analyze_campaign(root)
    verdict = evaluate_gates(analysis)
    assert not verdict.passed
    page = render_report(root, analysis, verdict).read_text()
    text = _text(page)
    assert 'id="failed-runs-banner"' in page
    assert "2 run(s) did not complete" in text
    assert runs[1].name in text and runs[2].name in text
    assert "boot: refbox exited with code 1 before /health turned 200" in text
    assert "Traceback &lt;frame&gt;" in page
    assert "never ran (resume the campaign)" in text
    assert page.count("blk failed") == 2


def test_cli_verb_renders_and_prints_the_path(tiny_root: Path, tmp_path: Path) -> None:
    root = _copy(tiny_root, tmp_path)
    (root / "report.html").unlink(missing_ok=True)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["report", str(root), "--no-figures"])
    out = io.StringIO()
    assert args.handler(args, out) == 0
    assert f"report: {root / 'report.html'}" in out.getvalue()
    assert f"record: {root / 'record.md'}" in out.getvalue()
    assert "rewrote report.html and record.md from the records" in out.getvalue()
    # A page without figures replaces the full one: said where the user reads the command.
    assert f"report.html has no figures now (--no-figures): `harness report {root}`" in (
        out.getvalue()
    )
    page = (root / "report.html").read_text()
    assert "Figures were disabled" in page and "data:image/png" not in page


def test_simulated_sibling_is_shown_as_predicted(tiny_root: Path, tmp_path: Path) -> None:
    root = _copy(tiny_root, tmp_path)
    sibling = root.parent / "20000101T000000Z-sim"
    shutil.copytree(root, sibling)
    (sibling / "SIMULATED").write_text("simulator\n")
    analysis = analyze_campaign(root)
    page = render_report(root, analysis, evaluate_gates(analysis)).read_text()
    assert "Predicted vs measured" in page and sibling.name in page
    alone = _copy(tiny_root, tmp_path / "alone")
    plain = analyze_campaign(alone)
    assert (
        "Predicted vs measured"
        not in render_report(alone, plain, evaluate_gates(plain)).read_text()
    )


def test_predictions_are_found_where_simulate_writes_them(tiny_root: Path, tmp_path: Path) -> None:
    # harness simulate writes reports/<campaign>-sim/<stamp>/ beside reports/<campaign>/.
    root = _copy(tiny_root, tmp_path)
    simulated = root.parent.parent / f"{root.parent.name}-sim" / "20990101T000000Z"
    shutil.copytree(root, simulated)
    (simulated / "SIMULATED").write_text("simulator\n")
    analysis = analyze_campaign(root)
    predicted = analysis.seed_tables.predicted
    assert predicted is not None
    assert predicted.source == f"{root.parent.name}-sim/20990101T000000Z"
    # A copy predicts itself exactly: every error is zero, and the report shows the rows.
    assert predicted.rows and all(r.error == 0 for r in predicted.rows if r.error is not None)
    summary = json.loads((write_analysis(analysis) / "summary.json").read_text())
    assert summary["seed_tables"]["predicted"]["source"] == predicted.source
    page = render_report(root, analysis, evaluate_gates(analysis)).read_text()
    assert "Predicted vs measured" in page and predicted.source in page
    # The simulated campaign itself predicts nothing.
    assert analyze_campaign(simulated).seed_tables.predicted is None


@pytest.mark.parametrize(
    ("control", "cell", "expected"),
    [(127.1, 183.7, "+44.5%"), (202.7, 201.4, "−0.6%"), (85.0, 177.9, "2.1×"), (None, 1.0, "—")],
)
def test_delta_format_follows_seed_000(control: float | None, cell: float, expected: str) -> None:
    assert fmt.delta(ratio_of(control, cell)) == expected


def test_an_ssh_box_shows_where_it_drove_and_its_tunnel_round_trip(tmp_path: Path) -> None:
    (tmp_path / "boxes").mkdir()
    rtt = {"samples": 50, "tunnel": {"median_ms": 0.46}, "ssh_channel": {"median_ms": 0.23}}
    capture = {"box": "gh200", "kind": "ssh", "drive": "tunnel", "tunnel_rtt": rtt}
    (tmp_path / "boxes" / "gh200.json").write_text(json.dumps(capture))
    (tmp_path / "boxes" / "mac.json").write_text(
        json.dumps({"box": "mac", "kind": "ssh", "drive": "on-box", "tunnel_rtt": {"error": "x"}})
    )
    (tmp_path / "boxes" / "local.json").write_text(json.dumps({"box": "local", "kind": "local"}))
    rows = {b["name"]: dict(b["summary"]) for b in boxes_context(tmp_path)}
    assert rows["gh200"]["driver"] == (
        "here, through an SSH tunnel; tunnel round trip 0.46 ms median (SSH channel 0.23 ms)"
    )
    assert rows["mac"]["driver"] == "on the box; tunnel round trip not measured: x"
    assert "driver" not in rows["local"]


def test_a_team_template_in_the_working_directory_extends_the_report(
    tiny_root: Path, tmp_path: Path
) -> None:
    """`templates/report.html.j2` where harness runs replaces the shipped page, and can extend
    it (as harness/report.html.j2) by filling its blocks; elsewhere the shipped one renders."""

    root = _copy(tiny_root, tmp_path)
    team = tmp_path / "team"
    (team / "templates").mkdir(parents=True)
    (team / "templates" / "report.html.j2").write_text(
        '{% extends "harness/report.html.j2" %}\n'
        '{% block header %}<div class="brand">ACME perf review</div>{{ super() }}{% endblock %}\n'
        "{% block footer %}<p>Reviewed under ACME policy 7.</p>{% endblock %}\n"
    )
    done = run_cli("report", str(root), "--no-figures", cwd=team)
    assert done.code == 0, done.stderr
    page = (root / "report.html").read_text()
    assert '<div class="brand">ACME perf review</div>' in page
    assert "Reviewed under ACME policy 7." in page
    assert 'id="verdict"' in page and "<h1>" in page  # the shipped page is all still there
    plain = run_cli("report", str(root), "--no-figures", cwd=tmp_path)
    assert plain.code == 0, plain.stderr
    assert "ACME" not in (root / "report.html").read_text()


def test_the_wheel_carries_the_top_level_templates(tmp_path: Path) -> None:
    """The project's templates live at the top level and are built into the package."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        capture_output=True, text=True, cwd=repo, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    built = tmp_path / "harness" / "templates" / "report.html.j2"
    assert built.read_bytes() == (repo / "templates" / "report.html.j2").read_bytes()


def test_an_exact_count_inside_the_margin_is_not_called_noise(tmp_path: Path) -> None:
    # Hit counts are exact: the same ratio in every cycle gives a zero-width interval. Inside
    # the 2% margin it is labelled within noise (the TOST decision), and the note says what it
    # is: identical, or an exact difference smaller than the margin, not noise.
    from tests.gate.campaigns import COUNTERS, Synth, build_campaign, card_text

    def counters(run: dict[str, Any]) -> dict[str, float]:
        hits = 606.0 if run["cell"] == "treat" else 600.0
        return {**COUNTERS, "hits": hits, "misses": 800.0 - hits}

    gates = "  - {kind: counter, counter: new_swapout_pages, max: 0}"
    root = build_campaign(tmp_path, card_text(gates, cycles=4), Synth(counters=counters)).root
    analysis = analyze_campaign(root)
    context = build_context(root, analysis, evaluate_gates(analysis), figures=False)
    rows = {r["metric"]: r for r in context["deterministic_rows"]}
    assert rows["hit_rate"]["label"] == "within noise", rows["hit_rate"]
    exact = "exactly +1.0% in every cycle: an exact count inside the ±2% margin, not noise"
    assert exact in rows["hit_rate"]["notes"]
    assert rows["expert_loads"]["label"] == "within noise"
    assert "identical in every cycle: an exact count, no noise" in rows["expert_loads"]["notes"]
