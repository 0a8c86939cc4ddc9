"""The simulator's CLI verbs, ``harness simulate`` and ``harness fit-map``.

``harness/cli.py`` calls :func:`register` with its sub-parsers; handlers take
``(args, out)`` and return the exit code, raising harness errors for bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_GATE_FAILED, EXIT_OK, BadInput
from harness.sim.cost import CostModel
from harness.sim.sweep.command import add_sweep_arguments

# The handlers import the stages they run: registering the verbs loads neither numba (the
# policy kernels) nor pandas, so `harness --help` and every other verb start fast.

__all__ = ["register"]

_SIMULATE_HELP = """\
Replay routing traces through the reference runtime's own policy code.

  harness simulate --lockstep TRACE [--out DIR] [--override KNOB=VALUE]
      replay a refbox --route-trace with its recorded knobs and hot sets and compare every
      decision with the swaps the runtime recorded; exit 1 on any divergence. With --out DIR,
      write DIR/lockstep.json (what the `lockstep` gate reads).
  harness simulate CARD --traces FILE... [--out DIR] [--start card|empty]
      write a simulated campaign directory (reports/<campaign>-sim/<stamp>/ by default) that
      `harness analyze` and `harness gate` read unchanged. Traces are replayed in order as one
      stream; rows keep their recorded phase tags, untagged traces are phase 0, 1, ... in order.
  harness simulate CARD --traces FILE... --sweep KNOB=V1,V2 [--sweep ...] [--sample N]
                   [--pick K] [--jobs N | --scheduler tcp://HOST:8786]
      replay every point of a knob grid (or N sampled points from KNOB=LOW:HIGH ranges) on
      every trace; print and write the predicted ladder against the control
      (reports/<campaign>-sweep/<stamp>/); --pick K writes a card with the control and the
      Pareto front on the card's gated metrics. A sweep point booting a map no cell of the
      card boots is flagged WRONG MAP. With --cost FILE every point's speed is priced by the
      fit, and the picked card's simulation carries the fit's intervals.
"""


def _positive_bytes(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a positive number of bytes: {text!r}")
    return int(text)


def _cmd_simulate(args: argparse.Namespace, out: TextIO) -> int:
    if args.lockstep:
        return _lockstep(args, out)
    if args.card is None or not args.traces:
        raise BadInput("give CARD --traces FILE... to simulate a campaign, or --lockstep TRACE")
    if args.sweep:
        from harness.sim.sweep.command import sweep_command

        return sweep_command(args, out)
    if args.pick or args.sample or args.scheduler:
        raise BadInput("--pick, --sample and --scheduler go with --sweep KNOB=V1,V2,...")
    from harness.card import load_card
    from harness.sim.simulate import simulate_card
    from harness.sim.trace_files import load_trace

    loaded = load_card(Path(args.card))
    from harness.sim.cost_fit import CostFit, read_cost

    # Before the traces: a bad cost file is found without loading them.
    cost_fit = read_cost(Path(args.cost)) if args.cost else None
    traces = [load_trace(path, experts=args.experts) for path in args.traces]
    cost = CostModel(
        step_ns=round(args.step_ms * 1e6),
        token_ns=round(args.token_ms * 1e6),
        cold_lookup_ns=round(args.cold_ms * 1e6),
        swap_ns=round(args.swap_ms * 1e6),
    )
    root, cells = simulate_card(
        loaded,
        traces,
        reports=Path(args.reports),
        out=Path(args.out) if args.out else None,
        start=args.start,
        cost=cost,
        fast=not args.reference,
        expert_bytes=args.expert_bytes,
        cost_fit=cost_fit,
    )
    rows = sum(t.rows for t in traces)
    out.write(f"simulated {len(cells)} cells over {rows:,} tokens of {len(traces)} trace(s)\n")
    for cell in cells:
        s = cell.summary()
        out.write(
            f"  {s['cell']}: {s['mode']} from {s['start']}: cold share "
            f"{100 * s['cold_share']:.2f}%, {s['swaps']:,} swaps, {s['expert_loads']:,} loads\n"
        )
        if "oracle_loads" in s:
            over = s["loads_over_oracle"]
            cache = s["oracle_scope"] == "cache"
            slots = f"{s['oracle_hot_slots']:,} " + (
                "records in all, every miss admitted" if cache else "hot slots a layer"
            )
            out.write(
                f"    oracle over the whole trace, {slots}: "
                f"Belady's MIN {s['oracle_loads']:,} loads against the policy's "
                f"{s['replay_loads']:,}"
                + (f" ({over:.2f}x)" if over else "")
                + f"; the best frozen {'set' if cache else 'map'} in hindsight "
                f"{100 * s['best_static_cold_share']:.2f}% "
                f"cold against {100 * s['replay_cold_share']:.2f}%\n"
            )
        if cell.speed:
            out.write(
                "    predicted (fitted cost, 95% interval): " + _speed_text(cell.speed) + "\n"
            )
            if isinstance(cost_fit, CostFit) and (
                note := cost_fit.size_note(cell.settings.record_bytes)
            ):
                out.write(f"    note: {note}\n")
        for metric, label in (("t90_s", "T90"), ("t2x_s", "T2x")):
            band = cell.recovery.get(metric)
            if band is not None and band.get("estimate") is not None:
                low, high = band.get("low"), band.get("high")
                out.write(
                    f"    predicted {label}: {band['estimate']:.2f} s "
                    f"[{'—' if low is None else f'{low:.2f}'}, "
                    f"{'open' if high is None else f'{high:.2f}'}]"
                    " (fitted cost, 95%, widened by a window)\n"
                )
    out.write(f"campaign directory: {root}\n")
    return EXIT_OK


def _speed_text(speed: dict[str, dict[str, float]]) -> str:
    parts = []
    for metric, label, unit, digits in (
        ("ring_decode_tok_s", "decode", " tok/s", 0),
        ("ring_itl_p50_ms", "step p50", " ms", 3),
        ("ring_itl_p95_ms", "p95", " ms", 3),
        ("decode_tok_s", "client decode", " tok/s", 0),
        ("tpot_p50_ms", "client TPOT p50", " ms", 3),
    ):
        if metric in speed:
            v = speed[metric]
            parts.append(
                f"{label} {v['estimate']:.{digits}f}{unit} "
                f"[{v['low']:.{digits}f}, {v['high']:.{digits}f}]"
            )
    return ", ".join(parts)


def _cmd_fit_cost(args: argparse.Namespace, out: TextIO) -> int:
    from harness.sim.cost_fit import MIN_RUNS, fit_cost, write_cost

    if args.per_run:
        if len(args.campaign) > 1:
            raise BadInput("--per-run fits one campaign's runs: give one DIR")
        return _fit_run_cost(args, out)
    fit = fit_cost(
        [Path(c) for c in args.campaign], seed=args.seed, allow_unsealed=args.allow_unsealed
    )
    write_cost(fit, Path(args.output))
    _say_unverified(fit.source, out)
    out.write(
        f"fitted from {fit.steps:,} host steps of {fit.runs} runs: R² {fit.r2:.4f}, residual SD "
        f"{fit.residual_sd_ns / 1e6:.3f} ms "
        f"(decode steps {fit.decode_residual_sd_ns / 1e6:.3f} ms)\n"
    )
    size = f"{fit.record_bytes:,} bytes" if fit.record_bytes else "a row"
    names = {"step_ns": "per step", "token_ns": "per token", "cold_lookup_ns": "per cold lookup",
             "swap_ns": "per applied swap",
             "cold_size_ns": f"per cold lookup, more per {size} more of row",
             "swap_size_ns": f"per applied swap, more per {size} more of row"}  # fmt: skip
    for term in fit.terms:
        low, high = fit.interval[term]
        out.write(
            f"  {names[term]}: {fit.estimate[term] / 1e6:.4f} ms "
            f"[{low / 1e6:.4f}, {high / 1e6:.4f}] (95%, runs resampled)"
            + _negative_note(term, high)
            + "\n"
        )
    if fit.record_bytes and len(fit.row_sizes) > 1:
        sizes = ", ".join(f"{b:,}" for b in fit.row_sizes)
        out.write(
            f"  cold lookup and swap terms are for expert rows of {fit.record_bytes:,} bytes, "
            f"and grow along a line fitted over rows of {sizes} bytes (read from the rings' "
            "bytes_read); a cell of another size reads the line, outside it extrapolates\n"
        )
        if fit.size_warning:
            out.write(f"WARNING: {fit.size_warning}\n")
    elif fit.record_bytes:
        out.write(
            f"  cold lookup and swap terms are for expert rows of {fit.record_bytes:,} bytes "
            "(read from the rings' bytes_read); a cell of another size scales them whole (fit "
            "from campaigns of two expert_bytes, fit-cost DIR DIR, to measure how they grow)\n"
        )
    if fit.client is not None:
        overhead = fit.client["tpot_overhead_ms"]
        low, high = overhead["ci"]
        out.write(
            f"  the HTTP path, beyond a token's decode step: {overhead['estimate']:.4f} ms "
            f"[{low:.4f}, {high:.4f}] a token (median of {fit.client['runs']} runs; client TPOT "
            "and decode tok/s are predicted with it)\n"
        )
    else:
        out.write(
            f"  the HTTP path: not fitted (under {MIN_RUNS} runs whose requests match their "
            "ring one by one, at concurrency 1): no client TPOT or decode tok/s is predicted\n"
        )
    ratio = fit.measured_swap.get("swap_cost_ratio")
    per_swap = fit.measured_swap.get("swap_ms_per_swap")
    if ratio is not None and per_swap is not None:
        out.write(
            f"  measured on the same rings (seed 000's reading): a swap-bearing decode step runs "
            f"at {ratio:.2f}x the swap-free p95, {per_swap:.4f} ms per applied swap\n"
        )
    out.write(
        f"cost model: {args.output} (harness simulate CARD --traces ... --cost {args.output})\n"
    )
    return EXIT_OK


def _say_unverified(source: str, out: TextIO) -> None:
    from harness.formats.verify import UNSEALED_NOTE

    if UNSEALED_NOTE in source:
        out.write(f"WARNING: fitted from records nothing vouches for: {source}\n")


def _fit_run_cost(args: argparse.Namespace, out: TextIO) -> int:
    from harness.formats.records import write_json_atomic
    from harness.sim.run_cost_fit import fit_run_cost

    fit = fit_run_cost(Path(args.campaign[0]), allow_unsealed=args.allow_unsealed)
    write_json_atomic(Path(args.output), fit.to_json())
    _say_unverified(fit.source, out)
    low, high = fit.load_range
    out.write(
        f"fitted from {fit.runs} runs (one point each): R² {fit.r2:.4f}\n"
        f"  ms a decode token with no expert loads: {fit.base_ms:.4f} "
        f"[{fit.base_ci[0]:.4f}, {fit.base_ci[1]:.4f}] (95%, t on runs − 2 degrees of freedom)\n"
        f"  ms per expert load a token: {fit.per_load_ms:.4f} "
        f"[{fit.per_load_ci[0]:.4f}, {fit.per_load_ci[1]:.4f}]\n"
        f"  fitted over {low:.4g}–{high:.4g} loads a token; a cell outside is extrapolated\n"
        f"cost model: {args.output} (harness simulate CARD --traces ... --cost {args.output})\n"
    )
    return EXIT_OK


def _lockstep(args: argparse.Namespace, out: TextIO) -> int:
    from harness.formats.records import write_json_atomic
    from harness.sim.decisions import lockstep, lockstep_text, parse_overrides
    from harness.sim.trace_files import load_trace

    trace = load_trace(args.lockstep)
    result = lockstep(trace, parse_overrides(args.override), fast=not args.reference)
    out.write(lockstep_text(result))
    if args.out:
        path = Path(args.out) / "lockstep.json"
        write_json_atomic(path, result.to_json())
        out.write(f"wrote {path}\n")
    return EXIT_GATE_FAILED if result.divergent else EXIT_OK


def _negative_note(term: str, high: float) -> str:
    """What a term wholly below zero means: no cost is negative, so the other terms took more
    than their share of the time (they move together on these rings); the sum still predicts."""
    if high >= 0:
        return ""
    return (
        ": below zero, which no cost is; the rings cannot tell this term from the others "
        f"(they moved together), so read the terms' sum, not {term} alone"
    )


def _cmd_fit_map(args: argparse.Namespace, out: TextIO) -> int:
    from harness.formats.expert_distribution import read_logical_count, write_logical_count
    from harness.formats.maps import read_hotlist, read_rowmap, write_hotlist, write_rowmap
    from harness.sim.fitmap import (
        COUNT_FORMATS,
        check_held_out,
        coverage,
        cut_ties,
        fit_hotlist_entries,
        fit_top_k,
        frequency_hot,
        load_counts,
        separate_ties,
    )
    from harness.sim.trace_files import file_sha256, load_trace

    kind = args.format or ("hotlist" if args.hotlist is not None else "rowmap")
    counts_file = kind in COUNT_FORMATS
    if counts_file:
        if args.hotlist is not None:
            raise BadInput(f"--format {kind} writes counts: drop --hotlist (give --top K to score)")
        if args.score and kind != "kt-frequency":
            raise BadInput(
                f"--format {kind}: SGLang keeps every expert on a GPU and reads these counts "
                "only to give its redundant slots (--ep-num-redundant-experts) to the hottest "
                "experts, which coverage does not measure; to score the GPU experts KT places "
                "from the same file, give --format kt-frequency --top K"
            )
        if args.score and args.top is None:
            raise BadInput(
                f"--format {kind}: give --top K, the GPU experts per layer the runtime keeps "
                "(--kt-num-gpu-experts), to score the placement the file leads to"
            )
    elif (args.top is None) == (args.hotlist is None):
        raise BadInput("give exactly one of --top K (a rowmap) or --hotlist N (a ds4 hotlist)")
    elif (kind == "rowmap") != (args.top is not None):
        needs = "--top K" if kind == "rowmap" else "--hotlist N"
        raise BadInput(f"--format {kind} goes with {needs}")
    fitted_on: list[tuple[str, str]] = []
    hot: list[list[int]] | None = None
    records: list[tuple[int, int]] | None = None
    if args.map:
        if args.source:
            fitted_on.append((args.source, file_sha256(args.source)))
        if counts_file and args.top is not None:
            stored = read_logical_count(args.map)
            hot = frequency_hot(stored, args.top)
            tied = cut_ties(stored, hot) if kind == "kt-frequency" else 0
            if tied:
                out.write(
                    f"WARNING: {args.map}: {tied} of the GPU experts scored tie at the cut "
                    "with experts left out, and KT's torch.topk breaks ties its own way, so "
                    "it may place others than are scored here; write every count distinct "
                    f"with `harness fit-map {args.map} --format kt-frequency -o NEW.pt`\n"
                )
        elif args.top is not None:
            rowmap = read_rowmap(args.map)
            hot = rowmap.hot
            source_sha = str(rowmap.meta.get("source_sha256", ""))
            if source_sha:
                fitted_on.append((str(rowmap.meta.get("calibration", args.map)), source_sha))
        else:
            entries = read_hotlist(args.map).entries[: args.hotlist]
            records = [(e[0], e[1]) for e in entries]
        out.write(f"scoring {args.map}\n")
    else:
        if not args.source:
            raise BadInput(
                "give SOURCE (a count dump .json, an SGLang dump .pt or a trace) to fit, "
                "or --map FILE"
            )
        if not args.output:
            raise BadInput("give -o FILE for the fitted map")
        source = load_counts(
            args.source, half_life_steps=args.decay_half_life_steps, experts=args.experts
        )
        fitted_on.append((source.path, source.sha256))
        layers, experts = source.counts.shape
        if counts_file:
            _check_suffix(args.output, kind)
            # Written distinct and in the order the harness ranks them (no truncation of
            # decayed counts to tied zeros), and scored as written: the engine places exactly
            # the set scored here, whatever its tie rule.
            table = separate_ties(source.counts)
            write_logical_count(args.output, table)
            if args.top is not None:
                hot = frequency_hot(table, args.top)
            total = float(source.counts.sum())
            weight = f"{total:,.0f}" if total == round(total) else f"{total:,.2f} decay-weighted"
            out.write(
                f"wrote {kind} {args.output}: logical_count [1, {layers}, {experts}], "
                f"{weight} selections, from {source.kind} {source.path}\n"
            )
        elif args.top is not None:
            hot = fit_top_k(source.counts, args.top)
            meta = {
                "calibration": source.path,
                "source_sha256": source.sha256,
                "source_kind": source.kind,
                "n_hot": args.top,
                "fitted_by": "harness fit-map",
            }
            if args.decay_half_life_steps is not None:
                meta["decay_half_life_steps"] = args.decay_half_life_steps
            write_rowmap(args.output, hot, experts, meta)
            out.write(f"wrote rowmap {args.output}: top {args.top} of {experts} per layer, "
                      f"{layers} layers, from {source.kind} {source.path}\n")  # fmt: skip
        else:
            entries = fit_hotlist_entries(source.counts, args.hotlist)
            write_hotlist(args.output, entries, layers, experts, model="refbox")
            records = [(e[0], e[1]) for e in entries]
            out.write(f"wrote hotlist {args.output}: {len(entries):,} records from "
                      f"{source.kind} {source.path}\n")  # fmt: skip
    if args.score:
        flags = check_held_out(args.score, fitted_on, args.in_sample)
        for path, in_sample in zip(args.score, flags, strict=True):
            trace = load_trace(path, experts=args.experts)
            result = coverage(trace, hot=hot, records=records, in_sample=in_sample)
            out.write(f"coverage {result.text()}\n")
    return EXIT_OK


def _check_suffix(path: str, kind: str) -> None:
    """SGLang picks the reader by suffix (.json parsed as JSON, .pt by torch.load)."""
    want = ".json" if kind == "sglang-json" else ".pt"
    if Path(path).suffix.lower() != want:
        raise BadInput(f"-o {path}: --format {kind} writes a {want} file (SGLang reads by suffix)")


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``simulate``, ``fit-cost`` and ``fit-map`` verbs to the harness CLI."""
    sim = verbs.add_parser(
        "simulate",
        help="replay routing traces through the runtime's policy (lockstep, predicted campaigns)",
        description=_SIMULATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument("card", nargs="?", metavar="CARD", help="campaign card to simulate")
    sim.add_argument("--traces", nargs="+", metavar="FILE", help="routing traces to replay")
    sim.add_argument("--lockstep", metavar="TRACE", help="check a refbox route trace in lockstep")
    sim.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="lockstep: replay with this policy knob changed (a deliberate divergence test)",
    )
    sim.add_argument("--out", metavar="DIR", help="output folder (campaign dir, or lockstep.json)")
    sim.add_argument("--reports", default="reports", help="where simulated campaigns go")
    sim.add_argument(
        "--start",
        choices=["card", "empty"],
        default="card",
        help="starting maps: the card's rowmap/hotlist (card), or none: an empty cache, or the "
        "runtime's default map in rowmap mode (a rowmap lane has no empty state)",
    )
    sim.add_argument("--experts", type=int, help="experts per layer, for traces that omit it")
    sim.add_argument("--reference", action="store_true", help="use the plain step-by-step replay")
    sim.add_argument(
        "--expert-bytes",
        type=_positive_bytes,
        metavar="N",
        help="bytes of one expert (gate+up+down) for llama.cpp's expert cache (moe_cache_mib)",
    )
    defaults = CostModel()
    for flag, ns, what in (
        ("--step-ms", defaults.step_ns, "per host step"),
        ("--token-ms", defaults.token_ns, "per token of a step"),
        ("--cold-ms", defaults.cold_lookup_ns, "per cold lookup"),
        ("--swap-ms", defaults.swap_ns, "per applied swap"),
    ):
        sim.add_argument(
            flag, type=float, default=ns / 1e6, help=f"synthetic ring time {what} ({ns / 1e6:g})"
        )
    sim.add_argument(
        "--cost",
        metavar="FILE",
        help="a cost model from `harness fit-cost` (replaces the --*-ms figures): the ring is "
        "priced by it, and each cell's decode speed is predicted with the fit's intervals",
    )
    add_sweep_arguments(sim)
    sim.set_defaults(handler=_cmd_simulate)

    cost = verbs.add_parser(
        "fit-cost",
        help="fit a host step's cost (per step, token, cold lookup, swap) from a campaign's rings",
    )
    cost.add_argument(
        "campaign",
        metavar="DIR",
        nargs="+",
        help="a finished campaign directory; several are pooled (campaigns of two expert_bytes "
        "split each cold and swap cost into its cost at one row size and its growth with size)",
    )
    cost.add_argument("-o", "--output", default="cost.json", help="where to write (cost.json)")
    cost.add_argument("--seed", type=int, default=0, help="seed of the run resampling (0)")
    cost.add_argument(
        "--per-run",
        action="store_true",
        help="fit from run aggregates, for runtimes without a ring (vLLM, SGLang, llama.cpp): "
        "client ms per decode token against expert loads (or cache misses) per token, one "
        "point per run",
    )
    cost.add_argument(
        "--allow-unsealed",
        action="store_true",
        help="fit from a directory with no seal from its start (an older one, or one whose "
        "seal was stripped): refused (exit 3) otherwise; allowed, cost.json names it unverified",
    )
    cost.set_defaults(handler=_cmd_fit_cost)

    fit = verbs.add_parser(
        "fit-map",
        help="fit a rowmap (top K per layer) or hotlist from counts or a trace; score coverage",
    )
    fit.add_argument(
        "source",
        nargs="?",
        metavar="SOURCE",
        help="count dump .json, SGLang counts (.pt dump, logical_count .json/.pt) or a trace",
    )
    fit.add_argument(
        "--format",
        choices=["rowmap", "hotlist", "sglang-json", "sglang-pt", "kt-frequency"],
        help="what to write or score: a rowmap (--top), a ds4 hotlist (--hotlist), SGLang's "
        "--init-expert-location JSON or .pt, KTransformers' frequency file (.pt); a kt-frequency "
        "file is scored as KT's frequency placement of --top K per layer (SGLang keeps every "
        "expert on a GPU: its files have no coverage to score)",
    )
    fit.add_argument("--top", type=int, metavar="K", help="rowmap: keep the top K per layer")
    fit.add_argument("--hotlist", type=int, metavar="N", help="hotlist: the global top N records")
    fit.add_argument("-o", "--output", metavar="FILE", help="where to write the map")
    fit.add_argument(
        "--decay-half-life-steps",
        type=float,
        metavar="H",
        help="weigh a trace's selections by 0.5**(age/H), the runtime's EWMA at its end",
    )
    fit.add_argument("--score", nargs="+", metavar="TRACE", help="held-out traces to score on")
    fit.add_argument(
        "--in-sample", action="store_true", help="allow scoring on the fit traces (labelled)"
    )
    fit.add_argument(
        "--map", metavar="FILE", help="score this existing rowmap/hotlist/counts file instead"
    )
    fit.add_argument("--experts", type=int, help="experts per layer, for traces that omit it")
    fit.set_defaults(handler=_cmd_fit_map)
