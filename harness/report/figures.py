"""The report's figures: matplotlib, drawn off-screen, embedded as base64 PNG.

Each function returns the PNG as base64 text, or None when the campaign has no data for it (the
template then omits the figure). Figures use the object API (no pyplot state), so rendering is
safe to call from any thread. Long rings are downsampled by summing windows, never by dropping
them, so a plotted cold share is still Σcold/Σlookups of the merged windows.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from harness.report.labels import adaptation
from harness.report.tables import t90_text

if TYPE_CHECKING:
    from harness.analyze.campaign import CampaignAnalysis

MAX_FREE_STEPS = 200_000  # swap-free steps sampled per cell for the swap-cost box
DPI = 100
TEXT = "#222222"
MUTED = "#777777"
FLAG = "#c0392b"


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    # Constrained layout already keeps every label inside the figure: a tight bounding box
    # would draw each figure twice (once to measure it) for the same picture.
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _style(ax: Axes) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.tick_params(colors=TEXT, labelsize=8)
    ax.grid(True, color="#e6e6e6", linewidth=0.6)
    ax.set_axisbelow(True)


def _panels(
    n: int, *, height: float = 2.4, ncols: int = 2, width: float = 5.6
) -> tuple[Figure, list[Axes]]:
    cols = min(ncols, n)
    rows = math.ceil(n / cols)
    figure = Figure(figsize=(width * cols, height * rows + 0.4), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    flat: list[Axes] = list(axes.ravel())
    for extra in flat[n:]:
        extra.set_visible(False)
    return figure, flat[:n]


def _log_axis(ax: Axes, which: str, arrays: list[npt.NDArray[np.float64]]) -> None:
    """Log scale with plain tick labels, only when the values span more than 20×."""
    values = np.concatenate(arrays) if arrays else np.array([])
    values = values[np.isfinite(values) & (values > 0)]
    if values.size and values.max() / values.min() > 20:
        axis = ax.xaxis if which == "x" else ax.yaxis
        (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())


def _keys(analysis: CampaignAnalysis) -> Iterator[tuple[str, str, str]]:
    states = analysis.card.design.cache_states
    for cell in analysis.card.cells:
        for state in states:
            yield cell, state, cell if len(states) == 1 else f"{cell} / {state}"


def cold_share_figure(analysis: CampaignAnalysis, palette: dict[str, str]) -> str | None:
    """Cold share over time per cell: one line per run, shift markers, T90 marked and noted."""
    window_s = analysis.card.analysis.window_s
    data = analysis.series.runs
    keys = [k for k in _keys(analysis) if any(r.cold_share and r.cell == k[0] for r in data)]
    if not keys:
        return None
    shifts = analysis.shifts
    # The recovery table's classification: with adaptation frozen in every cell there is no
    # T90 to mark (the table says n/a), whatever a run's cold share did after the shift.
    frozen = adaptation(analysis.card) == "adaptation frozen"
    figure, axes = _panels(len(keys))
    for ax, (cell, state, title) in zip(axes, keys, strict=True):
        color = palette.get(cell, "#555555")
        lines: list[str] = []
        for run in analysis.series.of(cell, state):
            if run.cold_share is None:
                continue
            t, share = run.cold_share
            ax.plot(t, share * 100, color=color, linewidth=0.9, alpha=0.55)
            mine = shifts[shifts["run_id"] == run.run_id] if not shifts.empty else shifts
            for shift in mine.to_dict("records"):
                shift_t = float(shift["shift_t_s"])
                ax.axvline(shift_t, color=MUTED, linewidth=0.7, linestyle=":")
                t90 = shift["t90_s"]
                if not frozen and t90 is not None and math.isfinite(float(t90)):
                    level = float(shift["converged"]) * 100
                    ax.plot([shift_t + float(t90)], [level], marker="v", color=TEXT, ms=4)
        ladder = analysis.seed_tables.recovery
        for row in ladder.rows if ladder and not frozen else ():
            if (row.cell, row.cache_state) == (cell, state):
                # The table's own T90 (one definition): never counted as slowest, n/a apart.
                lines += [f"{t.from_phase}→{t.to_phase} T90 {t90_text(t)}" for t in row.t90]
        ax.set_title(title, fontsize=10, color=TEXT, loc="left")
        ax.set_ylabel("cold share %", fontsize=8)
        ax.set_xlabel(f"s since first step ({window_s:g} s windows)", fontsize=8)
        ax.set_ylim(bottom=0)
        if lines:
            ax.text(
                0.99,
                0.97,
                "\n".join(lines),
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=7.5,
                color=TEXT,
                bbox={"facecolor": "white", "edgecolor": "#cccccc", "alpha": 0.9},
            )
        _style(ax)
    return _png(figure)


def cycles_figure(analysis: CampaignAnalysis, palette: dict[str, str], metric: str) -> str | None:
    """Per-cycle A/B/B/A block values in time order, one line per cycle; drift in red."""
    card = analysis.card
    if card.control is None or not card.treatments:
        return None
    keys = [(cell, state) for cell in card.treatments for state in card.design.cache_states]
    series = {key: analysis.series.cycles(key[0], key[1], metric) for key in keys}
    keys = [k for k in keys if any(points for _, points in series[k])]
    if not keys:
        return None
    n_cycles = max(len(series[k]) for k in keys)
    wide = n_cycles > 6  # many cycles need the full page width to stay readable
    figure, axes = _panels(
        len(keys), height=2.6, ncols=1 if wide else 2, width=11.2 if wide else 5.6
    )
    for ax, (cell, state) in zip(axes, keys, strict=True):
        flagged = {
            flag.cycle
            for item in analysis.comparisons
            if item.cell == cell and item.cache_state == state and item.comparison.metric == metric
            for flag in item.comparison.flags
        }
        for cycle, points in series[(cell, state)]:
            if not points:
                continue
            x = [cycle * 4 + p.slot for p in points]
            y = [p.value for p in points]
            drift = cycle in flagged
            ax.plot(
                x,
                y,
                color=FLAG if drift else MUTED,
                linewidth=1.6 if drift else 1.0,
                linestyle="-" if not drift else "--",
                zorder=1,
            )
            for xi, point in zip(x, points, strict=True):
                arm_cell, value = point.cell, point.value
                arm = "A" if arm_cell == card.control else "B"
                ax.scatter(
                    [xi],
                    [value],
                    s=46 if not wide else 22,
                    color=palette.get(arm_cell, "#555"),
                    zorder=2,
                )
                if wide:
                    continue  # with many cycles the colours carry the arm; letters would overlap
                ax.annotate(
                    arm,
                    (xi, value),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    fontsize=7,
                    color=TEXT,
                )
            if drift:
                ax.annotate(
                    "DRIFT",
                    (x[0], y[0]),
                    textcoords="offset points",
                    xytext=(0, -13),
                    fontsize=7,
                    color=FLAG,
                    fontweight="bold",
                )
        title = f"{metric}: {cell} (B) vs {card.control} (A)"
        if len(card.design.cache_states) > 1:
            title += f", {state}"
        ax.set_title(title, fontsize=10, color=TEXT, loc="left")
        for arm_cell, arm in ((card.control, "A"), (cell, "B")):
            ax.scatter(
                [], [], s=30, color=palette.get(arm_cell, "#555"), label=f"{arm}: {arm_cell}"
            )
        ax.legend(fontsize=7, frameon=False, loc="best")
        ax.set_xlabel("slot in time order (cycle × 4 + slot)", fontsize=8)
        ax.set_ylabel(metric, fontsize=8)
        ax.margins(y=0.2)
        _style(ax)
    return _png(figure)


def tpot_cdf_figure(analysis: CampaignAnalysis, palette: dict[str, str]) -> str | None:
    """Empirical CDF of per-request TPOT per cell (pooled over its runs; log x)."""
    figure = Figure(figsize=(7.2, 3.2), layout="constrained")
    ax = figure.add_subplot()
    drawn = 0
    styles = ["-", "--", ":", "-."]
    states = [str(s) for s in analysis.card.design.cache_states]
    for cell, state, title in _keys(analysis):
        pooled = [r.tpot_ms for r in analysis.series.of(cell, state)]
        values = np.sort(np.concatenate(pooled)) if pooled else np.array([])
        values = values[values > 0]
        if not values.size:
            continue
        y = np.arange(1, values.size + 1) / values.size
        ax.step(
            values,
            y,
            where="post",
            color=palette.get(cell, "#555"),
            linestyle=styles[states.index(state) % len(styles)],
            linewidth=1.4,
            label=f"{title} (n={values.size})",
        )
        drawn += 1
    if not drawn:
        return None
    _log_axis(ax, "x", [r.tpot_ms for r in analysis.series.runs])
    ax.set_xlabel("TPOT per request, ms", fontsize=8)
    ax.set_ylabel("fraction of requests", fontsize=8)
    for q in (0.5, 0.95):
        ax.axhline(q, color="#bbbbbb", linewidth=0.7, linestyle=":")
    ax.legend(fontsize=7.5, frameon=False, loc="lower right")
    _style(ax)
    return _png(figure)


def swap_cost_figure(analysis: CampaignAnalysis, palette: dict[str, str]) -> str | None:
    """Step durations of swap-free vs swap-bearing steps per cell (5–95% whiskers, log y)."""
    rng = np.random.default_rng(0)
    boxes: list[npt.NDArray[np.float64]] = []
    labels: list[str] = []
    colors: list[str] = []
    ratios: list[str] = []
    for cell, state, title in _keys(analysis):
        rings = [
            (r.step_ms, r.step_swaps)
            for r in analysis.series.of(cell, state)
            if r.step_ms is not None and r.step_swaps is not None
        ]
        if not rings:
            continue
        dur = np.concatenate([ms for ms, _ in rings])
        swaps = np.concatenate([n for _, n in rings])
        free, bearing = dur[swaps == 0], dur[swaps > 0]
        if not bearing.size or not free.size:
            continue
        if free.size > MAX_FREE_STEPS:
            free = rng.choice(free, MAX_FREE_STEPS, replace=False)
        boxes.extend([free, bearing])
        labels.extend([f"{title}\nswap-free", f"{title}\nswap-bearing"])
        colors.extend([palette.get(cell, "#555") + "55", palette.get(cell, "#555")])
        row = next(
            (r for r in analysis.seed_tables.swap_cost if (r.cell, r.cache_state) == (cell, state)),
            None,
        )
        if row is not None and row.ratio_to_free_p95 is not None:
            # The swap-cost table's own figure (median over runs), not a pooled recomputation.
            ratios.append(f"{title}: {row.ratio_to_free_p95:.2f}× (median of {row.runs} runs)")
    if not boxes:
        return None
    figure = Figure(figsize=(max(6.0, 1.3 * len(boxes)), 3.2), layout="constrained")
    ax = figure.add_subplot()
    parts = ax.boxplot(boxes, whis=(5, 95), showfliers=False, patch_artist=True, widths=0.6)
    for patch, color in zip(parts["boxes"], colors, strict=True):
        patch.set_facecolor(color)
        patch.set_edgecolor(TEXT)
    for median in parts["medians"]:
        median.set_color(TEXT)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    _log_axis(ax, "y", boxes)
    ax.set_ylabel("step duration, ms", fontsize=8)
    ax.set_title(
        "mean swap-bearing step ÷ p95 swap-free step (steps of all runs pooled below): "
        + "; ".join(ratios),
        fontsize=8,
        color=TEXT,
        loc="left",
    )
    _style(ax)
    return _png(figure)


def predicted_figure(rows: list[dict[str, object]]) -> str | None:
    """Predicted (simulator) vs measured (box) per cell, one panel per metric."""
    metrics = list(dict.fromkeys(str(r["metric"]) for r in rows))
    if not metrics:
        return None
    figure, axes = _panels(len(metrics), height=2.4, ncols=3)
    for ax, metric in zip(axes, metrics, strict=True):
        mine = [r for r in rows if r["metric"] == metric]
        x = np.arange(len(mine))
        predicted = [
            float(str(r["predicted"])) if r["predicted"] is not None else np.nan for r in mine
        ]
        measured = [
            float(str(r["measured"])) if r["measured"] is not None else np.nan for r in mine
        ]
        ax.bar(x - 0.2, predicted, width=0.4, color="#bbbbbb", label="predicted (simulator)")
        ax.bar(x + 0.2, measured, width=0.4, color="#4c72b0", label="measured (box)")
        ax.set_xticks(x, [str(r["cell"]) for r in mine], fontsize=7)
        ax.set_title(metric, fontsize=9, loc="left", color=TEXT)
        _style(ax)
    axes[0].legend(fontsize=7, frameon=False)
    return _png(figure)


def history_figure(rows: list[dict[str, object]], palette: dict[str, str]) -> str | None:
    """Each cell's metric over the campaigns of the store, change points dashed."""
    if not rows:
        return None
    figure, axes = _panels(len(rows), height=2.2)
    for ax, row in zip(axes, rows, strict=True):
        values = list(row["values"])  # type: ignore[call-overload]
        ax.plot(range(len(values)), values, marker="o", lw=1,
                color=palette.get(str(row["cell"]), TEXT))  # fmt: skip
        for point in row["change_points"]:  # type: ignore[attr-defined]
            ax.axvline(point["index"] - 0.5, color="#c0392b", ls="--", lw=1)
        ax.set_title(f"{row['cell']}/{row['cache_state']}: {row['metric']}", fontsize=9)
        ax.set_xlabel("campaign, oldest first", fontsize=8)
        _style(ax)
    return _png(figure)
