"""Imports fail closed: a file whose tool says requests failed or were cancelled, or whose
summary figures are not positive, is refused naming the file and field (exit 2), unless the
mapping allows a stated share of failures. Before, the geomean skipped non-positive figures and a
file of 200 errored requests gated PASS on the rest."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from harness.errors import ResultFileError
from harness.importers.write import read_source
from tests.importers.test_import import _cli, _ds4_rows, _export_demo, _labels, _mapping

FIXTURES = Path(__file__).parent.parent / "data" / "importers"


def _with(path: Path, **fields: object) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(fields)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_a_vllm_file_with_failed_requests_is_refused_unless_the_mapping_allows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=False)
    completed = json.loads(files[1].read_text(encoding="utf-8"))["completed"]
    _with(files[1], failed=1)
    mapping = _mapping(tmp_path / "m.yaml")
    code, _ = _cli("import", "vllm", *map(str, files), "--map", str(mapping),
                   "-o", str(tmp_path / "o1"))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and files[1].name in err
    assert f"1 of {completed + 1} requests failed or were cancelled (failed)" in err
    assert "allow_failed" in err and "Traceback" not in err
    # A stated share is accepted, and said so.
    allowing = _mapping(tmp_path / "m2.yaml", allow_failed="0.5")
    code, text = _cli("import", "vllm", *map(str, files), "--map", str(allowing),
                      "-o", str(tmp_path / "o2"))  # fmt: skip
    assert code == 0, text
    assert ("seed", "decode_tok_s") in _labels(tmp_path / "o2")
    # Every request failed: refused whatever share the mapping allows.
    _with(files[1], failed=200, completed=0)
    code, _ = _cli("import", "vllm", *map(str, files), "--map", str(allowing),
                   "-o", str(tmp_path / "o3"))  # fmt: skip
    assert code == 2 and "200 of 200 requests failed" in capsys.readouterr().err


def test_a_negative_or_zero_summary_figure_is_refused_naming_it(tmp_path: Path) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=False)
    _with(files[0], median_tpot_ms=-12.5)
    with pytest.raises(ResultFileError, match=r"median_tpot_ms: must be a finite positive number"):
        read_source("vllm", files[0])
    path = tmp_path / "d.csv"
    header = (FIXTURES / "ds4-header-40.csv").read_text(encoding="utf-8").splitlines()[0]
    rows = _ds4_rows(header.split(","), 20.0, 400.0)
    rows[1]["gen_tps"] = "-20.00"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=header.split(","))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ResultFileError, match=r"row 1: gen_tps: must be a finite positive"):
        read_source("ds4", path)


def test_aiperfs_errored_or_cancelled_requests_are_counted_as_failed(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "aiperf-profile_export_aiperf.json").read_text())
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    clean = read_source("aiperf", path)
    assert clean.failed == 0 and clean.sent == 200
    data["error_request_count"] = {"unit": "requests", "avg": 200.0}
    path.write_text(json.dumps(data), encoding="utf-8")
    block = read_source("aiperf", path)
    assert (block.failed, block.sent) == (200, 400)
    data["error_request_count"], data["was_cancelled"] = None, True
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ResultFileError, match="was_cancelled is true"):
        read_source("aiperf", path)


def test_an_import_through_a_symlink_never_writes_into_a_full_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=False)
    mine = tmp_path / "my-notes"
    mine.mkdir()
    (mine / "card.yaml").write_text("my own file\n", encoding="utf-8")
    link = tmp_path / "out"
    link.symlink_to(mine, target_is_directory=True)
    code, _ = _cli("import", "vllm", *map(str, files), "--map", str(_mapping(tmp_path / "m.yaml")),
                   "-o", str(link))  # fmt: skip
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["card.yaml"]
    assert (mine / "card.yaml").read_text(encoding="utf-8") == "my own file\n"
