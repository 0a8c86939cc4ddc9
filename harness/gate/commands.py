"""``harness gate DIR``: the card's gates over a finished campaign (:mod:`harness.spine`), printed
as every verb that gates prints it (:func:`harness.report.terminal.print_conclusion`)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TextIO

__all__ = ["register"]


def _cmd_gate(args: argparse.Namespace, out: TextIO) -> int:
    from harness.report.terminal import print_conclusion
    from harness.spine import gate_campaign

    concluded = gate_campaign(
        Path(args.dir),
        allow_unsealed=args.allow_unsealed,
        journal_head=args.journal_head,
        confirms=args.confirms,
    )
    decided = concluded.decision
    print_conclusion(
        decided.analysis, decided.verdict, concluded.report, decided.root, out, quiet=args.quiet
    )
    return concluded.exit_code


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gate``."""
    codes = (
        "0 pass; 1 a gate failed or is undecided, or its failure awaits a second box "
        "(unconfirmed); 2 bad input (a card, record or flag "
        "that cannot be read, named with the fix); 3 runs incomplete, a directory that does not "
        "verify against its seal, or an infrastructure error"
    )
    gate = verbs.add_parser(
        "gate",
        help=f"evaluate the card's gates (exit {codes})",
        description="Evaluate the gates of a campaign directory's card; write verdict.json, "
        f"JUnit XML, report.html and record.md. Exit {codes}.",
    )
    gate.add_argument("dir", metavar="DIR", help="the campaign directory `harness run` printed")
    gate.add_argument("--quiet", action="store_true", help="no verdict table")
    gate.add_argument(
        "--allow-unsealed",
        action="store_true",
        help="gate a directory not sealed from its start (made before sealing, or its seal "
        "stripped), every output saying the verdict is unverified; refused (exit 3) without",
    )
    gate.add_argument(
        "--journal-head",
        type=_head,
        metavar="HEX",
        help="the journal head the last gate or run printed (64 hex digits): the directory "
        "fails verification (exit 3) unless every journal line up to it is unchanged and no "
        "line follows it (after a `run --resume`, give the head that run printed)",
    )
    gate.add_argument(
        "--confirms",
        metavar="DIR1",
        help="this campaign (the same card run on the box DIR1's card names in `confirm.box`) "
        "confirms DIR1's unconfirmed failures or not: a failure both boxes show fails, one this "
        "box does not show is not confirmed; both verdicts name the other directory",
    )
    gate.set_defaults(handler=_cmd_gate)


def _head(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", text.strip().lower()):
        raise argparse.ArgumentTypeError(
            f"{text!r:.80} is not a journal head: give the 64 hex digits `harness gate` printed "
            "after 'journal head:'"
        )
    return text.strip().lower()
