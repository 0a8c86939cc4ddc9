"""Make the fixed run records of tests/data/campaigns/: run a shipped card once, keep its records.

    python -m tests.make_fixtures NAME      (NAME: one of FIXTURES, or all)

Each fixture is one real campaign on the reference runtime, at the scale and with the card edits
its end-to-end test used before the tables moved onto fixed records. Kept: card, plan, journal,
inputs, environment capture and each run's records, route traces included (the journal seals
them, and a sealed directory with a file missing does not verify); left out: the box folder and
what the analysis writes (rendered again by the tests).
Rerun it only when the run record format changes, and commit the folder it writes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "campaigns"


@dataclass(frozen=True)
class Fixture:
    """A card, the text edits made to it and the scale it runs at.

    ``source`` is the folder the card lives in (the shipped cards by default); ``state`` holds
    files written into the work folder before the run (a runtime's box state, such as the boot
    before it). In an edit's new text, ``{work}`` is the work folder, ``{data}`` tests/data and
    ``{now}`` the start time (a drift's shared clock)."""

    card: str
    scale: str
    replace: dict[str, str] = field(default_factory=dict)
    source: Path = REPO / "campaigns"
    state: dict[str, str] = field(default_factory=dict)


ANALYSIS = REPO / "tests" / "data" / "cards" / "analysis"
POOLS = {"../../pools/": "{data}/pools/"}
# The A/A card's two identical cells, each env line opened so an edit can add to it.
FIRST = "first:\n    env: {REFBOX_LAYERS"
SECOND = "second:\n    env: {REFBOX_LAYERS"
STATE = 'REFBOX_CARRY_OVER_STATE: "{work}/last-boot", REFBOX_LAYERS'

FIXTURES = {
    # The demo as the quick start's `--scale 0.5` runs it, with the washout before every warm
    # block that became the default design (demo-shaped, older, has none and no seal).
    "demo-washed": Fixture("demo.yaml", "0.5"),
    "seed-map-shaped": Fixture("seed-map-heldout.yaml", "0.2"),
    # Made while the card had `cycles: 2`; it is sequential now (3 to 10 cycles).
    "hotlist-shaped": Fixture(
        "hotlist-priority.yaml",
        "0.2",
        {"cycles: 3\n  max_cycles: 10\n  sequential: true\n  look_every: 1\n": "cycles: 1\n"},
    ),
    # Made while the card had 1 cycle of 3 repeats (edited to 1) and 8-request shift phases; it
    # has 3 cycles of 1 repeat, 10-request shift phases and a per-cycle boot now.
    "ladder-shaped": Fixture("queue-rate-ladder.yaml", "0.3", {"cycles: 3,": "cycles: 1,"}),
    # The statistics' end-to-end cases (tests/analyze/test_analysis_e2e.py says what each holds).
    "analysis-map": Fixture("map.yaml", "1", POOLS, ANALYSIS),
    "analysis-aa": Fixture(
        "aa.yaml",
        "1",
        {**POOLS, "analysis: {window_s": "analysis: {alpha: 0.01, window_s"},
        ANALYSIS,
    ),
    "analysis-drift": Fixture(
        "aa.yaml",
        "1",
        {
            **POOLS,
            "REFBOX_LAYERS": 'REFBOX_DRIFT_PCT_PER_MIN: "3000", REFBOX_DRIFT_ORIGIN: "{now}", '
            "REFBOX_LAYERS",
            'REFBOX_HOT_SLOTS: "4"': 'REFBOX_HOT_SLOTS: "8"',
            "cycles: 3": "cycles: 2",
            "passes: 2": "passes: 1",
            "campaign: analysis-aa": "campaign: drift",
        },
        ANALYSIS,
    ),
    "analysis-carry-over": Fixture(
        "aa.yaml",
        "1",
        {
            **POOLS,
            FIRST: 'first:\n    env: {REFBOX_CARRY_OVER_PCT: "600", REFBOX_CARRY_OVER_TAG: first, '
            + STATE,
            SECOND: "second:\n    env: {REFBOX_CARRY_OVER_TAG: second, " + STATE,
            'REFBOX_HOT_SLOTS: "4"': 'REFBOX_HOT_SLOTS: "8"',
            "cycles: 3": "cycles: 8",
            "campaign: analysis-aa": "campaign: carry-over",
            "analysis: {window_s": "analysis: {alpha: 0.01, window_s",
        },
        ANALYSIS,
        # The box ran the candidate last, so every cycle carries over alike.
        {"last-boot": "second"},
    ),
    "analysis-heat": Fixture(
        "map.yaml",
        "1",
        {
            **POOLS,
            "stale:\n    description: half the experts hot, the default (stale) rowmap, frozen\n"
            "    env: {REFBOX_LAYERS": "stale:\n    description: half the experts hot, frozen\n"
            "    env: {REFBOX_CARRY_OVER_TAG: stale, " + STATE,
            "allhot:\n    description: every expert hot\n    env: {REFBOX_LAYERS": "allhot:\n"
            "    description: every expert hot, and it heats the box\n"
            '    env: {REFBOX_CARRY_OVER_LEAVES_PCT: "300", REFBOX_CARRY_OVER_TAG: allhot, '
            + STATE,
            "max_tokens: 256": "max_tokens: 128",
            "passes: 2": "passes: 1",
            "campaign: analysis-map": "campaign: heat",
        },
        ANALYSIS,
    ),
    # A box whose heat relaxes with traffic (tests/execute/test_box_state_campaign.py): a
    # half-life of two blocks, which no washout the card sends clears, and one of 0.4 requests.
    "heat-outlives": Fixture(
        "heat-state.yaml", "1", {"HEAT_STATE": "{work}/heat.json", "HALF_LIFE": "8"}, ANALYSIS
    ),
    "heat-settles": Fixture(
        "heat-state.yaml", "1", {"HEAT_STATE": "{work}/heat.json", "HALF_LIFE": "0.4"}, ANALYSIS
    ),
}
DROPPED = (
    "report.html",
    "record.md",
    "analysis",
    "box",
    "figures",
    "verdict.json",
    "verdict.junit.xml",
)


def make(name: str) -> Path:
    """Run fixture ``name``'s card and copy its records to tests/data/campaigns/NAME."""
    fixture = FIXTURES[name]
    with tempfile.TemporaryDirectory(prefix=f"fixture-{name}-") as tmp:
        work = Path(tmp)
        cards = work / "cards"
        cards.mkdir()
        for folder in ("prompts", "maps"):
            (cards / folder).symlink_to(REPO / "campaigns" / folder)
        for file, content in fixture.state.items():
            (work / file).write_text(content, encoding="utf-8")
        text = (fixture.source / fixture.card).read_text(encoding="utf-8")
        fills = {
            "{work}": str(work),
            "{data}": str(REPO / "tests" / "data"),
            "{now}": f"{time.time():.3f}",
        }
        for old, new in fixture.replace.items():
            if old not in text:
                raise SystemExit(f"{fixture.card}: {old!r} is no longer in the card")
            for mark, value in fills.items():
                new = new.replace(mark, value)
            text = text.replace(old, new)
        card = cards / fixture.card
        card.write_text(text, encoding="utf-8")
        command = [sys.executable, "-m", "harness", "run", str(card), "--quiet"]
        command += ["--scale", fixture.scale, "--reports", str(work / "reports")]
        done = subprocess.run(command, cwd=REPO, check=False)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{name}: harness run exited {done.returncode}")
        (root,) = (work / "reports").glob("*/*/plan.json")
        target = OUT / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(root.parent, target, ignore=shutil.ignore_patterns(*DROPPED))
    readme = target / "README.md"
    edits = ", ".join(f"`{old}` → `{new}`" for old, new in fixture.replace.items()) or "none"
    readme.write_text(
        f"# {name}: fixed run records\n\n"
        f"One real campaign on the reference runtime: `{fixture.source.relative_to(REPO)}/"
        f"{fixture.card}` at "
        f"`--scale {fixture.scale}`, card edits: {edits}.\n"
        f"Made by `python -m tests.make_fixtures {name}` (its docstring says what is kept).\n",
        encoding="utf-8",
    )
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=[*FIXTURES, "all"])
    args = parser.parse_args()
    for name in FIXTURES if args.name == "all" else [args.name]:
        print(make(name))


if __name__ == "__main__":
    main()
