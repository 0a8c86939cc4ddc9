"""A campaign directory keeps the card's inputs: what is copied where, and loading from them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from harness.card import load_card
from harness.card.frozen import MANIFEST, freeze_inputs, frozen_paths, load_frozen_card
from harness.errors import RecordError
from tests.conftest import DATA, REPO

RUNTIME = REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml"


def _source(tmp_path: Path) -> Path:
    """valid.yaml with its files in a folder of its own: pools one level up, a profile beside."""
    src = tmp_path / "src"
    (src / "cards" / "runtimes").mkdir(parents=True)
    (src / "pools").mkdir()
    (src / "maps").mkdir()
    shutil.copy(DATA / "cards" / "valid.yaml", src / "cards" / "valid.yaml")
    for name in ("small.jsonl", "quality.jsonl"):
        shutil.copy(DATA / "pools" / name, src / "pools" / name)
    shutil.copy(DATA / "maps" / "tiny-rowmap.json", src / "maps" / "tiny-rowmap.json")
    shutil.copy(RUNTIME, src / "cards" / "runtimes" / "refbox.yaml")
    (src / "cards" / "boxes.yaml").write_text("local: {kind: local, platform: linux-cpu}\n")
    return src / "cards" / "valid.yaml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _frozen(tmp_path: Path, **kwargs: int) -> tuple[Path, Path]:
    card = _source(tmp_path)
    root = tmp_path / "campaign"
    root.mkdir()
    freeze_inputs(load_card(card), root, **kwargs)
    return card, root


def test_the_card_and_every_file_it_names_are_copied_with_their_hashes(tmp_path: Path) -> None:
    card, root = _frozen(tmp_path)
    manifest = json.loads((root / MANIFEST).read_text())
    by_role = {(e["role"], e["written"]): e for e in manifest["files"]}
    src = card.parent.parent
    assert {(role, e["copy"]) for (role, _), e in by_role.items()} == {
        ("card", "card.yaml"),
        ("pool", "inputs/_up/pools/small.jsonl"),
        ("quality", "inputs/_up/pools/quality.jsonl"),
        ("cell_file", "inputs/_up/maps/tiny-rowmap.json"),
        ("runtime", "inputs/runtimes/refbox.yaml"),
        ("boxes", "inputs/boxes.yaml"),
    }
    assert by_role["cell_file", "../maps/tiny-rowmap.json"]["fields"] == [
        "cells.fitted.files.rowmap"
    ]
    assert by_role["runtime", "refbox"]["original"] == str(
        src / "cards" / "runtimes" / "refbox.yaml"
    )
    for entry in manifest["files"]:
        assert entry["sha256"] == _sha(Path(entry["original"])) == _sha(root / entry["copy"])
    assert frozen_paths(root, "pool") == [root / "inputs/_up/pools/small.jsonl"]


def test_a_moved_card_loads_from_its_copies_and_says_each_original_is_gone(
    tmp_path: Path,
) -> None:
    card, root = _frozen(tmp_path)
    shutil.move(card.parent.parent, tmp_path / "moved")
    frozen = load_frozen_card(root)
    loaded = frozen.loaded
    assert loaded.resolve("../maps/tiny-rowmap.json") == root / "inputs/_up/maps/tiny-rowmap.json"
    assert loaded.prompts and all(p.source.startswith(str(root)) for p in loaded.prompts)
    assert loaded.runtime.name == "refbox" and loaded.box_name == "local"
    assert len(frozen.notes) == 6
    assert f"note: {card}: gone; using the frozen copy {root / 'card.yaml'}" in frozen.notes


def test_an_edited_original_is_named_and_the_frozen_copy_used(tmp_path: Path) -> None:
    card, root = _frozen(tmp_path)
    pool = card.parent.parent / "pools" / "small.jsonl"
    before = _sha(pool)
    lines = pool.read_text().splitlines()
    pool.write_text("\n".join(lines[:2]) + "\n")  # drops every held-out prompt
    card.write_text(card.read_text().replace("cycles: 3", "cycles: 9"))
    frozen = load_frozen_card(root)
    assert [n for n in frozen.notes if "small.jsonl" in n] == [
        f"note: {pool}: changed since the campaign started (sha256 {before[:12]} → "
        f"{_sha(pool)[:12]}); using the frozen copy {root / 'inputs/_up/pools/small.jsonl'}"
    ]
    assert any(n.startswith(f"note: {card}: changed") for n in frozen.notes)
    assert len(frozen.loaded.split("heldout")) == len([x for x in lines if "heldout" in x])
    assert frozen.loaded.card.design.cycles == 3


def test_an_edited_frozen_copy_is_refused(tmp_path: Path) -> None:
    _, root = _frozen(tmp_path)
    copy = root / "inputs/_up/maps/tiny-rowmap.json"
    copy.write_text(copy.read_text() + " ")
    with pytest.raises(RecordError, match=r"tiny-rowmap.json: edited since the campaign started"):
        load_frozen_card(root)


def test_a_file_over_the_copy_limit_is_referenced_by_hash_and_must_stay_the_same(
    tmp_path: Path,
) -> None:
    card, root = _frozen(tmp_path, copy_limit_bytes=2048)  # pools and map are small; the card too
    entries = json.loads((root / MANIFEST).read_text())["files"]
    referenced = {e["written"] for e in entries if e["copy"] is None}
    runtime_bytes = RUNTIME.stat().st_size
    assert runtime_bytes > 2048 and "refbox" in referenced
    profile = card.parent / "runtimes" / "refbox.yaml"
    os.utime(profile)  # touched, same bytes: still the same file
    assert load_frozen_card(root).loaded.runtime.name == "refbox"
    profile.write_text(profile.read_text() + "\n# edited\n")
    with pytest.raises(RecordError, match=r"refbox.yaml: changed since the campaign started"):
        load_frozen_card(root)
    profile.unlink()
    with pytest.raises(RecordError, match=r"refbox.yaml: gone; runtime 'refbox'.*put it back"):
        load_frozen_card(root)
