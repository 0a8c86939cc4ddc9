"""``harness analyze DIR`` (a campaign's tables) and ``harness compare A B`` (two builds)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK

__all__ = ["register"]


def _cmd_analyze(args: argparse.Namespace, out: TextIO) -> int:
    from harness.analyze.campaign import summary_text
    from harness.report.terminal import print_comparisons
    from harness.spine import analyze_only

    analysis, folder = analyze_only(Path(args.dir))
    if args.json:
        out.write(summary_text(analysis, with_history=True) + "\n")
    else:
        print_comparisons(analysis, folder, out)
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    from harness.analyze.across import compare_campaigns
    from harness.analyze.campaign import analyze_campaign
    from harness.report.terminal import print_campaigns

    a, b = analyze_campaign(Path(args.dir_a)), analyze_campaign(Path(args.dir_b))
    rows = compare_campaigns(a, b, cross_box=args.cross_box)
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
    else:
        print_campaigns(a, b, rows, out)
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``analyze`` and ``compare``."""
    analyze = verbs.add_parser("analyze", help="compute the tables of a campaign directory")
    analyze.add_argument("dir", metavar="DIR", help="the campaign directory `harness run` printed")
    analyze.add_argument("--json", action="store_true", help="print the summary as JSON")
    analyze.set_defaults(handler=_cmd_analyze)

    compare = verbs.add_parser(
        "compare", help="two campaigns of the same card side by side (two builds)"
    )
    compare.add_argument("dir_a", metavar="DIR_A", help="the baseline campaign")
    compare.add_argument("dir_b", metavar="DIR_B", help="the candidate campaign")
    compare.add_argument(
        "--cross-box", action="store_true", help="compare campaigns from different boxes anyway"
    )
    compare.add_argument("--json", action="store_true", help="machine-readable rows")
    compare.set_defaults(handler=_cmd_compare)
