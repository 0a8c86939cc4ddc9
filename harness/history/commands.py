"""``harness history [--campaign NAME] [--metric M]``: trends and change points per cell;
``harness history release DIR [--name NAME]``: mark a promoted campaign as a release."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from harness.errors import EXIT_OK, BadInput

__all__ = ["register"]


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(rows), 1, figsize=(8, 2.2 * len(rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], rows, strict=True):
        ax.plot(range(len(row["values"])), row["values"], marker="o", lw=1)
        for point in row["change_points"]:
            ax.axvline(point["index"] - 0.5, color="#c0392b", ls="--", lw=1)
        ax.set_title(f"{row['campaign']} {row['cell']}/{row['cache_state']} {row['metric']}",
                     fontsize=9)  # fmt: skip
        ax.set_xlabel("campaign (oldest first)", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _chosen(table: Any, args: argparse.Namespace) -> Any:
    """The rows of the campaign, metric and cell asked for (all where none was)."""
    for column in ("campaign", "metric", "cell"):
        wanted = getattr(args, column)
        if wanted:
            table = table[table[column] == wanted]
    return table


def _cmd_history(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: registering the verb should not load pandas.
    from harness.history.store import HISTORY_DIR, read_history
    from harness.history.trends import trends

    folder = Path(args.reports) / HISTORY_DIR
    if args.predictions:
        return _predictions(args, folder, out)
    if args.releases:
        return _releases(folder, args, out)
    table = _chosen(read_history(folder), args)
    if table.empty:
        raise BadInput(
            f"{folder}: no history matches; campaigns under {args.reports}/<campaign>/<stamp> "
            "add to it when they finish (harness run, or harness gate DIR)"
        )
    rows = trends(table, args.max_pvalue)
    if args.plot:
        _plot(rows, Path(args.plot))
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    from harness.formats.termtext import shown

    view = Table(title=shown(f"history ({folder})"), title_justify="left")
    for column in ("campaign", "cell", "state", "metric", "n", "first", "last", "change points"):
        view.add_column(column)
    for row in rows:
        changes = "; ".join(
            f"at {p['stamp']}: {p['mean_before']:.4g} → {p['mean_after']:.4g} "
            f"({p['change_pct']:+.1f}%, p={p['pvalue']:.2g})"
            for p in row["change_points"]
        )
        view.add_row(shown(row["campaign"]), shown(row["cell"]), row["cache_state"],
                     shown(row["metric"]),
                     str(len(row["values"])), f"{row['values'][0]:.4g}",
                     f"{row['values'][-1]:.4g}", changes or "none")  # fmt: skip
    Console(file=out, width=160, highlight=False).print(view)
    if args.plot:
        out.write(f"figure: {args.plot}\n")
    return EXIT_OK


def _predictions(args: argparse.Namespace, folder: Path, out: TextIO) -> int:
    """The desk's errors, campaign by campaign: how far each metric's predictions were off."""
    from harness.history.predictions import prediction_summary, read_predictions

    table = _chosen(read_predictions(folder), args)
    if table.empty:
        raise BadInput(
            f"{folder}: no prediction matches; a campaign with a simulated sibling "
            "(harness simulate) adds its errors when it is gated"
        )
    rows = prediction_summary(table)
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    from harness.formats.termtext import shown

    view = Table(title=shown(f"predictions ({folder})"), title_justify="left")
    for column in ("campaign", "stamp", "metric", "cells", "median error", "inside", "note"):
        view.add_column(column)
    for row in rows:
        error = row["median_error_pct"]
        inside = (
            f"{row['inside']} of {row['with_interval']}" if row["with_interval"] else "no interval"
        )
        note = f"{row['mismatches']} mismatch(es) with the card" if row["mismatches"] else ""
        view.add_row(shown(row["campaign"]), row["stamp"], shown(row["metric"]),
                     str(row["rows"]), "—" if error is None else f"{error:.1f}%",
                     inside, note)  # fmt: skip
    Console(file=out, width=160, highlight=False).print(view)
    return EXIT_OK


def _releases(folder: Path, args: argparse.Namespace, out: TextIO) -> int:
    """The releases marked in the store, oldest mark first (the last is the default anchor)."""
    from harness.history.releases import read_releases

    marks = [r for r in read_releases(folder) if not args.campaign or r.campaign == args.campaign]
    if not marks:
        raise BadInput(
            f"{folder}: no release marked; mark the promoted campaign of a released build with "
            "`harness history release DIR --name NAME`"
        )
    rows = [{k: getattr(r, k) for k in ("campaign", "name", "stamp", "box", "dir")} for r in marks]
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    from harness.formats.termtext import shown

    view = Table(title=shown(f"releases ({folder})"), title_justify="left")
    for column in rows[0]:
        view.add_column(column)
    for row in rows:
        view.add_row(*(shown(v) for v in row.values()))
    Console(file=out, width=160, highlight=False).print(view)
    return EXIT_OK


def _cmd_release(args: argparse.Namespace, out: TextIO) -> int:
    from harness.history.releases import mark_release

    mark, path = mark_release(Path(args.dir), args.name)
    out.write(f"{mark.campaign}: {mark.text()} on box {mark.box} marked in {path}\n")
    return EXIT_OK


def _pvalue(text: str) -> float:
    """A p-value threshold: a number strictly between 0 and 1 (NaN would pass every test)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < value < 1.0:  # False for NaN too
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text}")
    return value


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``harness history`` to the CLI."""
    verb = verbs.add_parser("history", help="trends and change points across campaigns")
    verb.add_argument("--reports", default="reports", help="the reports folder (default: reports)")
    verb.add_argument("--campaign", metavar="NAME", help="only this campaign")
    verb.add_argument("--metric", metavar="M", help="only this metric")
    verb.add_argument("--cell", metavar="CELL", help="only this cell")
    verb.add_argument(
        "--max-pvalue",
        type=_pvalue,
        default=0.001,
        help="change-point threshold, a p-value in (0, 1) (default 0.001)",
    )
    verb.add_argument("--plot", metavar="PNG", help="also draw each trend to this file")
    verb.add_argument("--json", action="store_true", help="machine-readable trends")
    verb.add_argument(
        "--predictions",
        action="store_true",
        help="the simulator's errors instead: per campaign and metric, how far its predictions "
        "were from the box (is the desk getting better?)",
    )
    verb.add_argument(
        "--releases",
        action="store_true",
        help="the releases marked in the store instead, oldest mark first",
    )
    verb.set_defaults(handler=_cmd_history)
    actions = verb.add_subparsers(
        dest="history_verb",
        metavar="ACTION",
        help="release: mark a promoted campaign as a release, the anchor of `regression` gates "
        "with `against: release`",
    )
    release = actions.add_parser("release", help="mark a promoted campaign as a release")
    release.add_argument(
        "dir", metavar="DIR", help="the campaign directory, reports/<card>/<stamp>"
    )
    release.add_argument(
        "--name", metavar="NAME", help="the release's name, e.g. v1.2 (default: the stamp)"
    )
    release.set_defaults(handler=_cmd_release)
