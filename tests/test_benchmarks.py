"""Every ``harness bench NAME`` runs: exit 0 and its figures printed, at ``--quick`` sizes.

No timing is asserted (figures are what a benchmark reports, not what a test checks); a benchmark
that stops running, or prints nothing, fails here instead of rotting until someone needs it.
A benchmark with checks of its own runs in its own test file instead (``ELSEWHERE``): ``sim`` and
``sweep`` beside their unit tests, ``drive`` beside its schedule server, ``vllm-client`` with the
vLLM venv in tests/engines/test_vllm.py.
"""

from __future__ import annotations

import json
import math

import pytest

from harness.benchmarks.commands import bench_names
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow

ELSEWHERE = {
    "drive": "tests/drive/test_bench_drive.py",
    "faults": "tests/analyze/test_faults.py",
    "sim": "tests/sim/test_bench_sim.py",
    "sweep": "tests/sim/test_sweep.py",
    "vllm-client": "tests/engines/test_vllm.py",
}
LOCAL = sorted(set(bench_names()) - set(ELSEWHERE))


def test_benchmarks_run_elsewhere_are_run_there() -> None:
    for name, where in ELSEWHERE.items():
        assert name in bench_names()
        text = (REPO / where).read_text(encoding="utf-8")
        module = name.replace("-", "_")
        runs = (f'"bench", "{name}"', f"bench_{module}.run_bench(quick=True")
        assert any(run in text for run in runs), where


def assert_figures(name: str, stdout: str) -> None:
    """The ``--json`` output of ``harness bench NAME`` names the benchmark and holds figures,
    each with a name, a unit and a number (NaN only for a figure that says it was not measured)."""
    payload = json.loads(stdout)
    assert payload["benchmark"] == name
    figures = payload["figures"]
    assert figures, stdout
    for figure in figures:
        assert figure["name"] and isinstance(figure["unit"], str), figure
        value = figure["value"]
        assert isinstance(value, int | float), figure
        assert math.isfinite(value) or "not measured" in figure["name"], figure


@pytest.mark.parametrize("name", LOCAL)
def test_benchmark_runs_and_prints_its_figures(name: str) -> None:
    result = run_cli("bench", name, "--quick", "--json", timeout_s=600)
    assert result.code == 0, result.stdout + result.stderr
    assert_figures(name, result.stdout)


def test_boot_cost_counts_a_contradiction_only_where_a_design_rules_the_other_out() -> None:
    from harness.benchmarks.boot_cost import _Campaign, _contradicts

    def campaign(label: str, ratio: float, low: float | None, high: float | None) -> _Campaign:
        return _Campaign(0.0, {"k": label}, {"k": (ratio, low, high)}, [], 1, 1, 0.0)

    tight_worse = campaign("worse", 0.96, 0.95, 0.97)
    wide = campaign("inconclusive", 0.87, 0.44, 1.72)
    assert not _contradicts("k", tight_worse, wide)  # the tighter design decided; no conflict
    assert not _contradicts("k", wide, tight_worse)  # an undecided label claims nothing
    outside = campaign("carry-over", 1.0, 0.9, 1.1)  # undecided, but its interval excludes 0.8
    assert _contradicts("k", campaign("worse", 0.80, 0.7, 0.9), outside)
    assert _contradicts("k", tight_worse, campaign("better", 1.1, 1.05, 1.15))
    assert not _contradicts("k", tight_worse, campaign("inconclusive", 0.9, None, None))


def test_confirmation_lowers_false_worse_at_most_one_campaign_per_true_failure() -> None:
    from harness.benchmarks import confirmation

    figures = confirmation.run_bench(quick=True)
    gated = {f.name.split(" (")[0]: f for f in figures if f.passed is not None}
    assert len(gated) == 3 and all(f.passed for f in gated.values()), figures
    one_box = next(f for f in figures if f.name.startswith("A/A: false worse, one box"))
    both = gated["A/A: false worse, confirmed on a second box"]
    assert both.value < one_box.value / 10  # two independent boxes: about its square


def test_bisect_names_the_culprit_within_the_step_budget_and_clears_a_clean_history() -> None:
    from harness.benchmarks import bisect

    figures = bisect.run_bench(quick=True)
    gated = [f for f in figures if f.passed is not None]
    assert len(gated) == 3 and all(f.passed for f in gated), figures
    named = next(f for f in figures if f.name.startswith("culprit named"))
    assert "run twice 0.3" in named.baseline  # no statistics: most bisects end on a wrong build
    # The step test costs less box time than deciding every step by the labels.
    time = next(f for f in figures if f.name == "box time per bisect, with a regression")
    assert float(time.baseline.split("(")[1].rstrip("x)")) < 0.8, time
