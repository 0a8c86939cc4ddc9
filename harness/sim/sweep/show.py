"""A sweep's ladder as text (printed, and ``sweep.md``) and as a figure (``sweep.png``).

Both only render :attr:`Sweep.ladder`; no figure is computed here.
"""

from __future__ import annotations

import io
import math

import pandas as pd

from harness.sim.sweep.grid import Sweep

__all__ = ["ladder_figure", "ladder_text"]

_HEAD = {
    "cold_share": "cold",
    "t90_s": "T90 s",
    "churn_per_min": "churn/min",
    "swaps": "swaps",
    "hit_rate": "hit rate",
    "decode_tok_s": "tok/s",
}


def _cell(column: str, value: float, delta: float | None) -> str:
    if not math.isfinite(value):
        text = "never" if value > 0 else "-"
    elif "share" in column or column == "hit_rate":
        text = f"{100 * value:.2f}%"
    elif column.startswith("t90"):
        text = f"{value:.2f}"
    elif column == "swaps":
        text = f"{value:,.0f}"
    else:
        text = f"{value:,.1f}"
    if delta is not None and math.isfinite(delta) and delta != 0:
        text += f" ({delta:+.0f}%)"
    return text


def _columns(ladder: pd.DataFrame) -> list[str]:
    shifts = [c for c in ladder.columns if c.startswith("t90_s[") and not c.endswith("Δ%")]
    return ["cold_share", *shifts, "t90_s", "churn_per_min", "swaps", "hit_rate", "decode_tok_s"]


def ladder_text(
    sweep: Sweep, front: list[str] | None = None, chosen: list[str] | None = None
) -> str:
    """Warnings first, then one line per point: its knobs and predicted ladder (Δ% vs control);
    ``*`` marks the Pareto front, ``>`` a picked point."""
    lines = [*sweep.warnings, ""] if sweep.warnings else []
    lines.append(
        f"sweep of {len(sweep.points)} points (base cell {sweep.base}) over "
        f"{len(sweep.traces)} trace(s); T90 the worst over traces, swaps summed, the rest means"
    )
    columns = [c for c in _columns(sweep.ladder) if c in sweep.ladder.columns]
    heads = ["", "point", "knobs"] + [_HEAD.get(c, c.replace("t90_s", "T90 s")) for c in columns]
    table = [heads]
    for row in sweep.ladder.to_dict("records"):
        mark = (
            ">"
            if chosen and row["point"] in chosen
            else ("*" if front and row["point"] in front else "")
        )
        cells = [mark, str(row["point"]), str(row["label"])]
        for column in columns:
            delta = row.get(f"{column} Δ%")
            text = _cell(column, float(row[column]), None if delta is None else float(delta))
            if column == "decode_tok_s" and (row.get("decode_extrapolated") or 0) > 0:
                text += " †"
            cells.append(text)
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(heads))]
    for r in table:
        lines.append("  ".join(text.ljust(w) for text, w in zip(r, widths, strict=True)).rstrip())
    if front is not None:
        lines.append("* Pareto front on the gated metrics; > picked for the card")
    if sweep.pricing:
        lines.append(sweep.pricing)
    return "\n".join(lines) + "\n"


def ladder_figure(
    sweep: Sweep,
    x: str,
    y: str,
    front: list[str] | None = None,
    chosen: list[str] | None = None,
) -> bytes | None:
    """Every point at (x, y), the control, front and picks marked; PNG bytes (None: no data)."""
    from matplotlib.figure import Figure

    ladder = sweep.ladder
    if x not in ladder.columns or y not in ladder.columns:
        return None
    finite = ladder[[x, y]].apply(pd.to_numeric, errors="coerce")
    keep = finite[x].map(math.isfinite) & finite[y].map(math.isfinite)
    if not keep.any():
        return None
    figure = Figure(figsize=(6.4, 4.4), dpi=100)
    axes = figure.add_subplot()
    axes.scatter(finite[x][keep], finite[y][keep], s=18, color="#7f8c8d", label="points")
    if front:
        on_front = ladder["point"].isin(front) & keep
        axes.scatter(finite[x][on_front], finite[y][on_front], s=36, color="#2980b9", label="front")
    if chosen:
        picked = ladder["point"].isin(chosen) & keep
        axes.scatter(finite[x][picked], finite[y][picked], s=120, facecolors="none",
                     edgecolors="#27ae60", linewidths=1.5, label="picked")  # fmt: skip
    control = (ladder["point"] == "control") & keep
    axes.scatter(finite[x][control], finite[y][control], s=70, marker="*", color="#c0392b",
                 label="control")  # fmt: skip
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_title(f"{sweep.card.card.campaign}: {len(sweep.points)} sweep points")
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
