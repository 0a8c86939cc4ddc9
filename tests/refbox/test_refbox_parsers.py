"""The reference runtime's own parser and validation judge what `harness validate` refuses of the
``refbox`` and ``refbox-sglang`` profiles.

Every value a card can give each knob (each choice, a switch on and off, a pattern's
representatives and its ends inside and outside it) and the knobs the runtime relates (the heat
and carry-over faults with the files that hold them) are cells of one card per profile.
`harness validate` judges the card; each cell's command line and environment are built by
harness's own ``boot_spec`` and judged by ``harness.refbox.options.parse_serve_args``, what
``harness refbox serve`` runs before it binds its port (its flags, their ``REFBOX_*``
variables, ranges, paths and the policy's own validation). Nothing is stood in: the folders the
boot names are made for it. A probe the runtime must refuse shows the judge can refuse.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from pathlib import Path
from typing import Any

import pytest

from harness.card import Cell, load_runtime_profile
from harness.profiles.schema import KnobSpec, RuntimeProfile
from harness.refbox.options import parse_serve_args
from harness.runtimes.boot import boot_spec
from tests.conftest import REPO
from tests.engines.validate_cells import validate_refusals

PROFILES = ("refbox", "refbox-sglang")
# Representatives and ends of what a pattern-valued knob could be given, inside and outside it.
# ({tmp}: the test's own folder, where a state file the runtime writes at startup lands.)
PATTERN_VALUES = ["0", "1", "7", "0.5", "1.0", "1.5", "64", "65", "100", "4294967296", "-1",
                  "-0.5", "", "abc", "1e3", "inf", "nan", " 7", "+7", "tag-1", "a/b",
                  "relative/state", "{tmp}/state-{knob}"]  # fmt: skip
# The knobs the runtime relates: a fault's size and the file that carries it between boots.
PAIRS = [
    {"heat_source": [None, "0", "0.5"], "heat_slowdown_pct": [None, "0", "20"],
     "heat_state": [None, "{tmp}/heat"]},
    {"carry_over_pct": [None, "0", "10"], "carry_over_leaves_pct": [None, "0", "5"],
     "carry_over_state": [None, "{tmp}/carry"], "carry_over_tag": [None, "a"]},
    {"hot_slots": ["0", "8", "9"], "cache_records": [None, "4"]},
]  # fmt: skip
# Narrower on purpose: other spellings of a number the runtime's argparse reads (int() and
# float() take spaces, a sign, an exponent; float() takes inf), refused by validate because the
# harness records and compares a knob's text across arms, and inf where only finite numbers
# mean anything. Each is asserted taken by the runtime.
SPELLINGS = {" 7", "+7", "1e3", "inf"}
# source_tree is PYTHONPATH, read by the interpreter, which takes any text; validate asks for an
# absolute path (a relative one would resolve against the runtime's working folder). Narrower on
# purpose too; the runtime boots with every one of them.
INTERPRETER_READ = "source_tree"


def _values(spec: KnobSpec) -> list[Any]:
    if spec.switch:
        return [True, False]
    return [*(spec.choices or []), *([] if spec.pattern is None else PATTERN_VALUES)]


def _cells(profile: RuntimeProfile, tmp: Path) -> dict[str, dict[str, Any]]:
    settings: list[dict[str, Any]] = [{}]
    settings += [{name: value} for name, spec in profile.knobs.items() for value in _values(spec)]
    for grid in PAIRS:
        if set(grid) <= set(profile.knobs):
            for values in itertools.product(*grid.values()):
                settings.append({k: v for k, v in zip(grid, values, strict=True) if v is not None})
    return {
        f"c{index}": {"knobs": {k: _placed(v, k, tmp) for k, v in knobs.items()}}
        for index, knobs in enumerate(settings)
    }


def _placed(value: Any, knob: str, tmp: Path) -> Any:
    return value.format(tmp=tmp, knob=knob) if isinstance(value, str) else value


def _verdict(profile: RuntimeProfile, cell: dict[str, Any], folder: Path) -> str | None:
    """The runtime's refusal of the cell's boot (None: it would bind its port)."""
    spec = boot_spec(profile, Cell.model_validate(cell), port=8000, run_dir=str(folder),
                     python="python3", bind_host="127.0.0.1", cache_dir=str(folder),
                     uploaded={})  # fmt: skip
    module = spec.argv.index("harness.refbox")  # after -m (and refbox's -P)
    assert spec.argv[module - 1 : module + 2] == ["-m", "harness.refbox", "serve"], spec.argv
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        parsed = parse_serve_args(spec.argv[module + 2 :], spec.env)
    return errors.getvalue().strip() or "refused" if parsed == 2 else None


def _card(name: str, cells: dict[str, dict[str, Any]], folder: Path) -> dict[str, Any]:
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    return {
        "campaign": "refbox-parsers",
        "runtime": name,
        "prompts": {"pools": ["prompts/mixed.jsonl"]},
        "workload": {"phases": [{"name": "a", "domains": ["python"], "requests": 1}]},
        "cells": cells,
        "control": "c0",
        "design": {"order": "abba", "cycles": 1, "cache_states": ["warm"]},
    }


@pytest.mark.parametrize("name", PROFILES)
def test_validate_refuses_exactly_what_the_reference_runtime_refuses(
    name: str, tmp_path: Path
) -> None:
    profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / f"{name}.yaml")
    cells = _cells(profile, tmp_path)
    verdicts = {cell: _verdict(profile, spec, tmp_path) for cell, spec in cells.items()}
    probe = dict(cells["c0"], env={"REFBOX_SEED": "seven"})
    assert _verdict(profile, probe, tmp_path) is not None  # the judge can refuse
    runtime_refuses = {cell for cell, why in verdicts.items() if why is not None}
    assert 0 < len(runtime_refuses) < len(cells)
    refused = validate_refusals(_card(name, cells, tmp_path), tmp_path)
    taken = set(cells) - runtime_refuses
    narrowed = {c for c in taken & set(refused)
                if any(v in SPELLINGS for v in cells[c]["knobs"].values())}  # fmt: skip
    assert narrowed
    tree = {c: str(cells[c]["knobs"].get(INTERPRETER_READ, "/")) for c in taken & set(refused)}
    relative = {c for c, path in tree.items() if not path.startswith("/")}
    assert bool(relative) == (INTERPRETER_READ in profile.knobs)
    narrowed |= relative
    refused = {cell: lines for cell, lines in refused.items() if cell not in narrowed}
    only_validate, only_refbox = set(refused) - runtime_refuses, runtime_refuses - set(refused)
    assert not only_validate and not only_refbox, {
        "validate only": {c: (cells[c]["knobs"], refused[c]) for c in only_validate},
        "refbox only": {c: (cells[c]["knobs"], verdicts[c]) for c in only_refbox},
    }
