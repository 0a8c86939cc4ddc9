"""harness: benchmark and A/B campaign orchestration for two-tier mixture-of-experts runtimes.

The library API is the CLI's pipeline, one call per stage, for a script or a notebook::

    import harness

    outcome = harness.run_campaign("campaigns/demo.yaml", scale=0.25)
    analysis = harness.analyze_campaign(outcome.directory)
    verdict = harness.evaluate_gates(analysis)
    harness.render_report(outcome.directory, analysis, verdict)
    print(verdict.passed, verdict.exit_code())

``load_card`` and ``build_plan`` check a card and order its runs without touching a box. Each
name is imported when first used, so ``import harness`` stays as light as ``harness --version``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_API = {
    "load_card": "harness.card.load",
    "build_plan": "harness.plan.build",
    "run_campaign": "harness.execute.campaign",
    "analyze_campaign": "harness.analyze.campaign",
    "evaluate_gates": "harness.gate.evaluate",
    "render_report": "harness.report",
}

if TYPE_CHECKING:
    from harness.analyze.campaign import analyze_campaign
    from harness.card.load import load_card
    from harness.execute.campaign import run_campaign
    from harness.gate.evaluate import evaluate_gates
    from harness.plan.build import build_plan
    from harness.report import render_report


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
    "evaluate_gates",
    "load_card",
    "render_report",
    "run_campaign",
]
