"""A profile's engagement signatures are checked when it loads: one test each, a known metric."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.card.resolve import load_runtime_profile
from harness.errors import HarnessError
from harness.profiles.schema import EngagementSignature
from tests.conftest import REPO

REFBOX = REPO / "campaigns" / "runtimes" / "refbox.yaml"


def _profile_with(tmp_path: Path, engaged: list[dict[str, object]]) -> Path:
    data = yaml.safe_load(REFBOX.read_text(encoding="utf-8"))
    data["knobs"]["hot_slots"]["engaged"] = engaged
    path = tmp_path / "refbox.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("engaged", "message"),
    [
        ([{"metric": "hit_rat", "above": 0}], "engaged names hit_rat: not a metric"),
        ([{"metric": "hit_rate", "above": 0, "differs": True}], "one of `above: N`"),
        ([{"metric": "hit_rate"}], "one of `above: N`"),
        # A value the knob itself refuses could never be a cell's: the signature would never apply.
        ([{"metric": "hit_rate", "above": 0, "unless": ["none"]}], "when/unless value 'none'"),
    ],
)
def test_a_bad_signature_is_refused_naming_the_knob(
    tmp_path: Path, engaged: list[dict[str, object]], message: str
) -> None:
    with pytest.raises(HarnessError) as caught:
        load_runtime_profile(_profile_with(tmp_path, engaged))
    assert message in str(caught.value) or any(
        message in p for p in getattr(caught.value, "problems", [])
    )


def test_when_and_unless_choose_the_values_a_signature_judges() -> None:
    sig = EngagementSignature(metric="hit_rate", above=0, when=["adaptive"], unless=["0"])
    assert sig.applies("adaptive") and not sig.applies("frozen")
    assert not EngagementSignature(metric="hit_rate", above=0, unless=["0"]).applies("0")
    assert sig.text() == "hit_rate > 0"
    moved = EngagementSignature(metric="hit_rate", differs=True)
    assert moved.text() == "hit_rate outside the control's range"
    shipped = load_runtime_profile(REFBOX)
    assert [s.text() for s in shipped.knobs["hot_slots"].engaged] == [
        "hit_rate > 0",
        "hit_rate outside the control's range",
    ]
