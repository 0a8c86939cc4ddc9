"""The sglang and sglang-kt profiles: what a cell of the shipped GPU card boots with (argv and
env, the kt_* and recorder flags as SGLang and KTransformers spell them), and the recorder spec's
rules. Booting them needs a CUDA GPU box; the recorder adapter itself runs end to end on the
reference runtime in tests/execute/test_recorder_campaign.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from harness.card import load_card, load_runtime_profile
from harness.cli import main
from harness.errors import CardError, InfrastructureError
from harness.execute.engine_inputs import check_engine_inputs
from harness.profiles.telemetry import Telemetry
from harness.runtimes.boot import boot_spec
from tests.conftest import REPO

CARD = REPO / "campaigns" / "sglang-kt-placement.yaml"


def _flags(argv: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (None for a switch) after the fixed boot command."""
    out: dict[str, str | None] = {}
    for index, word in enumerate(argv):
        if word.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else "--"
            out[word] = None if following.startswith("--") else following
    return out


def _refused(card: Path, *words: str) -> None:
    """Loading ``card`` fails with one problem line holding every one of ``words``."""
    with pytest.raises(CardError) as caught:
        load_card(card)
    lines = caught.value.lines()
    assert any(all(word in line for word in words) for line in lines), lines


def test_a_kt_cell_boots_sglang_with_the_kt_and_recorder_flags() -> None:
    loaded = load_card(CARD)
    assert loaded.runtime.name == "sglang-kt"
    spec = boot_spec(
        loaded.runtime,
        loaded.card.cells["dynamic"],
        port=30000,
        run_dir="/runs/r0",
        python="python3",
        bind_host="127.0.0.1",
        cache_dir="/runs/cache",
        uploaded={"init_expert_location": "/runs/r0/files/init_expert_location.pt"},
    )
    assert spec.argv[:3] == ["sh", "-c", 'exec "${HARNESS_SGLANG_PYTHON:-python3}" '
                             '-m sglang.launch_server "$@"']  # fmt: skip
    flags = _flags(spec.argv)
    assert flags["--model-path"] == "/models/Qwen3-30B-A3B"
    assert flags["--kt-num-gpu-experts"] == "8"
    assert flags["--kt-expert-placement-strategy"] == "frequency"
    assert "--kt-enable-dynamic-expert-update" in flags
    assert flags["--kt-gpu-prefill-token-threshold"] == "512"
    assert flags["--init-expert-location"] == "/runs/r0/files/init_expert_location.pt"
    # The recorder's flags by default: stat mode, every pass kept, KT's GPU masks on.
    assert flags["--expert-distribution-recorder-mode"] == "stat"
    assert flags["--expert-distribution-recorder-buffer-size"] == "-1"
    assert "--record-kt-gpu-expert-distribution" in flags
    assert flags["--enable-metrics"] is None and flags["--port"] == "30000"
    assert spec.env["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"] == "/runs/r0/expert-distribution"
    recorder = loaded.runtime.telemetry.expert_recorder
    assert recorder is not None and recorder.dump_http == "/dump_expert_distribution_record"


def test_a_runtime_gives_one_source_of_route_counts() -> None:
    with pytest.raises(ValueError, match="not both"):
        Telemetry.model_validate(
            {
                "count_dump": {"path": "{run_dir}/c.json"},
                "expert_recorder": {"dir": "{run_dir}/expert-distribution"},
            }
        )


def test_every_cell_must_name_its_model(tmp_path: Path) -> None:
    text = CARD.read_text(encoding="utf-8").replace("      model: /models/Qwen3-30B-A3B\n", "")
    folder = tmp_path
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    (folder / "card.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(CardError) as caught:
        load_card(folder / "card.yaml")
    assert any("needs knob 'model' set" in line for line in caught.value.lines()), (
        caught.value.lines()
    )


def test_a_kt_frequency_cell_with_a_json_file_is_refused_before_any_boot(tmp_path: Path) -> None:
    # KT reads its frequency counts only from a .pt; handed a .json it places experts uniformly
    # (tests/engines/test_kt_conformance.py runs its loader on one), so the cell would
    # measure the control. Caught at load, naming the cell's file knob and the fix.
    folder = tmp_path
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    (folder / "counts.json").write_text('{"logical_count": [[[1, 2]]]}\n', encoding="utf-8")
    text = CARD.read_text(encoding="utf-8").replace(
        "{init_expert_location: maps/kt-frequency-refbox.pt}", "{init_expert_location: counts.json}"
    )
    (folder / "card.yaml").write_text(text, encoding="utf-8")
    _refused(
        folder / "card.yaml",
        "cells.frequency.files.init_expert_location",
        "reads only a .pt",
        "--format kt-frequency",
    )


def _kt_card_with_model(
    folder: Path, model: Path, layers: int, experts: int, *, wrapped: bool = False
) -> Path:
    """The KT card with its model at ``model`` (a config.json of ``layers`` x ``experts``; with
    ``wrapped``, nested under ``text_config`` as a VL model's config nests it)."""
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    model.mkdir(parents=True)
    config: dict[str, object] = {
        "num_hidden_layers": layers,
        "num_experts": experts,
        "model_type": "qwen3_moe",
    }
    if wrapped:
        config = {"model_type": "kimi_k25", "text_config": config, "vision_config": {}}
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    text = CARD.read_text(encoding="utf-8").replace("/models/Qwen3-30B-A3B\n", f"{model}\n")
    (folder / "card.yaml").write_text(text, encoding="utf-8")
    return folder / "card.yaml"


def test_a_frequency_file_of_another_model_is_refused_before_any_boot(tmp_path: Path) -> None:
    # The shipped file is the reference runtime's, 8 layers x 64 experts: KT's loader raises at
    # boot for a model of any other shape (tests/engines/test_kt_conformance.py runs it). A
    # model on this machine's box is read at validate, naming both shapes and the fix.
    card = _kt_card_with_model(tmp_path, tmp_path / "model", 48, 128)
    _refused(
        card,
        "cells.frequency.files.init_expert_location",
        "8 layers and the model 48",
        "--format kt-frequency",
    )
    # The model it was made for loads.
    other = tmp_path / "other"
    other.mkdir()
    assert load_card(_kt_card_with_model(other, other / "model", 8, 64)).card.cells


def test_a_vl_wrapped_models_frequency_file_is_refused_before_any_boot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # KT reads a VL model's shape from its text_config (Kimi-K2.5's layout), as
    # tests/engines/test_kt_conformance.py runs it: the shipped 8 x 64 file is refused for such
    # a 48 x 128 model by `validate` and by `run`, before a campaign folder is made (exit 2,
    # naming the cell's file, the shape and the fix), and taken for an 8 x 64 one.
    card = _kt_card_with_model(tmp_path, tmp_path / "model", 48, 128, wrapped=True)
    reports = tmp_path / "reports"
    for verb in (["validate"], ["run", "--reports", str(reports)]):
        capsys.readouterr()
        code = main([*verb, str(card)], out=io.StringIO())
        err = capsys.readouterr().err
        assert code == 2, err
        for words in (
            "cells.frequency.files.init_expert_location",
            "kt-frequency-refbox.pt: the file has 8 layers and the model 48 (num_hidden_layers "
            "of its text_config",
            "`harness fit-map COUNTS --format kt-frequency -o FILE.pt`",
        ):
            assert words in err, err
    assert not reports.exists()
    other = tmp_path / "other"
    other.mkdir()
    card = _kt_card_with_model(other, other / "model", 8, 64, wrapped=True)
    assert main(["validate", str(card)], out=io.StringIO()) == 0


def test_eplb_on_a_profile_that_drives_the_recorder_is_refused(tmp_path: Path) -> None:
    # EPLB reads and resets the recorder the harness starts and dumps around every run.
    card = _sglang_card(tmp_path, '      enable_eplb: true\n      ep_size: "2"\n')
    _refused(card, "knobs.enable_eplb", "EPLB shares")


def _sglang_card(folder: Path, knobs: str) -> Path:
    """The KT card moved to the plain sglang profile, the control given ``knobs`` (YAML lines)."""
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    text = (
        CARD.read_text(encoding="utf-8")
        .replace("runtime: sglang-kt", "runtime: sglang")
        .replace("    files: {init_expert_location: maps/kt-frequency-refbox.pt}\n", "")
    )
    lines = [line for line in text.splitlines() if not line.strip().startswith("kt_")]
    text = "\n".join(lines).replace(
        "      model: /models/Qwen3-30B-A3B\n", "      model: /models/Qwen3-30B-A3B\n" + knobs, 1
    )
    (folder / "card.yaml").write_text(text + "\n", encoding="utf-8")
    return folder / "card.yaml"


@pytest.mark.parametrize("algorithm", ["static", "lp"])
def test_static_dispatch_without_an_all_to_all_backend_is_refused_before_any_boot(
    tmp_path: Path, algorithm: str
) -> None:
    # SGLang 0.5.23 raises at boot for static (or lp) dispatch with moe_a2a_backend none
    # (srt/arg_groups/parallel_hook.py, handle_eplb_and_dispatch): said at validate instead.
    knobs = f'      ep_size: "2"\n      ep_dispatch_algorithm: {algorithm}\n'
    _refused(
        _sglang_card(tmp_path, knobs), "knobs.ep_dispatch_algorithm", "needs an all-to-all backend"
    )
    ok = tmp_path / "with-backend"
    ok.mkdir()
    load_card(_sglang_card(ok, knobs + "      moe_a2a_backend: deepep\n"))


def test_paged_experts_is_a_single_gpu_knob_with_its_resident_count(tmp_path: Path) -> None:
    # SGLang 0.5.23's check_paged_experts_compat raises at boot for tp/ep/pp/dp > 1, EPLB, or
    # no resident count: refused at validate instead.
    bad = '      enable_paged_experts: true\n      tp_size: "2"\n'
    with pytest.raises(CardError) as caught:
        load_card(_sglang_card(tmp_path, bad))
    lines = " ".join(caught.value.lines())
    assert "needs paged_experts_num_resident" in lines and "tp_size > 1" in lines, lines
    ok = tmp_path / "ok"
    ok.mkdir()
    good = '      enable_paged_experts: true\n      paged_experts_num_resident: "32"\n'
    loaded = load_card(_sglang_card(ok, good))
    cell = next(iter(loaded.card.cells.values()))
    spec = boot_spec(loaded.runtime, cell, port=8000, run_dir="/r", python="python3",
                     bind_host="127.0.0.1", cache_dir="/c", uploaded={})  # fmt: skip
    assert "--enable-paged-experts" in spec.argv
    assert spec.argv[spec.argv.index("--paged-experts-num-resident") + 1] == "32"


def test_counts_every_tensor_parallel_rank_recorded_are_divided_back() -> None:
    # SGLang's stat dump all-reduces its counts over the world group, and under tp_size N
    # without an all-to-all backend every rank routes the whole batch: N times the counts.
    from harness.formats.expert_distribution import ExpertDistribution
    from harness.profiles.telemetry import ExpertRecorderSpec
    from harness.runtimes.recorder import per_token_counts

    spec = ExpertRecorderSpec(dir="x", replicas_knob="tp_size", sharding_knob="moe_a2a_backend")
    true = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    dumped = ExpertDistribution(true * 4, None, "stat")
    assert np.array_equal(per_token_counts(dumped, spec, {"tp_size": "4"}).counts, true)
    sharded = {"tp_size": "4", "moe_a2a_backend": "deepep"}
    assert np.array_equal(per_token_counts(dumped, spec, sharded).counts, true * 4)
    assert np.array_equal(per_token_counts(dumped, spec, {}).counts, true * 4)
    with pytest.raises(InfrastructureError, match="not whole multiples of tp_size 4"):
        per_token_counts(ExpertDistribution(true * 4 + 1, None, "stat"), spec, {"tp_size": "4"})
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/sglang.yaml")
    assert profile.telemetry.expert_recorder is not None
    assert profile.telemetry.expert_recorder.replicas_knob == "tp_size"


@pytest.mark.parametrize(
    ("profile", "distributions"),
    [("sglang", ("sglang",)), ("sglang-kt", ("sglang-kt", "kt-kernel"))],
)
def test_the_version_names_each_build_by_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str, distributions: tuple[str, ...]
) -> None:
    # SGLang boots through `sh`, so the "binary" hash says nothing of the build: the version
    # line carries the SHA-256 of each installed distribution's RECORD (every file's hash), as
    # vLLM's does. Run here on installed-package metadata laid out as pip lays it out.
    import hashlib
    import stat
    import sys

    from harness.boxes.local import LocalBox
    from harness.card.resolve import load_runtime_profile
    from harness.profiles.box import BoxSpec
    from harness.runtimes.boot import runtime_version

    site = tmp_path / "site"
    records = {}
    for name in distributions:
        info = site / f"{name.replace('-', '_')}-0.7.2.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.7.2\n")
        record = f"{name.replace('-', '_')}/__init__.py,sha256=abc,1\n"
        (info / "RECORD").write_text(record)
        records[name] = hashlib.sha256(record.encode()).hexdigest()
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("HARNESS_SGLANG_PYTHON", str(python))
    path = REPO / "harness" / "profiles" / "data" / "runtimes" / f"{profile}.yaml"
    found = runtime_version(LocalBox("local", BoxSpec()), load_runtime_profile(path), "python3")
    line = found["version"]
    for name in distributions:
        assert f"{name} 0.7.2 RECORD sha256 {records[name]}" in line, line
    # Another build (one file changed) reads as another version.
    first = next(site.iterdir()) / "RECORD"
    first.write_text(first.read_text().replace("abc", "abd"))
    assert runtime_version(LocalBox("local", BoxSpec()), load_runtime_profile(path),
                           "python3")["version"] != line  # fmt: skip


def test_a_full_gpu_prefill_threshold_without_the_models_config_is_warned_of(
    tmp_path: Path,
) -> None:
    # The dynamic cell sets kt_gpu_prefill_token_threshold 512: the recorder then needs the
    # router's top-k from the model's config.json to leave full-GPU prefills out, and gives
    # the run no hit rate without it. `run` says so before any boot; with the config, nothing.
    warnings = check_engine_inputs(load_card(CARD))
    assert len(warnings) == 1, warnings
    for words in (
        "cells.dynamic: kt_gpu_prefill_token_threshold 512",
        "/models/Qwen3-30B-A3B/config.json on box local",
        "no hit rate",
    ):
        assert words in warnings[0], warnings
    card = _kt_card_with_model(tmp_path, tmp_path / "model", 8, 64)
    assert check_engine_inputs(load_card(card)) == []
