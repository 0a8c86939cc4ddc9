"""The ``regression`` gate: not worse than the last N promoted campaigns; fails closed."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pandas as pd

from harness.analyze.campaign import analyze_campaign
from harness.cli import main
from harness.formats.records import write_parquet
from harness.gate.evaluate import evaluate_gates
from harness.history.store import COLUMNS

DEMO = Path(__file__).parent.parent / "data" / "campaigns" / "demo-shaped"
GATE = "  - {kind: regression, metric: decode_tok_s, last: 2}\n"


def _campaign(reports: Path, stamp: str) -> Path:
    root = reports / "demo" / stamp
    shutil.copytree(DEMO, root)
    card = root / "card.yaml"
    card.write_text(card.read_text(encoding="utf-8").rstrip("\n") + "\n" + GATE, encoding="utf-8")
    return root


def _regression(root: Path) -> tuple[bool, str]:
    verdict = evaluate_gates(analyze_campaign(root))
    (result,) = [g for g in verdict.gates if g.kind == "regression"]
    return result.passed, result.reason


def _promoted(reports: Path, values: list[float], stamp: str, *, passed: bool = True,
              box: str = "local") -> None:  # fmt: skip
    row = dict.fromkeys(COLUMNS)
    row.update(campaign="demo", stamp=stamp, dir=f"/elsewhere/{stamp}", finished_at=float(stamp),
               box=box, cell="seed", cache_state="warm", control="stale", metric="decode_tok_s",
               value=float(pd.Series(values).median()), block_values=values,
               passed=passed)  # fmt: skip
    write_parquet(
        pd.DataFrame([row], columns=list(COLUMNS)), reports / "history" / f"{stamp}.parquet"
    )


def _seed_values(root: Path) -> list[float]:
    runs = analyze_campaign(root).runs
    return [float(v) for v in runs[runs["cell"] == "seed"]["decode_tok_s"]]


def test_no_history_fails_closed(tmp_path: Path) -> None:
    root = _campaign(tmp_path / "reports", "20261201T000000Z")
    passed, reason = _regression(root)
    assert not passed and "no promoted campaign of 'demo' on box 'local'" in reason
    out = io.StringIO()
    # demo-shaped predates sealing: gated with the flag, its verdict marked unverified.
    assert main(["gate", str(root), "--quiet", "--allow-unsealed"], out=out) == 1
    # Outside reports/<campaign>/<stamp> there is no store at all: also a failure.
    elsewhere = tmp_path / "x" / "y"
    shutil.copytree(root, elsewhere)
    passed, reason = _regression(elsewhere)
    assert not passed and "no results store" in reason


def test_not_worse_than_the_promoted_passes_and_a_regression_fails(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    root = _campaign(reports, "20261201T000000Z")
    now = _seed_values(root)
    _promoted(reports, [v * 0.75 for v in now], "1")  # the older builds were slower
    _promoted(reports, [v * 0.76 for v in now], "2")
    passed, reason = _regression(root)
    assert passed, reason
    assert "against the last 2 promoted (1, 2)" in reason
    # A newer promoted build 20% faster than this one: this campaign regressed.
    _promoted(reports, [v * 1.3 for v in now], "3")
    _promoted(reports, [v * 1.35 for v in now], "4")
    passed, reason = _regression(root)
    assert not passed and "may be worse than the 2% margin" in reason and "(3, 4)" in reason
    # Campaigns that did not pass, or ran on another box, are not promoted baselines.
    _promoted(reports, [v * 0.5 for v in now], "5", passed=False)
    _promoted(reports, [v * 0.5 for v in now], "6", box="gh200-a")
    assert "(3, 4)" in _regression(root)[1]


def test_the_report_shows_the_history_the_gate_read(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    root = _campaign(reports, "20261201T000000Z")
    now = _seed_values(root)
    _promoted(reports, [v * 0.9 for v in now], "1")
    _promoted(reports, [v * 0.91 for v in now], "2")
    assert main(["gate", str(root), "--quiet", "--allow-unsealed"], out=io.StringIO()) in (0, 1)
    html = (root / "report.html").read_text(encoding="utf-8")
    assert "<h3>History</h3>" in html and "regression decode_tok_s" in html
