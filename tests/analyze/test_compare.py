"""``harness compare DIR_A DIR_B``: two campaigns of one card side by side, boxes checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.importers.test_import import DEMO, _cli, _export_demo, _mapping


def _faster_seed(files: list[Path], factor: float) -> None:
    """The seed cell's inter-token gaps scaled by ``factor``: a build that decodes faster."""
    for path in files:
        if path.name.startswith("seed-"):
            data = json.loads(path.read_text(encoding="utf-8"))
            data["itls"] = [[g * factor for g in row] for row in data["itls"]]
            path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def two_builds(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    a = tmp_path / "a"
    shutil.copytree(DEMO, a)
    files = _export_demo(tmp_path / "vllm", detailed=True)
    _faster_seed(files, 0.8)
    b = tmp_path / "b"
    code, text = _cli("import", "vllm", *map(str, files), "--map",
                      str(_mapping(tmp_path / "m.yaml")), "-o", str(b))  # fmt: skip
    assert code == 0, text
    return a, b, files


def test_two_builds_side_by_side(two_builds: tuple[Path, Path, list[Path]]) -> None:
    a, b, _ = two_builds
    code, text = _cli("compare", str(a), str(b), "--json")
    assert code == 0, text
    rows = {(r["cell"], r["metric"]): r for r in json.loads(text)}
    seed = rows[("seed", "decode_tok_s")]
    assert seed["ratio"] == pytest.approx(1 / 0.8, rel=0.01) and seed["label"] == "better"
    assert seed["blocks_a"] == seed["blocks_b"] == 6
    stale = rows[("stale", "decode_tok_s")]
    # The same blocks: no change; unpaired blocks this noisy cannot show equivalence at 2%.
    assert stale["ratio"] == pytest.approx(1.0) and stale["label"] == "inconclusive"
    assert rows[("seed", "tpot_p50_ms")]["label"] == "better"  # lower TPOT is better
    code, text = _cli("compare", str(a), str(b))
    assert code == 0 and "B/A" in text


def test_different_boxes_are_refused_unless_cross_box(
    tmp_path: Path, two_builds: tuple[Path, Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _, files = two_builds
    other = tmp_path / "other"
    mapping = (
        _mapping(tmp_path / "m2.yaml")
        .read_text(encoding="utf-8")
        .replace("box: local", "box: gh200-a")
    )
    (tmp_path / "m2.yaml").write_text(mapping, encoding="utf-8")
    assert _cli("import", "vllm", *map(str, files), "--map", str(tmp_path / "m2.yaml"),
                "-o", str(other))[0] == 0  # fmt: skip
    code, _ = _cli("compare", str(a), str(other))
    err = capsys.readouterr().err
    assert code == 2 and "'local'" in err and "'gh200-a'" in err and "--cross-box" in err
    code, text = _cli("compare", str(a), str(other), "--cross-box")
    assert code == 0 and "different boxes" in text


def test_different_cards_are_refused(
    tmp_path: Path, two_builds: tuple[Path, Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _, files = two_builds
    renamed = (
        _mapping(tmp_path / "m3.yaml")
        .read_text(encoding="utf-8")
        .replace("campaign: demo", "campaign: other")
    )
    (tmp_path / "m3.yaml").write_text(renamed, encoding="utf-8")
    assert _cli("import", "vllm", *map(str, files), "--map", str(tmp_path / "m3.yaml"),
                "-o", str(tmp_path / "o"))[0] == 0  # fmt: skip
    code, _ = _cli("compare", str(a), str(tmp_path / "o"))
    assert code == 2 and "same card" in capsys.readouterr().err
