"""``harness simulate CARD --traces T… --sweep …``: the command, from arguments to files.

Writes ``reports/<campaign>-sweep/<stamp>/`` (or ``--out``): the ladder printed and in
``sweep.md``, ``ladder.parquet``, ``rows.parquet``, ``sweep.json`` and ``sweep.png``. With
``--pick K`` also the picked card beside the source card (``<stem>-pick.yaml`` or
``--pick-out``), checked by loading it, and its simulated campaign under
``reports/<campaign>-pick-sim/`` so that running the picked card shows predicted against
measured with default paths. With ``--cost FILE`` (``harness fit-cost``) every point is priced
by the fitted cost, and the picked card's simulation carries the fit's speed intervals.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from harness.errors import EXIT_OK, BadInput

if TYPE_CHECKING:
    from harness.sim.cost_fit import CostFit
    from harness.sim.run_cost_fit import RunCostFit

__all__ = ["add_sweep_arguments", "sweep_command"]

# Below this many replayed tokens in all, the sweep runs in this process by default: a spawned
# worker takes seconds to import and load the compiled kernels, longer than such a sweep.
SMALL_SWEEP_TOKENS = 5_000_000


def _default_jobs(tokens: int, cpus: int) -> int:
    """One process per CPU, unless the sweep is too small to repay starting them."""
    return 1 if tokens < SMALL_SWEEP_TOKENS else cpus


def add_sweep_arguments(sim: argparse.ArgumentParser) -> None:
    """The sweep's flags on ``harness simulate``."""
    sim.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KNOB=V1,V2|LOW:HIGH",
        help="sweep a knob (drain_every, swaps_per_layer, promote_threshold, hysteresis, "
        "decay_half_life_steps, hot_slots, cache_records, hotlist_priority; llama.cpp's "
        "moe_cache_mib, n_cpu_moe) or a map (rowmap, hotlist: files); repeat for a grid",
    )
    sim.add_argument("--sample", type=int, metavar="N", help="N random points instead of the grid")
    sim.add_argument("--seed", type=int, help="seed of --sample (default: the card's design seed)")
    sim.add_argument("--base", metavar="CELL", help="cell the sweep varies (default: the control)")
    sim.add_argument("--jobs", type=int, metavar="N", help="local processes (default: one per CPU)")
    sim.add_argument(
        "--scheduler", metavar="tcp://HOST:8786", help="run the sweep's tasks on a Dask cluster"
    )
    sim.add_argument(
        "--pick", type=int, metavar="K", help="write a card with the control and K-1 front cells"
    )
    sim.add_argument("--pick-out", metavar="FILE", help="where --pick writes (beside the card)")


def sweep_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run the sweep the arguments describe; exit 0 (warnings do not fail it)."""
    # Imported here: `harness --help` should not pay for pandas, numba and the card loader.
    from harness.card import load_card
    from harness.formats.records import write_parquet
    from harness.sim.pick import pick_points, picked_frame, write_picked_card
    from harness.sim.results import CostModel
    from harness.sim.simulate import simulate_card
    from harness.sim.sweep.grid import run_sweep, sweep_root, write_sweep
    from harness.sim.sweep.show import ladder_figure, ladder_text
    from harness.sim.sweep.spec import grid_points, parse_axes, sample_points
    from harness.sim.sweep.workers import default_jobs, text_progress
    from harness.sim.trace_files import load_trace

    if not args.sweep:
        raise BadInput("give --sweep KNOB=V1,V2,... (repeat for a grid)")
    if args.reference or args.start != "card":
        raise BadInput(
            "a sweep replays from the card's maps with the fast replay (its decisions are the "
            "plain replay's, tests pin it); drop --reference and --start"
        )
    if args.pick is not None and args.pick < 2:
        raise BadInput(f"--pick {args.pick}: pick at least 2 (the control and one cell to boot)")
    loaded = load_card(Path(args.card))
    cost_fit: CostFit | RunCostFit | None = None
    if args.cost:  # before the traces: a bad cost file is found without loading them
        from harness.sim.cost_fit import read_cost

        cost_fit = read_cost(Path(args.cost))
    target = (
        Path(args.pick_out) if args.pick_out else loaded.directory / f"{loaded.path.stem}-pick.yaml"
    )
    if args.pick and target.resolve().parent != loaded.directory.resolve():
        raise BadInput(
            f"--pick-out {target}: write the picked card beside {loaded.path} "
            "(its runtime profiles, boxes and relative paths are found from that folder)"
        )
    traces = [load_trace(path, experts=args.experts) for path in args.traces]
    axes = parse_axes(args.sweep)
    seed = args.seed if args.seed is not None else loaded.card.design.seed
    points = sample_points(axes, args.sample, seed) if args.sample else grid_points(axes)
    cost = CostModel(
        step_ns=round(args.step_ms * 1e6),
        token_ns=round(args.token_ms * 1e6),
        cold_lookup_ns=round(args.cold_ms * 1e6),
        swap_ns=round(args.swap_ms * 1e6),
    )
    root = sweep_root(loaded, Path(args.reports), Path(args.out) if args.out else None)
    jobs = args.jobs or _default_jobs(len(points) * sum(t.rows for t in traces), default_jobs())
    where = f"Dask at {args.scheduler}" if args.scheduler else f"{jobs} local process(es)"
    out.write(f"sweeping {len(points)} points x {len(traces)} trace(s) on {where}\n")
    sweep = run_sweep(
        loaded,
        traces,
        points,
        base=args.base,
        cost=cost,
        jobs=jobs,
        scheduler=args.scheduler,
        progress=text_progress(sys.stderr),
        expert_bytes=args.expert_bytes,
        cost_fit=cost_fit,
    )
    pick = pick_points(sweep, args.pick) if args.pick else None
    text = ladder_text(sweep, pick.front if pick else None, pick.chosen if pick else None)
    columns = [o.column for o in pick.objectives] if pick else ["cold_share", "t90_s"]
    x, y = [*columns, "t90_s"][:2] if len(columns) < 2 else columns[:2]
    figure = ladder_figure(sweep, x, y, pick.front if pick else None, pick.chosen if pick else None)
    write_sweep(sweep, root, text, figure)
    out.write(text)
    out.write(f"sweep directory: {root}\n")
    for warning in sweep.warnings:  # again at the end, where a reader of a long table looks
        out.write(f"{warning}\n(also in {root / 'sweep.md'} and sweep.json)\n")
    if pick is None:
        return EXIT_OK
    for note in pick.notes:
        out.write(f"note: {note}\n")
    for point, why in pick.excluded.items():
        out.write(f"not picked: {point}: {why}\n")
    write_picked_card(sweep, pick, target)
    picked = load_card(target)  # the written card must validate, or this is our bug
    write_parquet(picked_frame(sweep, pick), root / "picked.parquet")
    sim_root, _ = simulate_card(
        picked, traces, reports=Path(args.reports), cost=cost, expert_bytes=args.expert_bytes,
        cost_fit=cost_fit,
    )  # fmt: skip
    out.write(
        f"picked {len(pick.chosen)} cells ({', '.join(pick.chosen)}): wrote {target}\n"
        f"its simulated campaign (what `harness run {target.name}` will be compared with): "
        f"{sim_root}\n"
    )
    del picked
    return EXIT_OK
