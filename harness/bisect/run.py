"""``harness bisect``'s loop: each step a crossover campaign of one build against the good one.

docs/design.md#bisect. The card gives everything but the builds: box, runtime, workload, the
control cell's settings, the design's washout and order. Each step writes a card of two cells
(``good``: the control's settings on the good build; ``step``: the same on the step's build,
through the profile's ``build.knob``) with one gate, ``better`` on the bisect's metric, and runs
it under ``DIR/steps/NN-<build>/``: a campaign directory like any other, sealed, reported and
resumable. The reproduction is a sequential campaign decided by its labels; a search step
grows one cycle at a time (``harness run --resume --cycles``) until
:func:`harness.stats.build_step.call_step` calls it. ``bisect.json`` is rewritten after every
look, so a killed bisect resumes where it stopped (``harness bisect --resume DIR``).
"""

from __future__ import annotations

import copy
import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from harness.bisect.builds import Build, BuildFailed, build_commit
from harness.bisect.search import Measured, Search, call_from_label
from harness.errors import BadInput
from harness.formats.safe_write import open_in_place, write_text_atomic
from harness.profiles.schema import BuildRecipe
from harness.stats.build_step import StepCall, StepDesign, call_step
from harness.stats.sequential_t import balanced_weights

STATE = "bisect.json"
GOOD, STEP = "good", "step"


@dataclass
class StepRecord:
    """One step as the bisect's report lists it."""

    build: int
    call: str
    effect: float  # log, higher is better
    se: float | None
    cycles: int
    box_s: float
    campaign: str  # the step's campaign directory, relative to the bisect's folder
    label: str = ""  # the campaign's own label of the step's build
    note: str = ""  # why a build was skipped without a campaign (it did not build)


@dataclass
class BisectState:
    """Everything a bisect has decided, as ``bisect.json`` holds it."""

    card: str
    metric: str
    repo: str  # "" when the builds were given as folders
    builds: list[Build]
    design: StepDesign
    steps: list[StepRecord] = field(default_factory=list)
    current: dict[str, Any] | None = None  # the step under way: build, campaign, box_s

    def search(self) -> Search:
        found = Search(len(self.builds))
        for step in self.steps:
            found.record(Measured(step.build, StepCall(step.call), step.effect, step.se))
        return found

    def keep(self, folder: Path) -> None:
        data = asdict(self)
        write_text_atomic(folder / STATE, json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path) -> BisectState:
        path = folder / STATE
        if not path.is_file():
            raise BadInput(f"--resume {folder}: no {STATE} there; not a bisect's folder")
        try:
            data = json.loads(path.read_text())
            return cls(
                card=data["card"],
                metric=data["metric"],
                repo=data["repo"],
                builds=[Build(**b) for b in data["builds"]],
                design=StepDesign(**data["design"]),
                steps=[StepRecord(**s) for s in data["steps"]],
                current=data.get("current"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{path}: unreadable bisect state ({exc})") from exc


def _step_card(raw: dict[str, Any], state: BisectState, knob: str, index: int) -> dict[str, Any]:
    """The card of step ``index``'s campaign: the control's settings on two builds."""
    card: dict[str, Any] = copy.deepcopy(raw)
    control = card["cells"][card["control"]]
    build = state.builds[index]
    reproduction = not state.steps

    def on(folder: str) -> dict[str, Any]:
        cell: dict[str, Any] = copy.deepcopy(control)
        cell["knobs"] = {**(cell.get("knobs") or {}), knob: folder}
        return cell

    card["campaign"] = f"{raw['campaign']}-bisect"
    card["description"] = f"bisect step {len(state.steps) + 1}: {build.name} against the good build"
    card["cells"] = {GOOD: on(state.builds[0].folder), STEP: on(build.folder)}
    card["control"] = GOOD
    card["gates"] = [{"kind": "better", "metric": state.metric}]
    card.pop("confirm", None)
    design = dict(card.get("design") or {})
    design["cache_states"] = list(design.get("cache_states") or ["warm"])[:1]
    if reproduction:
        design.update(cycles=3, max_cycles=state.design.reproduce_max_cycles, sequential=True)
    else:
        design.update(cycles=state.design.first_cycles, sequential=False)
        design.pop("max_cycles", None)
    design.pop("look_every", None)
    card["design"] = design
    return card


def _campaign_root(step_folder: Path) -> Path | None:
    found = sorted(p for p in step_folder.glob("*/*") if p.is_dir() and not p.name.startswith("."))
    return found[-1] if found else None


Reading = tuple[float, float | None, int, str]  # effect (log, higher better), SE, cycles, label


def _reading(root: Path, metric: str) -> Reading:
    """The step build's effect (log, higher is better), its SE, cycles and label."""
    from harness.analyze.campaign import analyze_campaign

    analysis = analyze_campaign(root, predictions=False)
    for item in analysis.comparisons:
        c = item.comparison
        if item.cell == STEP and c.metric == metric:
            sign = 1.0 if c.higher_is_better else -1.0
            se = None
            if c.sd_log_effect is not None and c.n_cycles >= 2:
                weights = balanced_weights(c.n_cycles)
                se = c.sd_log_effect * math.sqrt(float(weights @ weights))
            return sign * c.mean_log_effect, se, c.n_cycles, str(c.label)
    raise BadInput(f"{root}: no comparison of {metric} for the step's build (metric named?)")


@dataclass
class Runner:
    """Runs a bisect's steps into ``folder``; progress lines to ``out``."""

    folder: Path
    state: BisectState
    raw: dict[str, Any]
    recipe: BuildRecipe
    out: TextIO
    interrupted: str = ""
    exit_code: int = 0

    def _campaign(self, card: Path | None, resume: Path | None, cycles: int | None) -> Path:
        from harness.spine import run_campaign

        current = self.state.current
        assert current is not None
        started = time.monotonic()
        log = self.folder / "steps" / f"{current['step']}.log"
        with io.TextIOWrapper(open_in_place(log, "a+b"), encoding="utf-8") as lines:
            result = run_campaign(
                card,
                resume=resume,
                cycles=cycles,
                reports=self.folder / "steps" / current["step"],
                out=lines,
                card_folder=Path(self.state.card).parent,
            )
        current["box_s"] = float(current.get("box_s", 0.0)) + time.monotonic() - started
        current["campaign"] = str(result.directory.relative_to(self.folder))
        self.state.keep(self.folder)
        if result.outcome.interrupted:
            self.interrupted = str(result.outcome.interrupted_by)
            self.exit_code = result.exit_code
        elif result.outcome.failed:
            current["failed"] = len(result.outcome.failed)
        return result.directory

    def _built(self, index: int) -> Build:
        build = self.state.builds[index]
        if build.folder or not self.state.repo:
            return build
        built = build_commit(Path(self.state.repo), build, self.recipe)
        self.state.builds[index] = built
        self.state.keep(self.folder)
        return built

    def step(self, index: int) -> StepRecord | None:
        """Measure build ``index``; None when interrupted (the state says where)."""
        number = len(self.state.steps) + 1
        current = self.state.current
        if current is None or current.get("build") != index:
            current = {"build": index, "step": f"{number:02d}-{self.state.builds[index].name}"}
            self.state.current = current
        try:
            self._built(0)
            build = self._built(index)
        except BuildFailed as exc:
            return StepRecord(index, StepCall.UNDECIDED, 0.0, None, 0, 0.0, "", note=str(exc))
        self.out.write(f"step {number}: {build.name} against {self.state.builds[0].name}\n")
        self.out.flush()
        step_folder = self.folder / "steps" / current["step"]
        root = _campaign_root(step_folder) if step_folder.is_dir() else None
        if root is None:
            card = self.folder / "steps" / f"{current['step']}.yaml"
            card.parent.mkdir(parents=True, exist_ok=True)
            knob = self.recipe.knob
            write_text_atomic(card, yaml.safe_dump(_step_card(self.raw, self.state, knob, index)))
            root = self._campaign(card, None, None)
        else:
            root = self._campaign(None, root, None)
        return self._decide(index, root)

    def _decide(self, index: int, root: Path) -> StepRecord | None:
        current = self.state.current
        assert current is not None
        while not self.interrupted:
            if current.get("failed"):
                return self._record(index, root, StepCall.UNDECIDED, note="runs failed")
            reading = _reading(root, self.state.metric)
            effect, se, cycles, label = reading
            if not self.state.steps:  # the reproduction: the campaign's own label
                return self._record(index, root, call_from_label(label), reading)
            delta = self.state.search().regression()
            call_now = call_step(effect, se, delta, self.state.design)
            if call_now is not None or cycles >= self.state.design.max_cycles:
                return self._record(index, root, call_now or StepCall.UNDECIDED, reading)
            self.out.write(f"  {cycles} cycles: undecided, one more\n")
            self.out.flush()
            root = self._campaign(None, root, cycles + 1)
        return None

    def _record(
        self,
        index: int,
        root: Path,
        call: StepCall,
        reading: Reading = (0.0, None, 0, ""),
        note: str = "",
    ) -> StepRecord:
        """The step's record from the reading its call was made on (none for failed runs)."""
        current = self.state.current
        assert current is not None
        effect, se, cycles, label = reading
        return StepRecord(
            index,
            str(call),
            effect,
            se,
            cycles,
            float(current.get("box_s", 0.0)),
            str(root.relative_to(self.folder)),
            label,
            note,
        )

    def run(self) -> None:
        """Steps until the search ends or a signal stops it."""
        while (index := self.state.search().next_build()) is not None:
            record = self.step(index)
            if record is None:
                return
            self.state.steps.append(record)
            self.state.current = None
            self.state.keep(self.folder)
            effect = f"{100 * math.expm1(record.effect):+.2f}%" if not record.note else ""
            self.out.write(f"  {record.call} {effect} {record.note}".rstrip() + "\n")
            self.out.flush()


__all__ = ["BisectState", "Runner", "StepRecord"]
