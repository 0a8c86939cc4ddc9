"""The SGLang EPLB card: it validates on the sglang-eplb profile (EPLB without the harness driving
SGLang's expert-distribution recorder), and what such a campaign cannot measure (route counts,
hit rates, measured or replayed) is refused at `validate`, naming why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.card import load_card
from harness.errors import CardError
from tests.conftest import REPO

CARD = REPO / "campaigns" / "sglang-eplb.yaml"


def _variant(tmp_path: Path, change: dict[str, object]) -> Path:
    """The shipped card with ``change`` applied to its top level, written beside its pool."""
    data = yaml.safe_load(CARD.read_text(encoding="utf-8"))
    data["prompts"]["pools"] = [str(REPO / "campaigns" / "prompts" / "mixed.jsonl")]
    data.update(change)
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _problems(path: Path) -> str:
    with pytest.raises(CardError) as caught:
        load_card(path)
    return "\n".join(caught.value.lines())


def test_the_shipped_sglang_eplb_card_validates_without_the_recorder() -> None:
    loaded = load_card(CARD)
    runtime = loaded.runtime
    assert runtime.name == "sglang-eplb"
    assert runtime.telemetry.expert_recorder is None  # EPLB's recorder is left to EPLB
    assert loaded.card.cells["eplb"].knobs["enable_eplb"] is True
    # What it cannot measure, each with why.
    assert {"hit_rate", "replayed_hit_rate", "route_selections"} <= set(
        runtime.telemetry.unavailable
    )


def test_a_hit_rate_gate_on_the_eplb_card_is_refused_naming_why(tmp_path: Path) -> None:
    gates = [
        {"kind": "better", "metric": "hit_rate"},
        {"kind": "better", "metric": "replayed_hit_rate"},
        {"kind": "counter", "counter": "route_selections", "min": 1},
        {"kind": "survives", "cache_states": ["warm"], "metrics": ["hit_rate"]},
        {"kind": "regression", "metric": "hit_rate"},
        {"kind": "better", "metric": "decode_tok_s"},  # what it does measure
    ]
    report = _problems(_variant(tmp_path, {"gates": gates}))
    fields = ("0.metric", "1.metric", "2.counter", "3.metrics", "4.metric")
    for field, name in zip(fields, ("hit_rate", "replayed_hit_rate", "route_selections",
                                    "hit_rate", "hit_rate"), strict=True):  # fmt: skip
        assert f"gates.{field}: {name} cannot exist in runtime 'sglang-eplb'" in report, report
    assert "EPLB owns the expert-distribution recorder" in report
    assert "this profile measures speed, TPOT and outputs" in report
    assert "gates.5" not in report


def test_eplb_without_expert_parallelism_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(CARD.read_text(encoding="utf-8"))
    cells = data["cells"]
    del cells["eplb"]["knobs"]["ep_size"]
    report = _problems(_variant(tmp_path, {"cells": cells}))
    assert "cells.eplb.knobs.enable_eplb: SGLang refuses EPLB without expert parallelism" in report


def test_the_same_eplb_cell_on_the_recorder_profile_is_still_refused(tmp_path: Path) -> None:
    report = _problems(_variant(tmp_path, {"runtime": "sglang"}))
    assert "cells.eplb.knobs.enable_eplb: runtime 'sglang' records routing" in report
