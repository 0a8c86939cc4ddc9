"""Did each boot compute what the control computes? Its canaries, checked against the control's.

docs/design.md#canaries. Every warm boot answers the card's fixed greedy canary prompts before its
block (:mod:`harness.drive.canaries`). A change that moves experts and not the math keeps those
outputs, and its scored outputs too where the workload is greedy and sent one request at a time
(48 canary tokens alone missed an intermittent fault in 2 of 20 campaigns: ``harness bench
faults``); a boot whose outputs differ from the control's ran on wrong weights, and is *corrupt*:
its runs are kept out of every comparison, each comparison of its cell is labelled *corrupt*,
and the campaign's gates fail, naming the first differing token. Where the workload asks for
``logprobs``, each token's log-probability must also be the control's, within
``canaries.logprob_tolerance`` nats: weights that moved a little keep every argmax, and only
these show it.

Not compared: a cell the card declares ``lossy`` (judged by :mod:`.equivalence` where it gives a
margin), and a cell that changes a knob the profile marks ``lossless: false`` (another seed is
another model). A prompt on which the control's own boots disagree is no reference and is left
out (said beside each cell in the report and record); a cold run sends no canaries, so its boot
is not checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analyze.compare import CellComparison
from harness.analyze.engagement import changed_knobs, frozen_profile, run_knobs
from harness.analyze.equivalence import parsed_logprobs
from harness.card import Card
from harness.errors import HarnessError
from harness.formats.records import CANARY_FILE, read_json
from harness.stats.labels import Label


@dataclass(frozen=True)
class CorruptBoot:
    """One boot whose canary output differs from the control's."""

    cell: str
    run_id: str
    prompt_id: str
    token: int  # the first differing stream chunk (token) of this boot's output, or character
    got: str
    expected: str
    # "character" for a scored output, whose chunks are not kept; "log-probability" where the
    # text agrees and token ``token``'s log-probability does not
    unit: str = "token"

    def words(self) -> str:
        if self.unit == "log-probability":
            return (
                f"{self.run_id}: {self.prompt_id} token {self.token}'s log-probability "
                f"{self.got} where the control's boots gave {self.expected}"
            )
        return (
            f"{self.run_id}: {self.prompt_id} {self.unit} {self.token} gave {self.got!r} where "
            f"the control's boots gave {self.expected!r}"
        )


@dataclass(frozen=True)
class CanaryCheck:
    """Every boot's canaries against the control's, and what was not compared and why."""

    checked: dict[str, int] = field(default_factory=dict)  # cell -> boots compared
    corrupt: tuple[CorruptBoot, ...] = ()
    not_compared: dict[str, str] = field(default_factory=dict)  # cell -> why
    unstable: tuple[str, ...] = ()  # prompts the control's boots disagree on

    def corrupt_runs(self) -> set[str]:
        return {c.run_id for c in self.corrupt}

    def corrupt_text(self, cell: str) -> str | None:
        """ "corrupt: canary outputs differ from the control's on 2 of 4 boots (…)"; None when
        the cell is clean. It says "log-probabilities" where only they differ, and "greedy"
        where a scored output (not only a canary) does."""
        boots = [c for c in self.corrupt if c.cell == cell]
        if not boots:
            return None
        shown = "; ".join(c.words() for c in boots[:2]) + ("; …" if len(boots) > 2 else "")
        checked = self.checked.get(cell, len(boots))
        every = ", so its figures are those corrupt boots'" if len(boots) >= checked else ""
        what = "log-probabilities" if all(c.unit == "log-probability" for c in boots) else "outputs"
        where = "canary" if all(c.prompt_id.startswith("canary-") for c in boots) else "greedy"
        return (
            f"corrupt: {where} {what} differ from the control's on {len(boots)} of "
            f"{checked} boots{every} ({shown}); a change meant to alter outputs is declared "
            "`lossy` on its cell"
        )

    def clean_text(self, cell: str) -> str | None:
        """What the report says of a cell that is not corrupt: checked, or not and why."""
        if cell in self.not_compared:
            return f"canaries not compared: {self.not_compared[cell]}"
        if self.corrupt_text(cell) is None and self.checked.get(cell):
            shown = ", ".join(self.unstable[:3]) + (", …" if len(self.unstable) > 3 else "")
            left = f" (left out, the control's own boots differ: {shown})" if shown else ""
            return f"canaries equal the control's on {self.checked[cell]} boots{left}"
        return None

    def apply(self, comparisons: list[CellComparison]) -> list[CellComparison]:
        """The comparisons with every corrupt cell's relabelled."""
        out = []
        for item in comparisons:
            why = self.corrupt_text(item.cell)
            if why is not None:
                changed = dataclasses.replace(item.comparison, label=Label.CORRUPT, corrupt=why)
                item = dataclasses.replace(item, comparison=changed)
            out.append(item)
        return out

    def record(self) -> dict[str, Any]:
        """For ``analysis.json``."""
        return {
            "checked": self.checked,
            "corrupt": [dataclasses.asdict(c) for c in self.corrupt],
            "not_compared": self.not_compared,
            "unstable": list(self.unstable),
        }


def _canaries(root: Path, run_id: str) -> dict[str, dict[str, Any]] | None:
    """A run's canaries by prompt id (None: it sent none, or its file cannot be read)."""
    path = root / "runs" / run_id / CANARY_FILE
    if not path.is_file():
        return None
    try:
        entries = read_json(path).get("canaries")
    except (HarnessError, AttributeError):
        return None
    if not isinstance(entries, list):
        return None
    return {str(e["prompt_id"]): e for e in entries if isinstance(e, dict) and e.get("ok")}


def _scored(card: Card, outputs: pd.DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Each run's scored greedy outputs by prompt id, where they are comparable: a greedy
    workload sent one request at a time (batching can move a float, and a token with it). A
    prompt a run answered differently twice is left out of its answers."""
    workload = card.workload
    if outputs.empty or workload.temperature > 0 or workload.concurrency > 1:
        return {}
    rows = outputs[outputs["ok"] & ~outputs["phase"].isin(["quality", "logits"])]
    if "logprobs" not in rows.columns:
        rows = rows.assign(logprobs=None)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (run_id, prompt), group in rows.groupby(["run_id", "prompt_id"]):
        texts = group["output_text"]
        if texts.nunique() == 1:
            out.setdefault(str(run_id), {})[str(prompt)] = {
                "text": str(texts.iloc[0]),
                "logprobs": _chosen(group["logprobs"].iloc[0]),
            }
    return out


def _chosen(logprobs: object) -> list[float | None]:
    """Each token's own log-probability from a request's ``logprobs`` record (none: [])."""
    return [_number(e.get("logprob")) for e in parsed_logprobs(logprobs)]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _logprobs(answer: dict[str, Any]) -> list[float | None]:
    values = answer.get("logprobs")
    return [_number(v) for v in values] if isinstance(values, list) else []


def _moved(
    mine: list[float | None], reference: list[float | None], tolerance: float
) -> tuple[int, float, float] | None:
    """The first token whose log-probability moved more than ``tolerance``: (index, mine,
    reference); None when none did (or either side has none)."""
    for index, (got, expected) in enumerate(zip(mine, reference, strict=False)):
        if got is not None and expected is not None and abs(got - expected) > tolerance:
            return index, got, expected
    return None


def _first_difference(got: dict[str, Any], expected: str) -> tuple[int, str, str]:
    """The stream chunk where ``got`` first departs from ``expected``: (index, got, expected)."""
    text = str(got.get("text", ""))
    at = next((i for i, (a, b) in enumerate(zip(text, expected, strict=False)) if a != b), None)
    if at is None:
        at = min(len(text), len(expected))
    if not got.get("pieces"):  # a scored output: its chunks are not kept, name the character
        return at, text[at : at + 8], expected[at : at + 8]
    pieces = [str(p) for p in got["pieces"]]
    start = 0
    for index, piece in enumerate(pieces):
        if start + len(piece) > at or index == len(pieces) - 1:
            return index, piece, expected[start : start + max(len(piece), 1)]
        start += len(piece)
    return 0, "", expected[:1]


def _why_not_compared(card: Card, cell: str, changed: list[str], lossless: dict[str, bool]) -> str:
    lossy = card.cells[cell].lossy
    if lossy is not False:
        return "the cell is declared lossy" + (
            " (judged by its equivalence margin)" if not isinstance(lossy, bool) else ""
        )
    models = [k for k in changed if not lossless.get(k, True)]
    if models:
        return f"{', '.join(models)} picks another model (lossless: false in the profile)"
    return ""


def check_canaries(
    root: Path, card: Card, runs: pd.DataFrame, outputs: pd.DataFrame
) -> CanaryCheck | None:
    """Each treatment cell's boots' canaries, and its scored greedy outputs where a greedy
    workload sent them one at a time, against the control's (None: no control, no profile, or
    no control boot that sent canaries)."""
    profile = frozen_profile(root)
    if profile is None or card.control is None or runs.empty:
        return None
    done = runs[runs["status"].eq("ok")]
    ids = {cell: [str(r) for r in done.loc[done["cell"].eq(cell), "run_id"]] for cell in card.cells}
    scored = _scored(card, outputs)

    def answers(run_id: str) -> dict[str, dict[str, Any]] | None:
        canaries = _canaries(root, run_id)
        return None if canaries is None else {**scored.get(run_id, {}), **canaries}

    control = {r: c for r in ids.get(card.control, []) if (c := answers(r))}
    if not control:
        return None
    tolerance = card.canaries.logprob_tolerance
    reference: dict[str, str] = {}
    reference_logprobs: dict[str, list[float | None]] = {}
    unstable: list[str] = []
    for prompt in sorted({p for c in control.values() for p in c}):
        texts = {str(c[prompt].get("text", "")) for c in control.values() if prompt in c}
        if len(texts) != 1:
            unstable.append(prompt)
            continue
        reference[prompt] = texts.pop()
        lists = [v for c in control.values() if prompt in c and (v := _logprobs(c[prompt]))]
        if lists and all(_moved(v, lists[0], tolerance) is None for v in lists[1:]):
            reference_logprobs[prompt] = lists[0]
        elif lists:  # the control's own boots move more than the tolerance: no yardstick
            unstable.append(f"{prompt} (log-probabilities)")
    control_knobs = run_knobs(root, next(iter(control)))
    lossless = {name: spec.lossless for name, spec in profile.knobs.items()}
    checked: dict[str, int] = {}
    corrupt: list[CorruptBoot] = []
    not_compared: dict[str, str] = {}
    for cell in card.treatments:
        if not ids.get(cell):
            continue
        changed = changed_knobs(run_knobs(root, ids[cell][0]), control_knobs)
        why = _why_not_compared(card, cell, changed, lossless)
        if why:
            not_compared[cell] = why
            continue
        for run_id in ids[cell]:
            mine = answers(run_id)
            shared = [p for p in reference if mine and p in mine]
            if not mine or not shared:
                continue
            checked[cell] = checked.get(cell, 0) + 1
            for prompt in shared:
                if str(mine[prompt].get("text", "")) != reference[prompt]:
                    token, got, expected = _first_difference(mine[prompt], reference[prompt])
                    unit = "token" if mine[prompt].get("pieces") else "character"
                    corrupt.append(CorruptBoot(cell, run_id, prompt, token, got, expected, unit))
                    break
                moved = _moved(
                    _logprobs(mine[prompt]), reference_logprobs.get(prompt, []), tolerance
                )
                if moved is not None:
                    index, got_lp, expected_lp = moved
                    corrupt.append(
                        CorruptBoot(
                            cell, run_id, prompt, index, f"{got_lp:.4f}", f"{expected_lp:.4f}",
                            "log-probability",
                        )
                    )  # fmt: skip
                    break
    return CanaryCheck(checked, tuple(corrupt), not_compared, tuple(unstable))


__all__ = ["CanaryCheck", "CorruptBoot", "check_canaries"]
