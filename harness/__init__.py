"""harness: benchmark and A/B campaign orchestration for two-tier mixture-of-experts runtimes.

The library API walks the CLI's own path (:mod:`harness.spine`), for a script or a notebook::

    import harness

    result = harness.run_campaign("campaigns/demo.yaml", scale=0.25)  # `harness run`
    print(result.exit_code, result.concluded.report)
    again = harness.gate_campaign(result.directory)  # `harness gate DIR`: the same directory
    decision = harness.decide(result.directory)  # analysis and verdict, nothing written
    print(decision.verdict.passed, decision.analysis.comparisons[0].comparison.label)

``load_card`` and ``build_plan`` check a card and order its runs without touching a box;
``analyze_campaign``, ``evaluate_gates`` and ``render_report`` are the spine's stages one by one.
Each name is imported when first used, so ``import harness`` stays as light as ``--version``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.version import __version__

# name -> the module that defines it
_API = {
    "load_card": "harness.card.load",
    "build_plan": "harness.plan.build",
    "run_campaign": "harness.spine",
    "gate_campaign": "harness.spine",
    "report_campaign": "harness.spine",
    "decide": "harness.spine",
    "analyze_campaign": "harness.analyze.campaign",
    "evaluate_gates": "harness.gate.evaluate",
    "render_report": "harness.report",
}

if TYPE_CHECKING:
    from harness.analyze.campaign import analyze_campaign
    from harness.card.load import load_card
    from harness.gate.evaluate import evaluate_gates
    from harness.plan.build import build_plan
    from harness.report import render_report
    from harness.spine import decide, gate_campaign, report_campaign, run_campaign


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


__all__ = [
    "__version__",
    "analyze_campaign",
    "build_plan",
    "decide",
    "evaluate_gates",
    "gate_campaign",
    "load_card",
    "render_report",
    "report_campaign",
    "run_campaign",
]
