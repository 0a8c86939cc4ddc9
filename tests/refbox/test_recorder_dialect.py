"""The reference runtime's SGLang recorder dialect: on the engine, per-pass counts and KT's GPU
masks whose product is exactly its own fast-tier lookups; its flags; and over HTTP, a runtime
without the recorder refusing a start, which fails the run naming the flag. The endpoints with
the adapter run end to end in tests/execute/test_recorder_campaign.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.boxes.local import LocalBox
from harness.card import Cell, load_runtime_profile
from harness.errors import InfrastructureError
from harness.formats.expert_distribution import combine_dumps, gpu_hits, read_dump
from harness.policy.residency import PolicyKnobs
from harness.profiles.box import BoxSpec
from harness.profiles.telemetry import ExpertRecorderSpec
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.model import ModelConfig
from harness.refbox.options import parse_serve_args
from harness.runtimes.boot import boot, boot_spec
from harness.runtimes.recorder import start_recording
from tests.conftest import REPO

SMALL = ModelConfig(layers=3, experts=16, top_k=2, d_model=16, d_ff=16, seed=7)


def test_counts_times_masks_are_the_engines_own_hits_and_misses(tmp_path: Path) -> None:
    # Adaptive with an eager drain, so the hot set moves between passes while recording.
    knobs = PolicyKnobs(policy="adaptive", drain_every=2, swaps_per_layer=2)
    options = EngineOptions(
        hot_slots=6,
        expert_bytes=0,
        cold_dir=str(tmp_path),
        knobs=knobs,
        expert_recorder="stat",
        expert_recorder_masks=True,
    )
    engine = Engine(SMALL, options)
    assert engine.recorder is not None
    list(engine.generate(b"warm-up, not recorded", 4))
    before = engine.counters()
    engine.recorder.start()
    prompts = [b"hello there", b"def f(x): return x"]
    for prompt in prompts:
        list(engine.generate(prompt, 6))
    engine.recorder.stop()
    at_stop = engine.counters()
    list(engine.generate(b"after the stop, not recorded", 3))
    # Two files, as KTransformers' SGLang build writes them: the counts, and the masks beside.
    counts_file, masks_file = map(Path, engine.recorder.dump(str(tmp_path / "dumps")))
    assert counts_file.name.startswith("expert_distribution_recorder_")
    assert masks_file.name.startswith("gpu_expert_distribution_") and masks_file.suffix == ".pt"
    assert read_dump(counts_file).masks is None and read_dump(masks_file).mode == "masks"
    dump = combine_dumps([read_dump(counts_file), read_dump(masks_file)], "dumps")
    # One row per pass: a prefill and 5 decode steps per request.
    assert dump.counts.shape == (2 * 6, 3, 16) and dump.masks is not None
    # Every token of a pass counted: (BOS + prompt + 5 decode tokens) x layers x top_k.
    tokens = sum(1 + len(p) + 5 for p in prompts)
    assert int(dump.counts.sum()) == tokens * 3 * 2
    assert (dump.masks.sum(axis=2) == 6).all()  # the hot set keeps its size per layer
    split = gpu_hits(dump)
    assert split == (at_stop["hits"] - before["hits"], at_stop["misses"] - before["misses"])
    assert engine.swaps > 0  # the mask did change while recording
    # The dump cleared the record.
    empty = read_dump(engine.recorder.dump(str(tmp_path / "dumps"))[0])
    assert empty.counts.shape == (0, 3, 16)


def test_masks_match_cold_lookups_exactly(tmp_path: Path) -> None:
    knobs = PolicyKnobs(policy="adaptive", drain_every=1, swaps_per_layer=1)
    options = EngineOptions(
        hot_slots=4,
        expert_bytes=0,
        cold_dir=str(tmp_path),
        knobs=knobs,
        expert_recorder="stat",
        expert_recorder_masks=True,
    )
    engine = Engine(SMALL, options)
    assert engine.recorder is not None
    before = engine.counters()
    engine.recorder.start()
    list(engine.generate(b"one request, eight tokens", 8))
    engine.recorder.stop()
    after = engine.counters()
    dump = combine_dumps([read_dump(p) for p in engine.recorder.dump(str(tmp_path))], "dump")
    split = gpu_hits(dump)
    assert split is not None
    assert split == (after["hits"] - before["hits"], after["misses"] - before["misses"])
    assert split[1] == after["cold_lookups"] - before["cold_lookups"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--expert-distribution-recorder-mode", "per_token"], "records mode stat only"),
        (
            ["--record-kt-gpu-expert-distribution", "--cache-records", "8"],
            "not in cache mode",
        ),
    ],
)
def test_recorder_flags_refuse_what_the_refbox_cannot_record(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_serve_args(argv, {}) == 2
    assert message in capsys.readouterr().err


def test_the_kt_flag_implies_stat_mode() -> None:
    config = parse_serve_args(["--record-kt-gpu-expert-distribution"], {})
    assert not isinstance(config, int)
    assert config.options.expert_recorder == "stat" and config.options.expert_recorder_masks


def test_a_runtime_without_the_recorder_fails_the_run_saying_which_flag(tmp_path: Path) -> None:
    profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / "refbox.yaml")
    box = LocalBox("local", BoxSpec())
    (tmp_path / "cache").mkdir()
    cell = Cell(env={"REFBOX_LAYERS": "2", "REFBOX_EXPERTS": "8", "REFBOX_HOT_SLOTS": "4"})
    spec = boot_spec(
        profile,
        cell,
        port=box.free_port(),
        run_dir=str(tmp_path),
        python=sys.executable,
        bind_host=box.bind_host,
        cache_dir=str(tmp_path / "cache"),
        uploaded={},
    )
    runtime = boot(box, profile, spec)
    try:
        recorder = ExpertRecorderSpec(dir="{run_dir}/expert-distribution")
        with pytest.raises(InfrastructureError) as caught:
            start_recording(runtime, recorder, str(tmp_path))
        assert "HTTP 400" in str(caught.value)
        assert "--expert-distribution-recorder-mode" in str(caught.value)
    finally:
        assert runtime.stop()
