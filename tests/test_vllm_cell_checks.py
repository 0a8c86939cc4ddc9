"""vLLM's refusals between knobs: what its config refuses before it loads a weight, refused first.

Each rule is vLLM 0.32's (``config/parallel.py``, ``config/scheduler.py``,
``engine/arg_utils.py``, ``config/vllm.py``, ``config/model.py``, ``config/speculative.py``),
read from the pinned release; tests/engines/test_vllm_parsers.py runs that release's own
validation over every cell the profiles can send and asserts agreement.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.card import Cell, load_card, load_runtime_profile
from harness.card.vllm_checks import (
    VllmBox,
    default_token_budget,
    model_max_len,
    vllm_box_refusals,
    vllm_cell_refusals,
    vllm_model_refusals,
)
from harness.errors import BadInput, CardError
from harness.execute.engine_inputs import check_engine_inputs, parse_vllm_gpus
from tests.conftest import REPO

VLLM = load_runtime_profile(REPO / "campaigns" / "runtimes" / "vllm.yaml")
LANE = load_runtime_profile(REPO / "campaigns" / "runtimes" / "cuda-lane.yaml")
SGLANG = load_runtime_profile(REPO / "campaigns" / "runtimes" / "sglang.yaml")
LANE_KNOBS = {"image": "lane:1", "model_dir": "/models/m"}
CPU = VllmBox(cpu=True)
H100 = VllmBox(cpu=False, gpu_mib=81559, gpu_name="NVIDIA H100 80GB HBM3")
A100 = VllmBox(cpu=False, gpu_mib=81920, gpu_name="NVIDIA A100-SXM4-80GB")
B200 = VllmBox(cpu=False, gpu_mib=183359, gpu_name="NVIDIA B200")
L4 = VllmBox(cpu=False, gpu_mib=23034, gpu_name="NVIDIA L4")


def _refused(knobs: dict[str, Any], profile: Any = VLLM, **cell: Any) -> list[str]:
    found = vllm_cell_refusals(Cell(knobs=knobs, **cell), profile)
    return [f"{knob}: {problem}" for knob, problem in found]


def test_eplb_needs_expert_parallel() -> None:
    # ParallelConfig: "enable_expert_parallel must be True to use EPLB".
    refused = _refused({"eplb": True, "tensor_parallel_size": "2"})
    assert len(refused) == 1 and "enable_expert_parallel must be True" in refused[0], refused
    assert _refused({"eplb": True, "expert_parallel": True, "tensor_parallel_size": "2"}) == []


def test_eplb_needs_more_than_one_rank() -> None:
    # ParallelConfig: "EPLB requires tensor, prefill-context, or data parallelism".
    for knobs in ({}, {"tensor_parallel_size": "1", "data_parallel_size": "1"}):
        refused = _refused({"eplb": True, "expert_parallel": True, **LANE_KNOBS, **knobs}, LANE)
        assert len(refused) == 1 and "TP=1, DP=1" in refused[0], refused
    assert _refused({"eplb": True, "expert_parallel": True, "data_parallel_size": "2"}) == []


def test_redundant_experts_need_eplb() -> None:
    redundant = {"eplb_config": '{"window_size": 10, "num_redundant_experts": 2}'}
    for eplb in ({}, {"eplb": False}):
        refused = _refused({**redundant, **eplb})
        assert len(refused) == 1 and "but EPLB is not enabled" in refused[0], refused
    assert _refused({"eplb_config": '{"num_redundant_experts": 0}'}) == []
    on = {"eplb": True, "expert_parallel": True, "tensor_parallel_size": "2"}
    assert _refused({**redundant, **on}) == []


def test_max_num_seqs_within_an_explicit_token_budget() -> None:
    # SchedulerConfig.verify_max_model_len: the budget at least max_num_seqs.
    refused = _refused({"max_num_batched_tokens": "256", "max_num_seqs": "1024"})
    assert len(refused) == 1 and refused[0].startswith("max_num_seqs: "), refused
    assert "greater than or equal to max_num_seqs" in refused[0], refused
    assert _refused({"max_num_batched_tokens": "1024", "max_num_seqs": "1024"}) == []


def test_an_unset_budget_is_judged_at_validate_only_past_every_default() -> None:
    # 16384 is the largest default (a GPU of 160 GiB or more); below it the box decides.
    refused = _refused({"max_num_seqs": "16385", **LANE_KNOBS}, LANE)
    assert len(refused) == 1 and "16384" in refused[0], refused
    assert _refused({"max_num_seqs": "16384"}) == []
    assert _refused({"max_num_seqs": "4096"}) == []


@pytest.mark.parametrize(
    ("box", "tp", "budget"),
    [(CPU, 1, 2048), (CPU, 2, 4096), (L4, 1, 2048), (A100, 1, 2048), (H100, 1, 8192),
     (B200, 1, 16384), (VllmBox(cpu=True, gpu_mib=81559, gpu_name="NVIDIA H100"), 1, 8192),
     (VllmBox(cpu=False, gpu_mib=70 * 1024, gpu_name="X"), 1, None)],
)  # fmt: skip
def test_default_token_budget_follows_vllms_platform_and_gpu(
    box: VllmBox, tp: int, budget: int | None
) -> None:
    # get_batch_defaults (OpenAI server): CPU 2048 per rank, GPU by memory, an A100 kept small;
    # within 2% of a threshold nothing is said.
    assert default_token_budget(box, tp) == budget


def test_an_unset_budget_against_the_boxs_default_at_run() -> None:
    cell = Cell(knobs={"max_num_seqs": "4096"})
    assert vllm_box_refusals(cell, VLLM, H100, {}) == []
    for box in (CPU, A100):
        found = vllm_box_refusals(cell, VLLM, box, {})
        assert len(found) == 1 and "token budget 2048" in found[0][1], found
    # Chunked prefill off raises the default to max_model_len.
    off = Cell(knobs={"max_num_seqs": "4096", "chunked_prefill": False, "max_model_len": "4096"})
    assert vllm_box_refusals(off, VLLM, CPU, {}) == []
    wide = Cell(knobs={"max_num_seqs": "4096", "tensor_parallel_size": "2"})
    assert vllm_box_refusals(wide, VLLM, CPU, {}) == []


def test_chunked_prefill_off_needs_the_budget_to_hold_the_context() -> None:
    # SchedulerConfig: "is smaller than max_model_len" (vllm.yaml's max_model_len is 2048).
    refused = _refused({"chunked_prefill": False, "max_num_batched_tokens": "1024"})
    assert len(refused) == 1 and refused[0].startswith("max_num_batched_tokens: "), refused
    assert "smaller than max_model_len" in refused[0], refused
    assert _refused({"chunked_prefill": True, "max_num_batched_tokens": "1024"}) == []
    assert _refused({"chunked_prefill": False, "max_num_batched_tokens": "2048"}) == []
    # The lane sets no max_model_len: the model's own context decides.
    cell = Cell(knobs={**LANE_KNOBS, "max_num_batched_tokens": "1024"})
    assert vllm_model_refusals(cell, LANE, {"max_position_embeddings": 4096}) == []


def test_routed_experts_need_model_runner_v2_and_prefix_caching() -> None:
    # _verify_aux_output_compatibility: "AuxOutput Connector requires Model Runner V2" (V1 on a
    # CPU box, or where it is turned off), "requires prefix caching".
    for env in ({}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}):
        refused = _refused({"return_routed_experts": True}, env=env)
        assert len(refused) == 1 and "VLLM_USE_V2_MODEL_RUNNER" in refused[0], refused
    v2 = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert _refused({"return_routed_experts": True}, env=v2) == []
    refused = _refused({"return_routed_experts": True, "prefix_caching": False}, env=v2)
    assert len(refused) == 1 and "requires prefix caching" in refused[0], refused
    # vLLM reads the variable as bool(int(value)).
    refused = _refused({}, env={"VLLM_USE_V2_MODEL_RUNNER": "true"})
    assert len(refused) == 1 and refused[0].startswith("env.VLLM_USE_V2_MODEL_RUNNER"), refused


def test_model_runner_v2_is_refused_on_a_cpu_only_box_at_run() -> None:
    cell = Cell(knobs={}, env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    found = vllm_box_refusals(cell, VLLM, CPU, {})
    assert len(found) == 1 and "Model Runner V2 requires Triton" in found[0][1], found
    assert vllm_box_refusals(cell, VLLM, H100, {}) == []
    # A linux-cpu box with a GPU may run either build: left to the boot.
    both = VllmBox(cpu=True, gpu_mib=81559, gpu_name="NVIDIA H100")
    assert vllm_box_refusals(cell, VLLM, both, {}) == []


def test_eplb_is_refused_on_a_cpu_only_box_at_run() -> None:
    # ParallelConfig: "only supported on CUDA devices or ROCm devices or XPU devices".
    cell = Cell(knobs={"eplb": True, "expert_parallel": True, "data_parallel_size": "2"})
    found = vllm_box_refusals(cell, VLLM, CPU, {})
    assert len(found) == 1 and "only supported on CUDA devices" in found[0][1], found
    assert vllm_box_refusals(cell, VLLM, H100, {}) == []


def test_max_model_len_within_the_models_context() -> None:
    # _get_and_verify_max_len: "is greater than the derived max_model_len".
    config = {"max_position_embeddings": 4096}
    found = vllm_model_refusals(Cell(knobs={"max_model_len": "4097"}), VLLM, config)
    assert len(found) == 1 and "derived max_model_len" in found[0][1], found
    assert vllm_model_refusals(Cell(knobs={"max_model_len": "4096"}), VLLM, config) == []
    allow = Cell(knobs={"max_model_len": "8192"}, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert vllm_model_refusals(allow, VLLM, config) == []
    assert vllm_model_refusals(Cell(knobs={"max_model_len": "8192"}), VLLM, {}) == []


def test_model_max_len_reads_vllms_keys_and_rope_scaling() -> None:
    assert model_max_len({"max_position_embeddings": 4096}) == (4096, "max_position_embeddings")
    assert model_max_len({"max_position_embeddings": 4096, "seq_length": 2048}) == (
        2048,
        "seq_length",
    )
    # YaRN's max_position_embeddings is already scaled; a linear factor is applied.
    yarn = {"max_position_embeddings": 163840, "rope_scaling": {"type": "yarn", "factor": 40}}
    assert model_max_len(yarn) == (163840, "max_position_embeddings")
    linear = {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2}}
    assert model_max_len(linear) == (8192, "max_position_embeddings")
    assert model_max_len({"hidden_size": 8}) is None
    assert model_max_len({"text_config": {"max_position_embeddings": 8}}) is None


@pytest.mark.parametrize(
    ("setting", "words"),
    [('{"method": "ngram", "bogus": 1, "num_speculative_tokens": 2}', "no field bogus"),
     ('{"method": "ngram"}', "num_speculative_tokens must be provided"),
     ("{}", "num_speculative_tokens must be provided"),
     ('{"num_speculative_tokens": 2}', "without speculative model"),
     ('{"method": "ngram", "num_speculative_tokens": 2, "tensor_parallel_size": 2}',
      "draft_tensor_parallel_size")],
)  # fmt: skip
def test_speculative_config_is_one_vllm_can_build(setting: str, words: str) -> None:
    refused = _refused({**LANE_KNOBS, "speculative_config": setting}, LANE)
    assert len(refused) == 1 and words in refused[0], refused


def test_speculative_config_left_to_the_boot_where_the_draft_decides() -> None:
    # MTP takes n_predict from the model's num_nextn_predict_layers: the boot reads it.
    ngram = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    for setting in ('{"method": "mtp"}', '{"method": "deepseek_mtp"}',
                    '{"method": "eagle", "model": "/d"}', ngram):  # fmt: skip
        assert _refused({**LANE_KNOBS, "speculative_config": setting}, LANE) == []


def test_raw_arguments_and_other_runtimes_are_left_alone() -> None:
    assert _refused({"eplb": True}, args=["--enable-expert-parallel", "-tp", "2"]) == []
    assert _refused({"eplb": True}, args=["--max_num_seqs=4"]) == []
    assert (
        vllm_cell_refusals(Cell(knobs={"model": "/m", "max_running_requests": "4"}), SGLANG) == []
    )


def test_parse_vllm_gpus_reads_nvidia_smi() -> None:
    text = "81559, NVIDIA H100 80GB HBM3\n81559, NVIDIA H100 80GB HBM3\n"
    assert parse_vllm_gpus(text) == [(81559.0, "NVIDIA H100 80GB HBM3")] * 2
    assert parse_vllm_gpus("") == []
    assert parse_vllm_gpus("[N/A], NVIDIA H100\n") is None


def _card(folder: Path, knobs: dict[str, Any], env: dict[str, str] | None = None) -> Path:
    """vllm-moe.yaml with a cell ``only`` of ``knobs`` beside its control, on the local box."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    card = yaml.safe_load((REPO / "campaigns" / "vllm-moe.yaml").read_text(encoding="utf-8"))
    card["cells"] = {"nocache": {"knobs": {"enforce_eager": True}},
                     "only": {"knobs": knobs, **({"env": env} if env else {})}}  # fmt: skip
    card["control"] = "nocache"
    card["gates"] = [{"kind": "better", "metric": "decode_tok_s"}]
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(card), encoding="utf-8")
    return path


def test_validate_refuses_between_knobs_and_against_a_local_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}), "utf-8")
    card = _card(tmp_path, {"model": str(model), "eplb": True, "max_num_seqs": "100000"})
    with pytest.raises(CardError) as caught:
        load_card(card)
    lines = caught.value.lines()
    for words in ("cells.only.knobs.eplb: vLLM refuses EPLB without expert parallelism",
                  "cells.only.knobs.max_num_seqs: vLLM refuses max_num_seqs 100000",
                  "cells.only.knobs.max_model_len: vLLM refuses max_model_len 2048 past the "
                  "model's max_position_embeddings 1024"):  # fmt: skip
        assert any(words in line for line in lines), lines
    assert len(lines) == 4, lines  # EPLB on one rank too


def test_run_refuses_what_the_box_decides_before_any_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    loaded = load_card(_card(tmp_path, {"max_num_seqs": "4096", "enforce_eager": True}, env))
    bare = tmp_path / "bare"
    bare.mkdir()
    monkeypatch.setenv("PATH", f"{bare}:/usr/bin:/bin")
    if any((Path(d) / "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has an nvidia-smi of its own")
    # The local box says linux-cpu and nvidia-smi reads no GPU: vLLM's CPU build.
    with pytest.raises(BadInput) as caught:
        check_engine_inputs(loaded)
    text = str(caught.value)
    for words in ("cells.only.knobs.max_num_seqs: vLLM refuses max_num_seqs 4096 over its "
                  "token budget 2048", "cells.only.env.VLLM_USE_V2_MODEL_RUNNER",
                  "Model Runner V2 requires Triton", "box local"):  # fmt: skip
        assert words in text, text
    smi = bare / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '81559, NVIDIA H100 80GB HBM3'\n", encoding="utf-8")
    smi.chmod(0o755)
    check_engine_inputs(loaded)  # an H100's default budget is 8192, and it may run CUDA's build
    assert os.environ["PATH"].startswith(str(bare))
