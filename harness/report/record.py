"""``record.md``: the dated markdown record of a campaign, beside ``report.html``.

In the shape of ds4's ``docs/benchmarks/YYYY-MM-DD-*.md`` write-ups: the machine and binary, the
cells, the seed-style tables with intervals and labels, the deterministic evidence apart, invalid
cohorts and failed runs with why, then the gates. Every figure is a text the report context already
holds (:func:`harness.report.build_context`, built once for both files), so the record and the
HTML cannot disagree: this module formats, it computes nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from harness.formats.termtext import inert

RECORD_NAME = "record.md"


# Text from a card, a profile, a prompt or a runtime is data: rendered where markdown allows raw
# HTML (mkdocs, IDE previews, code review), `<script>`, `<!--` or a forged `# … PASS` heading
# would run or hide the record. What could open a tag, a comment or an entity becomes an entity
# ("<" before a letter, "/", "!" or "?"; "&" before "name;" — an entity works in every
# renderer, where "\<" is literal in CommonMark but not in Python-Markdown); "<=", "->" and a
# lone "&" stay as written, so the raw file reads as the page does. What markdown reads as code,
# emphasis, a table border, a link or an image (`](`, `![`) is backslash-escaped; a newline is a
# space, so no value starts a line of its own. Our own figures ("1.160", "[0.95, 1.05]") read
# the same in the file as in the page.
_HTML = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?\w+;)")
_ENTITY = {"<": "&lt;", "&": "&amp;"}
_MARKDOWN = re.compile(r"([\\`*~|])|\](?=\()|!(?=\[)")
# What starts a block at the start of a line: a heading, a list, a quote, a rule, "1." or "1)".
_LINE_START = re.compile(r"^(?:([-+=#>])|(\d+)([.)]))")


def _md(text: Any, *, line_start: bool = False) -> str:
    """Card or runtime text made inert for markdown; ``line_start`` when it begins a line."""
    flat = _HTML.sub(lambda m: _ENTITY[m[0]], " ".join(inert(text).split()))
    flat = _MARKDOWN.sub(lambda m: "\\" + m[0] if m[1] or m[0] == "!" else "]\\", flat)
    if line_start:
        flat = _LINE_START.sub(lambda m: f"\\{m[1]}" if m[1] else f"{m[2]}\\{m[3]}", flat)
    return flat


def _code(text: Any) -> str:
    """Text for inside a code span (where markdown and HTML are literal): no backtick, one line."""
    return " ".join(inert(text).replace("`", "'").split()) or "—"


def _cell(text: Any) -> str:
    """A value safe inside a markdown table cell."""
    return _md(text) or "—"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)
    return [*lines, ""]


def _comparisons(rows: list[dict[str, Any]], ci_header: str) -> list[str]:
    return _table(
        ["cell", "vs", "state", "metric", "control, paired blocks", "cell, paired blocks",
         "ratio", ci_header, "label", "cycles", "notes"],
        [
            [r["cell"], r["vs"], r["state"], r["metric"], r["control_text"], r["cell_text"],
             r["ratio_text"], r["ci_text"], r["label"], r["n_cycles"],
             "; ".join([*r["notes"], *r["flag_summary"]])]
            for r in rows
        ],
    )  # fmt: skip


def _recovery(recovery: dict[str, Any]) -> list[str]:
    """The recovery tables, row for row the report's (the same context entries)."""
    out = [f"## {_md(recovery['title'])}", ""]
    if not recovery["directions"]:
        out += [
            "No domain shift in this workload, so no T90: the steady churn and decode speed.",
            "",
        ]
    else:
        out += _shift_rows(recovery)
    out += _table(
        ["cell", "steady churn",
         *[f"C1 {p} (converged, median [95% CI] of runs)" for p in recovery["phases"]],
         "C1 whole run (prompt geomean, run median)"],
        [
            [r["name"], r["churn"]["text"], *[c["text"] for c in r["c1"]], r["c1_all"]["text"]]
            for r in recovery["rows"]
        ],
    )  # fmt: skip
    out += [f"- ⚠{i} {_md(n)}" for i, n in enumerate(recovery["notes"], 1)]
    return [*out, ""] if recovery["notes"] else out


def _shift_rows(recovery: dict[str, Any]) -> list[str]:
    out = _table(
        ["cell", "shift", "T90 median", "T90 range over runs", "vs control [95% CI]",
         "peak cold share", "converged cold share", "T2x", "layers at budget",
         "queue saturated"],
        [
            [r["name"] + (" (control)" if r["control"] else "") + _marks(r["note_ids"]),
             t["direction"], t["text"], t["range"], t["ratio"], t["peak"], t["converged"],
             t["t2x"], t["at_budget"], t["saturated"]]
            for r in recovery["rows"]
            for t in r["t90"]
        ],
    )  # fmt: skip
    return [*out, _md(recovery["definition"], line_start=True), ""]


def _marks(note_ids: Sequence[int]) -> str:
    """The row's footnote markers, as the page shows them (⚠3 ⚠4: notes 3 and 4 below)."""
    return "".join(f" ⚠{i}" for i in note_ids)


def _frozen(table: dict[str, Any], title: str) -> list[str]:
    """One frozen-map table, row for row the report's."""
    out = [f"## {_md(title)}: {_md(table['title'])}", ""]
    out += _table(
        ["", f"{table['control']} (control)", table["cell"], "Δ", "statistics"],
        [
            [r["label"] + (f" (— : {r['why']})" if r["why"] else ""), r["control"]["text"],
             r["cell"]["text"], r["delta"],
             f"ratio {r['stat']['ratio_text']} {r['stat']['ci_text']} {r['stat']['label']}"
             if r["stat"] else "medians over runs; no interval"]
            for r in table["rows"]
        ],
    )  # fmt: skip
    return out


def _date(stamp: str) -> str:
    # The campaign's own date (its directory stamp, 20261201T140910Z), not the rendering's.
    try:
        return time.strftime("%Y-%m-%d", time.strptime(stamp[:8], "%Y%m%d"))
    except ValueError:
        return time.strftime("%Y-%m-%d")


def render_record(context: dict[str, Any]) -> str:
    """The markdown text of ``record.md`` from the report's context, section by section in the
    report's order."""
    out: list[str] = []
    for section in (
        _header, _machines, _cells, _box_load, _policy_and_tiers, _seed_sections, _looks,
        _comparison_sections, _cohorts_and_failures, _gates_and_warnings,
    ):  # fmt: skip
        out += section(context)
    return "\n".join(out).rstrip() + "\n"


def _header(context: dict[str, Any]) -> list[str]:
    verdict = context["verdict"]
    date = _date(str(context["stamp"]))
    return [
        f"# {date} {_md(context['campaign'])}: {verdict['word']}",
        "",
        _md(context["description"] or "", line_start=True),
        "",
        f"Campaign directory `{_code(context['stamp'])}`, runtime "
        f"`{_code(context['runtime_name'])}`, "
        f"harness {context['harness_version']}, last run ended {context['recorded_at']}."
        + (" **Simulated** (replayed traces, not measured)." if context["simulated"] else ""),
        "",
        *([f"**Not decided here:** {_md(verdict['ungated'])}.", ""] if verdict["ungated"] else []),
        *(
            [f"**Confirmation:** {_md(verdict['confirmation'])}.", ""]
            if verdict.get("confirmation")
            else []
        ),
        *([f"**Unverified:** {_md(verdict['unverified'])}.", ""] if verdict["unverified"] else []),
        *(
            [f"**Journal:** {_md(verdict['checked_against'])}.", ""]
            if verdict["checked_against"]
            else []
        ),
    ]


def _machines(context: dict[str, Any]) -> list[str]:
    out = ["## Machine and binary", ""]
    for box in context["boxes"]:
        if box["error"]:
            out += [f"- box {_md(box['name'])}: {_md(box['error'])}", ""]
            continue
        out.append(f"Box `{_code(box['name'])}` ({_md(box['file'])}):")
        out.append("")
        out += [f"- {_md(key)}: {_cell(value)}" for key, value in box["summary"]]
        out.append(f"- runtime profile: {_md(box['runtime_profile'] or '—')}")
        out.append(f"- binary: `{_code(box['runtime_binary'] or '—')}`")
        out.append(f"- binary SHA-256: `{_code(box['runtime_sha256'] or 'not recorded')}`")
        version = box["runtime_version"].splitlines()
        out.append(f"- version: {_cell(version[0]) if version else '—'}")
        out.append("")
    return out


def _cells(context: dict[str, Any]) -> list[str]:
    design = context["design"]
    out = [
        "## Cells",
        "",
        f"Control `{_code(context['control'])}`; order {design['order']}, "
        f"{design['cycles']} cycles "
        f"({', '.join(design['patterns']) or 'no patterns'}), repeats {design['repeats']}, cache "
        f"states {', '.join(design['cache_states'])}; {design['n_runs']} runs planned; "
        f"{design['wash_words']}.",
        "",
    ]
    timing = context["timing"]
    most = timing["max_runs"]
    out += [
        f"Ran at --scale {timing['scale']:g}"
        + (" (every phase's requests and duration_s scaled)" if timing["scale"] != 1 else "")
        + (f"; up to {most} runs if the sequential design runs to its last look"
           if most != timing["planned_runs"] else "")
        + f". Estimate {timing['estimated_run'] or '—'} per run, {timing['estimated_total']} in "
        f"all (assumed: {_md(timing['estimate_basis'])}); real median run "
        f"{timing['median_run']} ({timing['run_range']}), {timing['wall']} first start to last "
        f"end: {timing['real_vs_estimate']}.",
        "",
    ]  # fmt: skip
    for cell in context["cells"]:
        role = " (control)" if cell["control"] else ""
        settings = ", ".join(
            _md(f"{s['key']}={s['value']}")
            + (f" (control: {_md(s['was'])})" if s["was"] is not None else "")
            for s in cell["settings"]
        )
        said = "".join(
            f" — {_md(line['text'])}"
            for key in ("engagement", "outputs")
            if (line := cell.get(key))
        )
        out.append(
            f"- **{_md(cell['name'])}**{role}: {_md(cell['description'] or '')} {settings or ''}"
            f"{said}"
        )
    out.append("")
    return out


def _box_load(context: dict[str, Any]) -> list[str]:
    """Each run's load and reference step as the box read them, and the campaign's line."""
    load = context["box_load"]
    out = ["## Box load and speed", "", f"{_md(load['summary'], line_start=True)}.", ""]
    if not load["rows"]:
        return out
    columns = ("load", "per_core", "cpus", "reference_ms", "ratio", "flags", "note")
    rows = [
        [
            r["run_id"],
            r["cell"],
            *(["not recorded"] + [""] * 6 if r["not_recorded"] else [r[c] for c in columns]),
        ]
        for r in load["rows"]
    ]
    header = [
        "run", "cell", "load 1 min before / after", "load per core before", "CPUs",
        "reference step ms before / after", "÷ median", "flag", "note",
    ]  # fmt: skip
    out += _table(header, rows)
    out += [
        f"Loaded: more than {load['loaded_per_core']} other runnable tasks per core before the "
        f"boot; drifted: a reference step more than {load['drift_pct']}% off the campaign's "
        "median on that box. Either can move timing-derived rows, never counter rows.",
        "",
    ]
    return out


def _policy_and_tiers(context: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if context["policy"]:
        out += [f"## {_md(context['titles']['policy'])}", ""]
        out += _table(
            ["cell", "runs", "decode t/s, median of runs", "hit rate", "expert loads",
             "routed reads", "TPOT p50 / p95", "new swap-out"],
            [
                [r["name"] + (" (control)" if r["control"] else ""), r["runs"],
                 r["decode"]["text"], r["hit_rate"]["text"], r["loads"]["text"],
                 r["bytes"]["text"], r["tpot"]["text"], r["swapout"]["text"]]
                for r in context["policy"]["rows"]
            ],
        )  # fmt: skip
        caveat = context["policy"]["caveat"]
        # The page's two column groups, named: decode speed and TPOT are timing.
        out += ["Timing (decode t/s, TPOT), drift-sensitive; hit rate, expert loads, routed "
                f"reads and new swap-out: {_md(context['policy']['evidence_title'])}. "
                f"{_md(caveat)}".rstrip(), ""]  # fmt: skip
    if context.get("tiers"):
        tiers = context["tiers"]
        out += ["## Per tier (median over completed runs)", ""]
        out += _table(
            ["cell", "tier", "rows", *tiers["metrics"]],
            [[r["name"], r["tier"], r["runs"], *r["values"]] for r in tiers["rows"]],
        )
    return out


def _seed_sections(context: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if context["recovery"]:
        out += _recovery({**context["recovery"], "title": context["titles"]["recovery"]})
    for table in context["frozen"]:
        out += _frozen(table, context["titles"]["frozen"])
    if context.get("swap_cost"):
        swap = context["swap_cost"]
        out += [f"## {_md(context['titles']['swap'])}", ""]
        out += _table(
            ["cell", "runs", "swap-bearing steps", "ms per applied swap [95% CI]",
             "÷ swap-free p95 [95% CI]"],
            [[r["name"] + (" (control)" if r["control"] else ""), r["runs"], r["swap_steps"],
              r["ms"], r["ratio"]] for r in swap["rows"]],
        )  # fmt: skip
        out += [_md(swap["definition"], line_start=True), ""]
        out += [_md(swap["not_measured"], line_start=True), ""]
    out += _predicted(context.get("predicted"))
    out += _oracle(context.get("oracle"), str(context.get("oracle_definition", "")))
    return out


def _predicted(predicted: dict[str, Any] | None) -> list[str]:
    """Predicted against measured, as the page shows it."""
    if not predicted:
        return []
    out = ["## Predicted vs measured", ""]
    out += [
        _md(f"Predictions from the simulated campaign {predicted['dir']}; error = predicted − "
            "measured, ratio = predicted ÷ measured, vs control = the same for the cell ÷ the "
            "control on each side; the interval (95%) is a fitted cost model's, with whether "
            "the measured value lies inside.", line_start=True),
        "",
    ]  # fmt: skip
    if predicted.get("provenance"):
        out += [f"**Provenance:** {_md(predicted['provenance'])}.", ""]
    if predicted.get("mismatches"):
        out += [
            "**The simulation replayed another campaign:** this card differs from what it "
            "simulated, so its errors measure the difference as much as the simulator.",
            "",
        ]
        out += [f"- {_md(m)}" for m in predicted["mismatches"]] + [""]  # fmt: skip
    out += _table(
        ["metric", "unit", "cell", "predicted", "interval", "measured", "error", "ratio",
         "vs control, ratio", "inside"],
        [[_code(r["metric"]), r["unit"], r["cell"], r["predicted_text"], r["interval_text"],
          r["measured_text"], r["error_text"], r["ratio_text"], r["relative_text"],
          r["within_text"]]
         for r in predicted["rows"]],
    )  # fmt: skip
    if predicted.get("fitted_swap"):
        out += [_md(predicted["fitted_swap"], line_start=True), ""]
    if predicted.get("orders"):
        held = "; ".join(f"{_code(o['metric'])} {o['held']} ({o['pairs']})"
                         for o in predicted["orders"])  # fmt: skip
        out += [f"Predicted order of the cells held: {held}.", ""]
    return out


def _oracle(rows: list[dict[str, Any]] | None, definition: str) -> list[str]:
    """A simulated campaign's oracle bounds, beside each cell's replayed loads."""
    if not rows:
        return []
    out = ["## Oracle bounds", ""]
    out += _table(
        ["cell", "slots", "policy's loads", "Belady's MIN", "policy ÷ MIN",
         "best frozen set's cold share", "policy's cold share"],
        [[r["cell"], r["hot_slots"], r["policy_loads"], r["min_loads"], r["over"],
          r["static_share"], r["policy_share"]] for r in rows],
    )  # fmt: skip
    out += [_md(definition, line_start=True), ""]  # the page shows the same words
    return out


def _looks(context: dict[str, Any]) -> list[str]:
    """A sequential design's looks, as the page shows them: where it stopped and at which α."""
    looks = context.get("looks")
    if not looks:
        return []
    out = [
        "## Sequential looks",
        "",
        f"Looks at {', '.join(str(n) for n in looks['scheduled'])} cycles, up to "
        f"{looks['max_cycles']}; each look decides at its nominal level, from Lan–DeMets "
        f"O'Brien–Fleming-type spending of α = {looks['alpha']} over the looks taken. This "
        f"analysis is at look {looks['look']} ({looks['cycles']} cycles, nominal α "
        f"{looks['nominal_text']}); the comparisons below use that level.",
        "",
    ]
    if looks["rows"]:
        out += _table(
            ["look", "cycles", "information", "nominal α", "comparison", "ratio", "CI at that α",
             "label", "decision"],
            [[r["look"], r["cycles"], r["information"], r["nominal"], r["comparison"], r["ratio"],
              r["ci"], r["label"], r["decision"]] for r in looks["rows"]],
        )  # fmt: skip
    return out


def _comparison_sections(context: dict[str, Any]) -> list[str]:
    out = ["## Timing comparisons (ratio cell / control, interval, label)", ""]
    if context.get("tail_method"):
        out += [_md(context["tail_method"], line_start=True), ""]
    header = context["ci_header"]
    timing = context["timing_rows"]
    out += _comparisons(timing, header) if timing else ["None.", ""]
    out += [f"## {context['deterministic_title']}", ""]
    if context["deterministic_rows"]:
        out += _comparisons(context["deterministic_rows"], header)
    logits = context.get("logit_hashes") or []
    if logits:
        out += ["Frontier-logit SHA-256 (over the sorted per-file hashes) per cell:", ""]
        out += _table(
            ["cell", "runs", "SHA-256"], [[r["cell"], r["runs"], r["sha"]] for r in logits]
        )
    exact = [g for g in context["verdict"]["gates"] if g["kind"] == "exact_outputs"]
    for gate in exact:
        mark = "pass" if gate["passed"] else "FAIL"
        out.append(f"- {_md(gate['name'])}: {mark}: {_md(gate['reason'])}")
    if not (context["deterministic_rows"] or logits or exact):
        out.append("None recorded.")
    out.append("")
    return out


def _cohorts_and_failures(context: dict[str, Any]) -> list[str]:
    out = ["## Invalid cohorts", ""]
    cohorts = context.get("invalid_cohorts") or []
    if cohorts:
        out += _table(
            ["cohort", "runs", "why"], [[c["cohort"], c["runs"], c["why"]] for c in cohorts]
        )
    else:
        out += ["None: every cohort held the guards (or the guards were off).", ""]
    failed = [r for r in context["failed_runs"] if r["status"] != "invalid"]
    if failed:
        out += ["## Failed runs", ""]
        out += _table(
            ["run", "cell", "status", "attempt", "reason"],
            [[r["run_id"], r["cell"], r["status"], r["attempt"], r["reason"]] for r in failed],
        )
    return out


def _gates_and_warnings(context: dict[str, Any]) -> list[str]:
    out = ["## Gates", ""]
    out += _table(
        ["gate", "result", "reason"],
        [[g["name"], g["result"], g["reason"]] for g in context["verdict"]["gates"]],
    )
    if context["campaign_warnings"]:
        out += ["## Warnings", ""]
        out += [f"- {_cell(w)}" for w in context["campaign_warnings"]] + [""]
    return out
