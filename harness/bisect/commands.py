"""``harness bisect CARD --repo DIR --good REV --bad REV`` (or ``--builds DIR…``): the first
bad build, each step a crossover campaign; ``harness bisect --resume DIR`` goes on after a kill.

Exit 0 with a culprit or "no culprit"; 1 when the culprit is left in a range or the
reproduction stayed undecided; 2 on bad input; a signal's code when interrupted.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from harness.errors import EXIT_GATE_FAILED, EXIT_OK, BadInput

__all__ = ["register"]


def _metric(card: Any, asked: str | None) -> str:
    if asked:
        return asked
    for gate in card.gates:
        metric = getattr(gate, "metric", None)
        if gate.kind in ("better", "regression") and metric:
            return str(metric)
    raise BadInput(
        f"{card.campaign}: no better or regression gate names a metric; give --metric "
        "(decode_tok_s, tpot_p50_ms, ...)"
    )


def _start(args: argparse.Namespace) -> tuple[Path, Any]:
    from harness.bisect.builds import commits_between, given_folders
    from harness.bisect.run import BisectState
    from harness.card import load_card
    from harness.stats.build_step import StepDesign

    if args.card is None:
        raise BadInput("give a CARD to bisect with, or --resume DIR")
    card_path = Path(args.card).resolve()
    loaded = load_card(card_path)
    if loaded.runtime.build is None:
        raise BadInput(
            f"{args.card}: runtime {loaded.runtime.name!r} has no `build` section, so a bisect "
            "cannot boot one build per arm; add build: {command: [...], knob: NAME} to its "
            "profile"
        )
    if args.builds:
        if args.repo or args.good or args.bad:
            raise BadInput("give --builds DIR… or --repo with --good and --bad, not both")
        builds, repo = given_folders(args.builds), ""
    else:
        if not (args.repo and args.good and args.bad):
            raise BadInput("give --repo DIR --good REV --bad REV (or --builds DIR…)")
        repo = str(Path(args.repo).resolve())
        builds = commits_between(Path(repo), args.good, args.bad)
    design = StepDesign(
        first_cycles=args.first_cycles,
        max_cycles=args.max_cycles,
        error=args.error,
        reproduce_max_cycles=args.reproduce_max_cycles,
    )
    metric = _metric(loaded.card, args.metric)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = Path(args.out) if args.out else Path(args.reports) / "bisect" / stamp
    if folder.exists() and any(folder.iterdir()):
        raise BadInput(f"--out {folder}: not empty; resume a bisect there with --resume {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    state = BisectState(str(card_path), metric, repo, builds, design)
    state.keep(folder)
    return folder, state


def _cmd_bisect(args: argparse.Namespace, out: TextIO) -> int:
    import yaml

    from harness.bisect.report import conclusion, write_report
    from harness.bisect.run import BisectState, Runner
    from harness.bisect.search import Outcome
    from harness.boxes.interrupts import describe, exit_code
    from harness.card import load_card

    if args.resume:
        folder = Path(args.resume)
        state = BisectState.load(folder)
    else:
        folder, state = _start(args)
    loaded = load_card(Path(state.card))
    recipe = loaded.runtime.build
    if recipe is None:
        raise BadInput(f"{state.card}: its runtime profile lost its `build` section")
    raw = yaml.safe_load(loaded.text)
    out.write(f"bisect folder: {folder} ({len(state.builds)} builds, metric {state.metric})\n")
    runner = Runner(folder, state, raw, recipe, out)
    try:
        runner.run()
    except KeyboardInterrupt as exc:  # between campaigns (a build, a look): state is saved
        runner.interrupted, runner.exit_code = describe(exc), exit_code(exc)
    page = write_report(folder, state)
    if runner.interrupted:
        out.write(f"interrupted ({runner.interrupted}); resume with: harness bisect --resume "
                  f"{folder}\n")  # fmt: skip
        return runner.exit_code
    out.write(conclusion(state) + "\n")
    out.write(f"report: {page}\n")
    ended = state.search().outcome()
    return EXIT_OK if ended in (Outcome.CULPRIT, Outcome.NO_CULPRIT) else EXIT_GATE_FAILED


def register(verbs: Any) -> None:
    """Add ``bisect`` to the ``harness`` parser."""
    from harness.stats.build_step import StepDesign

    default = StepDesign()
    bisect = verbs.add_parser("bisect", help="find the first bad build, step by step campaigns")
    bisect.add_argument("card", nargs="?", metavar="CARD", help="the campaign card to measure with")
    bisect.add_argument("--repo", help="the runtime's git repository")
    bisect.add_argument("--good", help="a commit known good")
    bisect.add_argument("--bad", help="a later commit known bad")
    bisect.add_argument("--builds", nargs="+", metavar="DIR", help="built folders, good first")
    bisect.add_argument("--metric", help="the metric bisected (default: the card's first gate's)")
    bisect.add_argument("--out", help="the bisect's folder (default reports/bisect/<stamp>)")
    bisect.add_argument("--reports", default="reports", help="where the default folder goes")
    bisect.add_argument("--resume", metavar="DIR", help="go on with the bisect in DIR")
    bisect.add_argument("--first-cycles", type=int, default=default.first_cycles,
                        help="a search step's first look (cycles)")  # fmt: skip
    bisect.add_argument("--max-cycles", type=int, default=default.max_cycles,
                        help="a search step's last look; past it the build is skipped")  # fmt: skip
    bisect.add_argument("--reproduce-max-cycles", type=int,
                        default=default.reproduce_max_cycles,
                        help="the reproduction's last sequential look")  # fmt: skip
    bisect.add_argument("--error", type=float, default=default.error,
                        help="a search step's error rate each way (Wald's α = β)")  # fmt: skip
    bisect.set_defaults(handler=_cmd_bisect)
