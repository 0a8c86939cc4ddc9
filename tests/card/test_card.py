"""Card validation: every shipped card validates, every invalid card says what and where."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness.card import load_card
from harness.card.checks import shared_boot_problems
from harness.card.schema import Design
from harness.errors import BadInput, CardError
from harness.profiles.telemetry import AppliedCheck
from tests.conftest import DATA, REPO, run_cli

GGUF = REPO / "campaigns" / "models" / "tiny-moe.gguf"
INVALID = sorted((DATA / "cards" / "invalid").glob("*.yaml"))


def _expected(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [m.group(1) for line in lines if (m := re.match(r"# expect: (.*)", line))]


def test_there_is_an_invalid_card_for_each_required_case() -> None:
    names = {p.stem for p in INVALID}
    required = {
        "unknown-key",
        "wrong-type",
        "missing-control",
        "control-not-cell",
        "unknown-gate",
        "unknown-metric",
        "missing-prompt-file",
        "overlap",
        "duplicate-key",
        "tabs",
        "zero-cycles",
        "boot-non-live-knob",
        "schema-and-semantic",  # a schema error does not hide a knob or a file
    }
    assert required <= names


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_card_reports_file_line_field_and_message(path: Path) -> None:
    expected = _expected(path)
    assert expected, f"{path} has no '# expect:' line"
    with pytest.raises(BadInput) as caught:
        load_card(path)
    report = "\n".join(caught.value.lines())
    for fragment in expected:
        assert fragment in report, f"expected {fragment!r} in:\n{report}"
    for line in caught.value.lines():
        assert re.match(r"^\S+:\d+: ", line), f"not file:line: {line!r}"


def test_valid_fixture_card_loads_everything() -> None:
    loaded = load_card(DATA / "cards" / "valid.yaml")
    assert loaded.card.control == "control"
    assert loaded.card.treatments == ["fitted"]
    assert loaded.runtime.name == "refbox"
    assert loaded.box.kind == "local"
    assert [p.id for p in loaded.split("fit")] == ["en-fit-1", "en-fit-2", "py-fit-1"]
    assert len(loaded.split("heldout")) == 4
    assert len(loaded.quality) == 2


# Cards whose model is the tiny GGUF `harness make-gguf` builds (not shipped).
MODEL_CARDS = {"llama-cpp-threads.yaml", "llama-bench-threads.yaml"}


def test_every_shipped_card_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the make-gguf command names the path from here
    cards = sorted((REPO / "campaigns").glob("*.yaml"))
    cards = [c for c in cards if c.name != "boxes.yaml"]
    assert any(c.name == "demo.yaml" for c in cards)
    for card in cards:
        if card.name in MODEL_CARDS and not (GGUF).is_file():
            # Its model is built, not shipped; until then it must say so, and how to build it.
            with pytest.raises(CardError) as caught:
                load_card(card)
            assert any(
                "file not found: models/tiny-moe.gguf" in line
                and "`harness make-gguf -o campaigns/models/tiny-moe.gguf --seed 1`" in line
                for line in caught.value.lines()
            ), caught.value.lines()
            continue
        load_card(card)


def test_names_resolve_from_a_card_anywhere_on_disk(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text((DATA / "pools" / "small.jsonl").read_text(encoding="utf-8"))
    card = tmp_path / "card.yaml"
    card.write_text(
        "campaign: elsewhere\nbox: local\nruntime: refbox\nprompts: {pools: [pool.jsonl]}\n"
        "cells: {a: {}, b: {}}\ncontrol: a\n"
    )
    loaded = load_card(card)
    assert loaded.runtime.name == "refbox"


def test_inline_box_and_runtime(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text((DATA / "pools" / "small.jsonl").read_text(encoding="utf-8"))
    card = tmp_path / "card.yaml"
    card.write_text(
        "campaign: inline\n"
        "box: {kind: ssh, host: gh200-a, port: 2222, user: bench}\n"
        "runtime:\n"
        "  name: custom\n"
        "  boot: {command: [./server, --port, '{port}']}\n"
        "  ready: {http: {path: /v1/models}}\n"
        "prompts: {pools: [pool.jsonl]}\n"
        "cells: {a: {}, b: {env: {X: '1'}}}\n"
        "control: a\n"
    )
    loaded = load_card(card)
    assert loaded.box.kind == "ssh" and loaded.box.port == 2222
    assert loaded.runtime.name == "custom"


def test_unknown_box_suggests_a_name(tmp_path: Path) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text((DATA / "pools" / "small.jsonl").read_text(encoding="utf-8"))
    card = tmp_path / "card.yaml"
    card.write_text(
        "campaign: x\nbox: locl\nprompts: {pools: [pool.jsonl]}\ncells: {a: {}, b: {}}\n"
        "control: a\n"
    )
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert "card.yaml:2: box: unknown box 'locl'; did you mean `local`?" in caught.value.lines()[0]


def test_shared_boot_refuses_a_non_live_knob_at_its_line_and_exits_2() -> None:
    # hot_slots reaches refbox at boot only; drain_every is live, so it may differ.
    path = DATA / "cards" / "invalid" / "boot-non-live-knob.yaml"
    with pytest.raises(CardError) as caught:
        load_card(path)
    lines = caught.value.lines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}:8: cells.b.knobs.hot_slots: hot_slots is 16 in b")
    assert "use design.boot: per-block" in lines[0]
    result = run_cli("validate", str(path))
    assert result.code == 2
    assert "Traceback" not in result.stderr
    # The same cells booting per block are a valid card.
    per_block = path.read_text(encoding="utf-8").replace("boot: per-cycle", "boot: per-block")
    copy = path.with_name("boot-per-block.tmp.yaml")
    try:
        copy.write_text(per_block, encoding="utf-8")
        assert load_card(copy).card.design.boot == "per-block"
    finally:
        copy.unlink()


def test_shared_boot_refuses_a_live_knob_one_cell_leaves_unset(tmp_path: Path) -> None:
    # After a reset, a cell that does not set drain_every would keep the boot's first cell's.
    text = (DATA / "cards" / "invalid" / "boot-non-live-knob.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "a: {knobs: {hot_slots: 48, drain_every: 64}}", "a: {knobs: {hot_slots: 16}}"
    )
    card = tmp_path / "unset.yaml"
    card.write_text(text.replace("../../pools/", f"{DATA}/pools/"), encoding="utf-8")
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert caught.value.lines() == [
        f"{card}:8: cells.b.knobs.drain_every: drain_every is live but a leaves it unset (the "
        "profile gives no default): on a shared boot a would run on the value the boot started "
        "with; set drain_every in every cell (design.boot: per-cycle)"
    ]


def test_shared_boot_refuses_cold_runs() -> None:
    with pytest.raises(ValidationError, match="a cold run needs a fresh boot"):
        Design(boot="per-cycle", cache_states=["warm", "cold"])


@pytest.mark.parametrize("card", ["llama-bench-threads", "llama-cpp-threads", "hotlist-priority"])
def test_timing_cards_can_show_the_label_they_gate_on(card: str) -> None:
    # Two fixed cycles are one degree of freedom (t₀.₉₇₅ = 12.7) and leave carry-over out of the
    # model; a card that gates on *better* looks sequentially from 3 cycles (issue 26).
    design = yaml.safe_load((REPO / "campaigns" / f"{card}.yaml").read_text())["design"]
    assert design["cycles"] >= 3
    assert design.get("sequential") is True and design["max_cycles"] > design["cycles"]


def test_shared_boot_refuses_a_live_knob_the_profile_checks_from_its_boot_line() -> None:
    # telemetry.applied reads what the runtime printed at boot: after a live change that line
    # still shows the boot's first cell, so a build ignoring the change would pass unseen.
    loaded = load_card(DATA / "cards" / "e2e" / "same-boot.yaml")
    assert shared_boot_problems(loaded.card, loaded.runtime) == []
    check = AppliedCheck(
        knob="drain_every", pattern=r"drain every (?P<applied>\d+)", expect={"*": "{value}"}
    )
    telemetry = loaded.runtime.telemetry.model_copy(update={"applied": [check]})
    checked = loaded.runtime.model_copy(update={"telemetry": telemetry})
    ((loc, message),) = shared_boot_problems(loaded.card, checked)
    assert loc == ("cells", "fast", "knobs", "drain_every")
    assert "telemetry.applied" in message and "use design.boot: per-block" in message


def test_washed_by_boot_needs_a_boot_per_block() -> None:
    with pytest.raises(ValidationError, match="washed_by: boot needs every block on a boot"):
        Design(boot="per-cycle", washed_by="boot")


def test_washed_by_boot_needs_probes_that_read_every_cell(tmp_path: Path) -> None:
    # A fresh boot clears the runtime, not the box: without a probe of what the box keeps
    # across boots the card is refused at the field, with the fix, before anything runs.
    demo = yaml.safe_load((REPO / "campaigns" / "demo.yaml").read_text(encoding="utf-8"))
    assert demo["design"]["washed_by"] == "boot"
    runtime = yaml.safe_load(
        (REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml").read_text()
    )
    runtime["box_state"] = [p for p in runtime["box_state"] if p["name"] == "heat"]
    demo["runtime"] = runtime
    demo["prompts"]["pools"] = [str(REPO / "campaigns" / "prompts" / "mixed.jsonl")]
    for cell in demo["cells"].values():
        cell["files"] = {k: str(REPO / "campaigns" / v) for k, v in cell["files"].items()}
    card = tmp_path / "card.yaml"
    card.write_text(yaml.safe_dump(demo, sort_keys=False), encoding="utf-8")
    with pytest.raises(CardError) as caught:
        load_card(card)
    lines = caught.value.lines()
    assert len(lines) == 2, lines  # one per cell
    assert "design.washed_by: no box_state probe of runtime 'refbox' reads cell 'stale'" in lines[0]
    assert "heat needs heat_state" in lines[0]
    runtime.pop("box_state")
    card.write_text(yaml.safe_dump(demo, sort_keys=False), encoding="utf-8")
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert "declares none (`box_state` in its profile)" in caught.value.lines()[0]
    result = run_cli("validate", str(card))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "washed_by: washout" in result.stderr + result.stdout
