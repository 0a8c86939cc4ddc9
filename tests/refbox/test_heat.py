"""Box heat in-process: the update arithmetic, the state file, and an engine's requests moving it
(the runtime as a real process is in test_refbox.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.card import Cell, load_runtime_profile
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.heat import BoxHeat, HeatSettings, read_heat, relax_heat, write_heat
from harness.refbox.model import ModelConfig
from harness.refbox.options import parse_serve_args
from harness.runtimes.boot import boot_spec
from tests.conftest import REPO

SMALL = ModelConfig(layers=3, experts=16, top_k=2, d_model=16, d_ff=16, seed=7)
UNIT = st.floats(min_value=0.0, max_value=1.0)


def test_one_request_moves_the_heat_by_the_half_life_factor() -> None:
    """S <- X + (S - X) * 2^(-1/H): one request, H requests (half the distance), many."""
    assert relax_heat(0.0, 1.0, 1.0) == 0.5
    assert relax_heat(1.0, 0.0, 1.0) == 0.5
    assert relax_heat(0.2, 0.6, 4.0) == pytest.approx(0.6 - 0.4 * 2 ** (-1 / 4), rel=1e-15)
    for source, start, half_life in ((1.0, 0.0, 2.0), (0.0, 0.875, 3.0), (0.3, 0.9, 7.5)):
        heat = start
        for n in range(1, 41):
            heat = relax_heat(heat, source, half_life)
            closed = source + (start - source) * 2.0 ** (-n / half_life)
            assert heat == pytest.approx(closed, rel=1e-12, abs=1e-15), (source, start, n)
            if n == 2 * half_life:  # two half-lives: a quarter of the distance is left
                assert heat - source == pytest.approx((start - source) / 4, rel=1e-12)
    assert relax_heat(0.4, 0.4, 5.0) == 0.4  # at its source it stays


@settings(max_examples=300, deadline=None)
@given(
    heat=UNIT,
    source=UNIT,
    half_life=st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False),
)
def test_the_heat_stays_in_0_1_and_moves_towards_its_source_without_passing_it(
    heat: float, source: float, half_life: float
) -> None:
    relaxed = relax_heat(heat, source, half_life)
    assert 0.0 <= relaxed <= 1.0
    assert min(heat, source) <= relaxed <= max(heat, source)
    assert abs(relaxed - source) <= abs(heat - source)


def test_the_state_file_round_trips_exactly_and_a_missing_one_is_a_cool_box(
    tmp_path: Path,
) -> None:
    path = tmp_path / "heat.json"
    assert read_heat(str(path)) == (0.0, 0)
    heat = relax_heat(relax_heat(0.0, 1.0, 3.0), 1.0, 3.0)
    write_heat(str(path), heat, 2)
    assert read_heat(str(path)) == (heat, 2)  # every bit: a float's JSON text is its repr
    assert json.loads(path.read_text()) == {"version": 1, "heat": heat, "requests": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["heat.json"]  # no scratch file left
    for text, match in (
        ("0.5", "version 1"),
        ("{not json", "not JSON"),
        ('{"version": 1, "heat": 1.5, "requests": 0}', "heat must be a number in 0..1"),
        ('{"version": 1, "heat": 0.5, "requests": -1}', "requests must be"),
        ('{"version": 2, "heat": 0.5, "requests": 0}', "version 1"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            read_heat(str(path))


def test_each_completed_request_moves_and_writes_the_heat_and_a_reset_keeps_it(
    tmp_path: Path,
) -> None:
    """An engine's heat: one update per completed request, the decode slowdown P% x S, and the
    box's state outliving a reset of the engine's boot state."""
    path = tmp_path / "heat.json"
    write_heat(str(path), 0.5, 10)
    settings = HeatSettings(
        path=str(path), source=1.0, slowdown_pct=40.0, half_life_requests=2.0, heat=0.5, requests=10
    )
    options = EngineOptions(hot_slots=12, expert_bytes=0, cold_dir=str(tmp_path), heat=settings)
    engine = Engine(SMALL, options)
    assert engine.heat is not None
    assert engine.heat.step_slowdown_pct() == 20.0
    expected = 0.5
    for _ in range(2):
        assert len(list(engine.generate(b"x = 1\n", 4))) == 4
        expected = relax_heat(expected, 1.0, 2.0)
        assert read_heat(str(path)) == (expected, engine.heat.requests)
    assert engine.heat.requests == 12 and expected == pytest.approx(0.75)
    engine.reset()
    assert engine.heat.heat == expected  # the box stays as warm as it was
    half = engine.generate(b"x = 1\n", 4)
    next(half)
    half.close()  # a request cut off before its last token does not count
    assert read_heat(str(path)) == (expected, 12)
    assert engine.heat.step_slowdown_pct() == pytest.approx(40.0 * expected)
    engine.close()


def test_heat_flags_build_the_settings_from_the_file_and_write_it_at_boot(tmp_path: Path) -> None:
    path = tmp_path / "heat.json"
    config = parse_serve_args(
        ["--heat-source", "1", "--heat-slowdown-pct", "25"],
        {"REFBOX_HEAT_STATE": str(path), "REFBOX_HEAT_HALF_LIFE_REQUESTS": "8"},
    )
    assert not isinstance(config, int)
    assert config.options.heat == HeatSettings(
        path=str(path), source=1.0, slowdown_pct=25.0, half_life_requests=8.0
    )
    assert read_heat(str(path)) == (0.0, 0)  # written at boot: an unwritable path fails there
    write_heat(str(path), 0.25, 3)
    config = parse_serve_args(["--heat-state", str(path)], {})
    assert not isinstance(config, int)
    heat = config.options.heat
    assert heat is not None and (heat.heat, heat.requests, heat.source) == (0.25, 3, 0.0)
    config = parse_serve_args([], {})
    assert not isinstance(config, int) and config.options.heat is None


def test_a_heat_state_file_not_of_ours_fails_the_boot_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "heat.json"
    path.write_text("warm\n")
    assert parse_serve_args(["--heat-state", str(path)], {}) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("refbox: --heat-state: ") and "delete it to start" in line, line
    assert path.read_text() == "warm\n"  # left as it was


def test_box_heat_rejects_settings_out_of_range() -> None:
    for kwargs in ({"source": 1.5}, {"heat": -0.1}, {"slowdown_pct": math.inf},
                   {"half_life_requests": 0.0}):  # fmt: skip
        with pytest.raises(ValueError):
            BoxHeat(HeatSettings(path="/unused", **kwargs))  # type: ignore[arg-type]


def test_a_cells_heat_knobs_reach_the_runtimes_flags(tmp_path: Path) -> None:
    """The profile's heat_* knobs, as a card's cell sets them, are the flags' REFBOX_ variables;
    ``args`` with ``{cache_dir}`` gives the file a path per campaign and box instead."""
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/refbox.yaml")
    knobs = {"heat_source": 1, "heat_slowdown_pct": 20, "heat_half_life_requests": 8}
    for name, value in (*knobs.items(), ("heat_state", str(tmp_path / "heat.json"))):
        assert profile.knobs[name].check(str(value)) is None, name
    assert profile.knobs["heat_source"].check("1.5") is not None
    cells = (
        Cell(knobs={**knobs, "heat_state": str(tmp_path / "heat.json")}),
        Cell(knobs=knobs, args=["--heat-state", "{cache_dir}/heat.json"]),
    )
    for cell in cells:
        spec = boot_spec(profile, cell, port=0, run_dir=str(tmp_path), python=sys.executable,
                         bind_host="127.0.0.1", cache_dir=str(tmp_path), uploaded={})  # fmt: skip
        config = parse_serve_args(spec.argv[spec.argv.index("serve") + 1 :], spec.env)
        assert not isinstance(config, int)
        assert config.options.heat == HeatSettings(
            path=str(tmp_path / "heat.json"), source=1.0, slowdown_pct=20.0, half_life_requests=8.0
        )
