"""``harness validate`` and ``harness plan``: a card (or a profile, or boxes.yaml) checked, and its
ordered runs printed, without touching a box."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK, HarnessError

__all__ = ["register"]


def _cmd_validate(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_boxes_file, load_card, scale_workload
    from harness.card.knob_pins import knob_pin_warnings
    from harness.card.phase_length import shift_phase_warnings
    from harness.card.resolve import load_runtime_profile
    from harness.card.simulation_match import simulation_warnings
    from harness.formats.termtext import shown
    from harness.plan.build import build_plan
    from harness.report.terminal import runs_text

    failed: list[HarnessError] = []
    for path in args.cards:
        if Path(path).name == "boxes.yaml":
            try:
                boxes = load_boxes_file(Path(path))
            except HarnessError as problem:
                failed.append(problem)
                continue
            out.write(f"ok: {path} ({len(boxes)} boxes)\n")
            continue
        if Path(path).parent.name == "runtimes":
            try:
                profile = load_runtime_profile(Path(path))
            except HarnessError as problem:
                failed.append(problem)
                continue
            driver = "command driver" if profile.driver is not None else "HTTP"
            counters = sum(len(c.counters()) for c in profile.telemetry.log_counters)
            out.write(
                f"ok: {path} (runtime {profile.name}, {driver}, {len(profile.knobs)} knobs, "
                f"{counters} log counters)\n"
            )
            continue
        try:
            loaded = scale_workload(load_card(Path(path)), args.scale)
        except HarnessError as problem:
            failed.append(problem)
            continue
        plan = build_plan(loaded, scale=args.scale)
        cells = len(loaded.card.cells)
        out.write(f"ok: {path} ({cells} {'cell' if cells == 1 else 'cells'}, {runs_text(plan)})\n")
        warnings = shift_phase_warnings(loaded, scale=args.scale) + knob_pin_warnings(loaded)
        warnings += simulation_warnings(loaded, Path(args.reports))
        for warning in warnings:
            out.write(f"warning: {shown(warning)}\n")
    if failed:
        # Every card's problems, not only the first card's: the last is raised for its exit code.
        for earlier in failed[:-1]:
            with contextlib.suppress(OSError):
                sys.stderr.writelines(f"{line}\n" for line in earlier.lines())
        raise failed[-1]
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    from harness.card import load_card, scale_workload
    from harness.card.knob_pins import knob_pin_warnings
    from harness.card.phase_length import shift_phase_warnings
    from harness.card.simulation_match import simulation_warnings
    from harness.plan.build import build_plan, plan_json_text
    from harness.report.terminal import print_plan

    loaded = scale_workload(load_card(Path(args.card)), args.scale)
    plan = build_plan(loaded, scale=args.scale)
    if args.json:
        out.write(plan_json_text(plan) + "\n")
    elif args.from_dir is not None:
        # The plan's runs are the card's as written; what --from asks is which design to run.
        from harness.analyze.design_cost import price_from
        from harness.report.terminal import print_design_costs

        print_design_costs(price_from(loaded, Path(args.from_dir), boot_s=args.boot_s), out)
    else:
        warnings = shift_phase_warnings(loaded, scale=args.scale) + knob_pin_warnings(loaded)
        warnings += simulation_warnings(loaded, Path(args.reports))
        from harness.plan.measured import measured_runs

        boxes = {run.box for run in plan.runs}
        measured = measured_runs(loaded.card.campaign, boxes, Path(args.reports), args.scale)
        print_plan(plan, out, warnings=warnings, measured=measured)
        if args.boot_s is not None:
            from harness.report.terminal import print_boot_costs

            print_boot_costs(plan, args.boot_s, out)
    return EXIT_OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"must be 0..1e6 seconds, got {text}")
    return value


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``validate`` and ``plan`` to the CLI's subparsers."""
    validate = verbs.add_parser(
        "validate", help="check cards (or runtimes/*.yaml, boxes.yaml) without touching a box"
    )
    validate.add_argument(
        "cards", nargs="+", metavar="CARD", help="campaign cards, runtime profiles or boxes.yaml"
    )
    validate.add_argument(
        "--scale", type=float, default=1.0, metavar="F", help="check the cards as run at --scale F"
    )
    validate.add_argument(
        "--reports",
        default="reports",
        help="where to look for the card's newest simulation (reports/<campaign>-sim/) to hold "
        "the card against",
    )
    validate.set_defaults(handler=_cmd_validate)

    plan = verbs.add_parser("plan", help="print the ordered runs of a card")
    plan.add_argument("card", metavar="CARD", help="the campaign card (YAML)")
    plan.add_argument("--json", action="store_true", help="machine-readable plan")
    plan.add_argument(
        "--reports",
        default="reports",
        help="where to look for the card's newest simulation, to hold the card against",
    )
    plan.add_argument(
        "--scale", type=float, default=1.0, metavar="F", help="plan the card as run at --scale F"
    )
    plan.add_argument(
        "--boot-s",
        type=_seconds,
        metavar="S",
        help="also print, for each boot design (design.boot), the boots and the wall time "
        "with a boot of S seconds",
    )
    plan.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="price every design (boots, cycles, prompts per block) at equal power from a "
        "finished campaign's spread, variance components and measured boot and block times "
        "(--boot-s then prices a boot on another box)",
    )
    plan.set_defaults(handler=_cmd_plan)
