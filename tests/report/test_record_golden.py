"""``record.md`` and ``report.html`` hold the same seed tables, pinned on fixed run records.

The records are tests/data/campaigns/demo-shaped (a real demo campaign). The record's seed-table
sections (recovery, swap cost, policy) are pinned by a golden file, and every row of them is
checked against the page's table rows and against ``analyze --json``'s numbers, so the three
cannot drift apart. ``HARNESS_UPDATE_GOLDEN=1`` rewrites the golden file; on a mismatch the
got-file is written beside it.
"""

from __future__ import annotations

import difflib
import html
import os
import re
import shutil
from pathlib import Path

import pytest

from harness.analyze.campaign import analyze_campaign
from harness.gate.evaluate import evaluate_gates
from harness.report import fmt, render_report
from tests.conftest import DATA

RECORDS = DATA / "campaigns" / "demo-shaped"
GOLDEN = DATA / "golden" / "demo-shaped.record-tables.md"
SECTIONS = ("## Recovery after", "## Swap cost", "## Per-cell evidence", "## Map comparison")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict[str, object]]:
    root = tmp_path_factory.mktemp("demo") / "20261201T100919Z"
    shutil.copytree(RECORDS, root, ignore=shutil.ignore_patterns("README.md"))
    analysis = analyze_campaign(root)
    render_report(root, analysis, evaluate_gates(analysis), figures=False)
    record = (root / "record.md").read_text(encoding="utf-8")
    page = (root / "report.html").read_text(encoding="utf-8")
    return record, page, analysis.seed_tables.to_json()


def _sections(record: str) -> str:
    """The record's seed-table sections, each up to the next heading of its level."""
    parts = re.split(r"(?m)^(?=## )", record)
    return "".join(p for p in parts if p.startswith(SECTIONS))


def _rows(markdown: str, heading: str) -> list[list[str]]:
    """The first table's body rows under ``heading``, cells unescaped."""
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    table: list[list[str]] = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip("|").split(" | ")])
    return table


def _page_rows(page: str, css: str) -> list[list[str]]:
    """The body rows of the page's first table of class ``css``, as visible text."""
    body = page.split(f'<table class="{css}">', 1)[1].split("</tbody>", 1)[0].split("<tbody>")[1]
    rows = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)
        rows.append([html.unescape(re.sub(r"<[^>]+>", " ", c)).split() for c in cells])
    return [[" ".join(c) for c in r] for r in rows]


def test_record_tables_match_the_golden_file(rendered: tuple[str, str, dict[str, object]]) -> None:
    got = _sections(rendered[0])
    assert got.count("## ") == 4, got
    if os.environ.get("HARNESS_UPDATE_GOLDEN"):
        GOLDEN.write_text(got, encoding="utf-8")
    want = GOLDEN.read_text(encoding="utf-8")
    if got != want:
        got_path = GOLDEN.with_suffix(".got.md")
        got_path.write_text(got, encoding="utf-8")
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), got.splitlines(True), "want", "got")
        )
        raise AssertionError(f"record.md tables differ from {GOLDEN.name}:\n{diff}")


def test_record_and_page_show_the_same_recovery_and_swap_rows(
    rendered: tuple[str, str, dict[str, object]],
) -> None:
    record, page, _ = rendered
    recovery = _rows(record, "## Recovery after")
    on_page = _page_rows(page, "recovery")
    assert len(recovery) == len(on_page) == 2
    for mine, theirs in zip(recovery, on_page, strict=True):
        # The page's cell column carries the description too; the numbers and the note marks
        # (tying each footnote to its row) agree.
        assert mine[1:] == theirs[1:], (mine, theirs)
        assert re.findall(r"⚠\d+", mine[0]) == re.findall(r"⚠\d+", theirs[0]) != []
        assert theirs[0].startswith(mine[0].split(" ")[0])
    swap = _rows(record, "## Swap cost")
    swap_page = _page_rows(page, "swap-cost")
    assert [r[1:] for r in swap] == [r[1:] for r in swap_page]


def test_record_rows_are_the_analysis_numbers(rendered: tuple[str, str, dict[str, object]]) -> None:
    record, _, tables = rendered
    ladder = tables["recovery"]
    assert isinstance(ladder, dict)
    for row, line in zip(ladder["rows"], _rows(record, "## Recovery after"), strict=True):
        t90 = row["t90"][0]
        if t90["median_s"] is None and t90["no_excess"] == t90["runs"]:
            median = "n/a (no excess)"
        else:
            median = "never" if t90["never_majority"] else fmt.seconds(t90["median_s"])
        assert line[2].startswith(median)
        assert line[5] == fmt.pct(t90["peak_cold_share"], 1)
        assert line[6] == fmt.pct(t90["converged_cold_share"], 1)
    swaps = tables["swap_cost"]
    assert isinstance(swaps, list) and swaps
    for row, line in zip(swaps, _rows(record, "## Swap cost"), strict=True):
        assert line[3].startswith(fmt.fixed(row["ms_per_swap"], 2, "ms"))
        assert line[4].startswith(fmt.ratio(row["ratio_to_free_p95"]))
        assert row["ms_per_swap_ci"][0] <= row["ms_per_swap"] <= row["ms_per_swap_ci"][1]


def test_timed_phases_show_loads_and_bytes_per_request(tmp_path: Path) -> None:
    # The same records under a card whose shift phase is timed: run totals would move with
    # throughput, so the policy table shows them per request served, and says so.
    from harness.report import tables

    root = tmp_path / "demo" / "20261201T100919Z"
    shutil.copytree(RECORDS, root, ignore=shutil.ignore_patterns("README.md"))
    card = root / "card.yaml"
    text = card.read_text(encoding="utf-8")
    card.write_text(text.replace("requests: 8, shift: true", "duration_s: 2, shift: true"))
    analysis = analyze_campaign(root)
    policy = tables.policy_table(analysis)
    assert policy is not None and "per request" in policy["evidence_title"]
    for row, values in zip(policy["rows"], analysis.seed_tables.policy, strict=True):
        per_request = values.values["expert_loads"] / values.values["expert_loads_per_request"]
        assert per_request == pytest.approx(round(per_request))  # totals ÷ requests served
        assert row["loads"]["text"].endswith("/request")
    # Per-run counter totals move with the requests a timed phase served: neither file may call
    # them drift-proof.
    render_report(root, analysis, evaluate_gates(analysis), figures=False)
    record = (root / "record.md").read_text(encoding="utf-8")
    page = html.unescape((root / "report.html").read_text(encoding="utf-8"))
    title = "Counters (a timed phase: totals move with the requests served; rates do not)"
    assert f"## {title}" in record and title in page
    assert "Deterministic evidence (drift cannot move it)" not in record + page


def test_frozen_adaptation_titles_the_tables_and_empties_recovery_with_its_reason(
    tmp_path: Path,
) -> None:
    from harness.report import tables
    from harness.report.labels import adaptation, section_title
    from harness.report.terminal import unmeasured_shifts

    root = tmp_path / "demo" / "20261201T100919Z"
    shutil.copytree(RECORDS, root, ignore=shutil.ignore_patterns("README.md"))
    card = root / "card.yaml"
    card.write_text(card.read_text(encoding="utf-8").replace("policy: adaptive", "policy: frozen"))
    analysis = analyze_campaign(root)
    assert adaptation(analysis.card) == "adaptation frozen"
    title = section_title("Recovery after domain shifts", analysis.card)
    assert "varied: files.rowmap; adaptation frozen" in title
    recovery = tables.recovery_table(analysis)
    assert recovery is not None
    for row in recovery["rows"]:
        (t,) = row["t90"]
        assert t["text"] == t["ratio"] == t["t2x"] == "n/a (adaptation frozen)"
        assert t["peak"].endswith("%")  # the cold shares a frozen map is judged on stay
    # No footnote on a frozen map's T90 ("never recovered", "no excess", a phase too short to
    # measure one), and every row's marks point at a note.
    for words in ("never recovered", "no excess", "under converged_span_s"):
        assert not any(words in n for n in recovery["notes"]), words
    marks = [i for row in recovery["rows"] for i in row["note_ids"]]
    assert all(1 <= i <= len(recovery["notes"]) for i in marks)
    # The T90 definition is not printed under a table with no T90, and the cold-share figure's
    # caption (the figure draws no T90 mark or legend) says why it marks none.
    assert recovery["definition"].startswith("T90 and T2x are not measured: adaptation is")
    page = render_report(root, analysis, evaluate_gates(analysis)).read_text(encoding="utf-8")
    assert "(adaptation is frozen in every cell: no T90 is marked)" in page
    assert "▼ marks where each run" not in page and "T90: time from the shift" not in page
    # Nor does `run` tell a frozen card to lengthen its phases: nothing there would recover.
    assert unmeasured_shifts(analyze_campaign(RECORDS)).startswith("warning: in 11 of 12 runs")
    assert unmeasured_shifts(analysis) == ""


def test_titles_say_what_each_comparison_varies_against_the_control() -> None:
    """The queue-rate ladder varies drain_every in its rungs and the map only in its stale
    companion: no title calls the rungs a map comparison, and none names a seed's shape."""
    from harness.card import load_card
    from harness.report.labels import section_title, varied_against

    card = load_card(Path(__file__).resolve().parents[2] / "campaigns/queue-rate-ladder.yaml").card
    assert varied_against(card, "b2-4x") == ["knobs.drain_every"]
    assert varied_against(card, "stale-b0") == ["files.rowmap"]
    title = section_title("Map comparison, held-out prompts", card)
    assert "b1-2x varies knobs.drain_every" in title
    assert "stale-b0 varies files.rowmap" in title
    assert "shape of" not in title
