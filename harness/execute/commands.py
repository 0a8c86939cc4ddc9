"""``harness run`` (a campaign, new or resumed), and the verbs that reach a box outside one.

``run`` executes a plan's runs not yet done under the campaign directory's lock, then analyses
and gates it, all through :func:`harness.spine.run_campaign`. ``box check`` preflights one box,
or every box of a card's fleet, and prints each check with its fix; ``collect`` boots one cell
and sends a prompt split (or one run's workload), saving the route counts ``fit-map`` reads and
the route trace ``simulate`` replays.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from harness.errors import EXIT_INFRASTRUCTURE, EXIT_OK, BadInput

if TYPE_CHECKING:
    pass

__all__ = ["register"]


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    from harness.report.terminal import print_conclusion
    from harness.spine import run_campaign

    result = run_campaign(
        args.card,
        resume=args.resume,
        cycles=args.cycles,
        reports=args.reports,
        scale=args.scale,
        quiet=args.quiet,
        out=out,
        allow_unsealed=args.allow_unsealed,
    )
    if result.concluded is None:
        out.write(
            f"interrupted ({result.outcome.interrupted_by}); "
            f"resume with: harness run --resume {result.directory}\n"
        )
        return result.exit_code
    decided = result.concluded.decision
    print_conclusion(
        decided.analysis, decided.verdict, result.concluded.report, decided.root, out, quiet=False
    )
    if result.outcome.failed:
        out.write(
            f"{len(result.outcome.failed)} runs could not be completed (see their run.json for "
            f"reasons); retry them with: harness run --resume {result.directory}\n"
        )
    return result.exit_code


def _cmd_box_check(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_boxes, load_card
    from harness.execute.preflight import check_box
    from harness.profiles.box import BoxSpec
    from harness.profiles.schema import RuntimeProfile

    profile: RuntimeProfile | None = None
    card_dir = Path.cwd()
    boxes: dict[str, BoxSpec] = {}
    names = [args.name] if args.name else []
    if args.card:
        loaded = load_card(Path(args.card))
        profile, card_dir = loaded.runtime, loaded.directory
        boxes.update(dict(loaded.boxes))
        names = names or [name for name, _ in loaded.boxes]  # a fleet: every box
    if not names:
        raise BadInput("give a box NAME, or --card CARD to check the card's boxes")
    boxes = {**load_boxes(card_dir), **boxes}
    failed_boxes = 0
    for name in names:
        if name not in boxes:
            raise BadInput(
                f"unknown box {name!r}; known: {', '.join(sorted(boxes))} "
                "(boxes.yaml beside the card, ./campaigns/boxes.yaml, or the package's)"
            )
        checks = check_box(name, boxes[name], profile)
        for check in checks:
            out.write(f"{'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}\n")
            if not check.ok and check.fix:
                out.write(f"     fix: {check.fix}\n")
        failed = sum(not check.ok for check in checks)
        out.write(f"box {name}: {len(checks) - failed} of {len(checks)} checks passed\n")
        failed_boxes += failed > 0
    if len(names) > 1 and failed_boxes:
        out.write(
            f"{failed_boxes} of {len(names)} boxes failed: a fleet drops them at the start of "
            "`harness run` and deals their cohorts to the others\n"
        )
    return EXIT_OK if failed_boxes == 0 else EXIT_INFRASTRUCTURE


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _cmd_collect(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_card, scale_workload
    from harness.execute.collect import collect_counts

    loaded = load_card(Path(args.card))
    if args.scale is not None:
        if not args.as_run:
            raise BadInput("--scale applies to --as-run (the workload of a scaled run)")
        loaded = scale_workload(loaded, args.scale)
    cell = args.cell or loaded.card.control or next(iter(loaded.card.cells))
    domains = [d for d in (args.domains or "").split(",") if d]
    collected = collect_counts(
        loaded,
        cell,
        args.split,
        Path(args.out),
        passes=args.passes,
        domains=domains or None,
        max_tokens=args.max_tokens,
        as_run=args.as_run,
        routes_from_responses=args.routes_from_responses,
        top_k=args.top_k,
        experts=args.experts,
    )
    if collected.orphans_stopped:
        groups = ", ".join(str(g) for g in collected.orphans_stopped)
        out.write(
            f"stopped what an earlier, killed collection into {args.out} left running "
            f"(process group {groups})\n"
        )
    sent = "one run's workload" if args.as_run else f"split {args.split!r}"
    out.write(
        f"{collected.requests} requests, {collected.tokens} tokens ({sent}) "
        f"with cell {cell!r}\ncounts: {collected.counts}\n"
    )
    if collected.trace is not None:
        out.write(f"route trace: {collected.trace}\n")
    if args.as_run and collected.trace is not None:
        out.write(f"next: harness simulate {args.card} --traces {collected.trace}\n")
    else:
        out.write(f"next: harness fit-map {collected.counts} --top K -o rowmap.json\n")
    return EXIT_OK


def register(verbs: Any) -> None:
    """Add ``run``, ``box check`` and ``collect`` to the ``harness`` parser."""
    run = verbs.add_parser("run", help="execute a campaign (or resume one)")
    run.add_argument(
        "card", nargs="?", metavar="CARD", help="the campaign card (YAML); none with --resume"
    )
    run.add_argument("--resume", metavar="DIR", help="continue the campaign in DIR")
    run.add_argument(
        "--cycles",
        type=int,
        metavar="N",
        help="with --resume: extend the campaign to N mirrored cycles in all (never fewer)",
    )
    run.add_argument("--reports", default="reports", help="where campaign folders go")
    run.add_argument("--quiet", action="store_true", help="no progress bar (for CI logs)")
    run.add_argument(
        "--allow-unsealed",
        action="store_true",
        help="with --resume: gate a directory not sealed from its start, the verdict marked "
        "unverified (refused without)",
    )
    run.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="F",
        help="scale every phase's requests and duration by F (0.25 for a quick look)",
    )
    run.set_defaults(handler=_cmd_run)

    box = verbs.add_parser("box", help="boxes: check that one is ready")
    box_verbs = box.add_subparsers(
        dest="box_verb", metavar="VERB", required=True, help="check: preflight a box"
    )
    check = box_verbs.add_parser("check", help="preflight a box (reachable, python, disk, clock…)")
    check.add_argument("name", nargs="?", metavar="NAME", help="box name (default: the card's)")
    check.add_argument("--card", metavar="CARD", help="also check the card's runtime on the box")
    check.set_defaults(handler=_cmd_box_check)

    collect = verbs.add_parser(
        "collect", help="boot a cell, send one prompt split, save route counts (for fit-map)"
    )
    collect.add_argument("card", metavar="CARD", help="the campaign card whose runtime to boot")
    collect.add_argument("--cell", help="cell whose knobs to boot with (default: the control)")
    collect.add_argument("--split", default="fit", help="prompt split to send (default: fit)")
    collect.add_argument("--passes", type=int, default=1, help="passes over the split")
    collect.add_argument("--domains", help="only these domains, comma-separated")
    collect.add_argument("--max-tokens", type=int, help="tokens per request (default: the card's)")
    collect.add_argument(
        "--as-run",
        action="store_true",
        help="send exactly one run's workload (warmup, then the card's phases on held-out "
        "prompts): the trace to give `harness simulate` for predictions the box can check",
    )
    collect.add_argument(
        "--scale",
        type=float,
        metavar="F",
        help="with --as-run: the workload of `harness run --scale F`",
    )
    collect.add_argument(
        "--routes-from-responses",
        action="store_true",
        help="take the routing from whole (non-streamed) responses, for a runtime that returns "
        "it (vLLM's and SGLang's --enable-return-routed-experts; the profile's "
        "telemetry.response_routes)",
    )
    collect.add_argument(
        "--top-k",
        type=_at_least_one,
        metavar="K",
        help="with --routes-from-responses: the model's experts per token (num_experts_per_tok); "
        "SGLang returns flat int32 that needs it, vLLM's arrays are checked against it",
    )
    collect.add_argument(
        "--experts",
        type=_at_least_one,
        metavar="N",
        help="with --routes-from-responses: the model's routed experts per layer, the width of "
        "counts.json (default: the highest id seen + 1)",
    )
    collect.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder")
    collect.set_defaults(handler=_cmd_collect)
