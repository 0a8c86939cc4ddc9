"""SGLang's all-to-all and attention backends: what its releases refuse at boot, refused first.

Each rule is SGLang 0.5.23's (``srt/arg_groups/moe_hook.py``) or sglang-kt 0.7.2's
(``server_args.py``), read from the released wheels; tests/engines/test_sglang_parsers.py runs
the releases' own validation over every cell the profiles can send and asserts agreement.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness.card import Cell, load_card, load_runtime_profile
from harness.card.sglang_checks import GpuFacts, sglang_cell_refusals, sglang_model_refusals
from harness.errors import BadInput, CardError
from harness.execute.engine_inputs import check_engine_inputs, parse_gpu_facts
from tests.conftest import REPO

SGLANG = load_runtime_profile(REPO / "campaigns" / "runtimes" / "sglang.yaml")
SGLANG_KT = load_runtime_profile(REPO / "campaigns" / "runtimes" / "sglang-kt.yaml")
H100 = GpuFacts((9, 0), 81559)
B200 = GpuFacts((10, 0), 183359)
RTX5090 = GpuFacts((12, 0), 32607)
QWEN3 = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts_per_tok": 8}


def _refusals(knobs: dict[str, Any], gpu: GpuFacts | None = None, **cell: Any) -> list[str]:
    found = sglang_cell_refusals(Cell(knobs={"model": "/m", **knobs}, **cell), SGLANG, gpu)
    return [f"{knob}: {problem}" for knob, problem in found]


def _card(folder: Path, knobs: str, model: str = "/models/Qwen3-30B-A3B") -> Path:
    """A card on the sglang profile and the local box: a plain control and a cell ``only`` with
    ``knobs`` (YAML lines)."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    text = (
        "campaign: a2a\nbox: local\nruntime: sglang\n"
        "prompts: {pools: [prompts/mixed.jsonl], fit: {split: fit}, heldout: {split: heldout}}\n"
        "workload: {max_tokens: 8, concurrency: 1, phases: [{name: agent, domains: [agent], "
        "requests: 2}]}\n"
        f"control: base\ncells:\n  base:\n    knobs: {{model: {model}}}\n"
        f"  only:\n    knobs:\n      model: {model}\n{knobs}"
        "gates: [{kind: better, metric: decode_tok_s}]\n"
    )
    (folder / "card.yaml").write_text(text, encoding="utf-8")
    return folder / "card.yaml"


def _lines(card: Path) -> list[str]:
    with pytest.raises(CardError) as caught:
        load_card(card)
    return caught.value.lines()


@pytest.mark.parametrize("backend", ["flashinfer", "flashinfer_megamoe"])
def test_flashinfer_backends_need_attention_dp_across_the_whole_tp_group(backend: str) -> None:
    # handle_a2a_moe asserts attn_dp_size > 1 and equal to tp_size for both.
    for knobs in ({"tp_size": "2"}, {"tp_size": "4", "attn_dp_size": "2"}, {}):
        refused = _refusals({"moe_a2a_backend": backend, "chunked_prefill_size": "8192", **knobs})
        assert any("--attn-dp-size equal to --tp-size" in line for line in refused), refused
    fine = {"moe_a2a_backend": backend, "tp_size": "2", "attn_dp_size": "2"}
    assert _refusals({**fine, "chunked_prefill_size": "8192"}) == []


def test_flashinfer_needs_chunked_prefill() -> None:
    knobs = {"moe_a2a_backend": "flashinfer", "tp_size": "2", "attn_dp_size": "2"}
    refused = _refusals({**knobs, "chunked_prefill_size": "-1"})
    assert len(refused) == 1 and "without chunked prefill" in refused[0], refused


def test_pplx_needs_two_attention_dp_groups_and_its_budget_over_the_chunk() -> None:
    refused = _refusals({"moe_a2a_backend": "pplx", "chunked_prefill_size": "-1"})
    assert len(refused) == 1 and "--attn-dp-size 2 or more" in refused[0], refused
    knobs = {"moe_a2a_backend": "pplx", "tp_size": "2", "attn_dp_size": "2"}
    # 8192 split over two attention-DP groups is 4096 a rank, over pplx's default 128.
    refused = _refusals({**knobs, "chunked_prefill_size": "8192"})
    assert len(refused) == 1, refused
    for words in ("4096", "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK (128)",
                  "set pplx_num_max_dispatch_tokens_per_rank to 4096 or more"):  # fmt: skip
        assert words in refused[0], refused
    raised = {
        **knobs,
        "chunked_prefill_size": "8192",
        "pplx_num_max_dispatch_tokens_per_rank": "4096",
    }
    assert _refusals(raised) == []
    # The raw environment wins over the knob at boot, and is read so here.
    env = {"SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "4096"}
    assert _refusals({**knobs, "chunked_prefill_size": "8192"}, env=env) == []


def test_a_budget_against_an_unset_chunk_is_judged_on_the_boxs_gpu_only() -> None:
    # Unset, SGLang picks the chunk from the GPU's memory (8192 on an 80 GiB H100, 4096 on a
    # 40 GiB A100): validate cannot tell, `run` can.
    knobs = {"moe_a2a_backend": "mori", "tp_size": "2"}
    assert _refusals(knobs) == []
    refused = _refusals(knobs, H100)
    assert len(refused) == 1 and "8192 (SGLang's default on a GPU of" in refused[0], refused
    assert _refusals(knobs, GpuFacts((8, 0), 40960)) == []
    assert _refusals({**knobs, "attn_dp_size": "2"}, H100) == []  # 4096 a group


def test_mori_budget_against_an_explicit_chunk() -> None:
    knobs = {"moe_a2a_backend": "mori", "tp_size": "2", "chunked_prefill_size": "8192"}
    refused = _refusals(knobs)
    assert len(refused) == 1 and "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (4096)" in refused[0]
    assert _refusals({**knobs, "mori_num_max_dispatch_tokens_per_rank": "8192"}) == []
    assert _refusals({**knobs, "chunked_prefill_size": "-1"}) == []  # no chunk, no check


def test_deepep_v2_budget_holds_a_ranks_prefill_share_and_the_decode_graph() -> None:
    knobs = {"moe_a2a_backend": "deepep_v2", "tp_size": "2", "disable_cuda_graph": True}
    # 256 tokens scattered over two TP ranks: 128 each, within the default 128.
    assert _refusals({**knobs, "chunked_prefill_size": "256"}) == []
    refused = _refusals({**knobs, "chunked_prefill_size": "512"})
    assert len(refused) == 1 and "a rank's prefill dispatch, 256 tokens" in refused[0], refused
    # Chunked prefill off: max_prefill_tokens' 16384 is the ceiling.
    refused = _refusals({**knobs, "chunked_prefill_size": "-1"})
    assert len(refused) == 1 and "8192 tokens" in refused[0], refused
    # With CUDA graphs, the H100's default decode batch of 256 exceeds 128: judged at `run`.
    graphs = {"moe_a2a_backend": "deepep_v2", "tp_size": "2", "chunked_prefill_size": "256"}
    assert _refusals(graphs) == []
    refused = _refusals(graphs, H100)
    assert len(refused) == 1 and "decode CUDA graph's batch, 256" in refused[0], refused
    assert _refusals({**graphs, "max_running_requests": "64"}, H100) == []


def test_attention_dp_size_must_divide_tp_size() -> None:
    refused = _refusals({"attn_dp_size": "2"})
    assert len(refused) == 1 and refused[0].startswith("attn_dp_size: ") and "divide" in refused[0]
    assert _refusals({"attn_dp_size": "2", "tp_size": "4"}) == []


def test_a_cell_passing_a_deciding_argument_raw_is_left_to_the_engine() -> None:
    assert _refusals({"moe_a2a_backend": "pplx"}, args=["--attn-dp-size", "2"]) == []


def test_flashinfer_megamoe_takes_only_fp4_or_mxfp8_checkpoints_of_its_architectures() -> None:
    def refused(config: dict[str, Any], quant_file: bool = False) -> list[tuple[str, str]]:
        cell = Cell(knobs={"model": "/m", "moe_a2a_backend": "flashinfer_megamoe"})
        return sglang_model_refusals(cell, SGLANG, config, quant_file)

    (found,) = refused(QWEN3)
    assert found[0] == "moe_a2a_backend" and "unquantized" in found[1], found
    (found,) = refused({**QWEN3, "quantization_config": {"quant_method": "fp8"}})
    assert "of fp8 quantization" in found[1], found
    assert refused({**QWEN3, "quantization_config": {"quant_method": "mxfp8"}}) == []
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    assert refused({**QWEN3, "quantization_config": nvfp4}) == []
    assert refused(QWEN3, quant_file=True) == []  # ModelOpt's hf_quant_config.json: the engine
    (found,) = refused({"architectures": ["MixtralForCausalLM"]})
    assert "validated only for" in found[1], found
    assert refused({}) == []  # no config.json to judge by


def test_deepep_v2_and_flashinfer_refusals_of_the_model() -> None:
    def refused(backend: str, config: dict[str, Any]) -> list[tuple[str, str]]:
        cell = Cell(knobs={"model": "/m", "moe_a2a_backend": backend})
        return sglang_model_refusals(cell, SGLANG, config, False)

    assert refused("deepep_v2", QWEN3) == []
    (found,) = refused("deepep_v2", {"architectures": ["MixtralForCausalLM"]})
    assert "only DeepseekV3ForCausalLM" in found[1], found
    # An unquantized Qwen3-MoE leaves the runner on auto, which FlashInfer's all-to-all refuses.
    (found,) = refused("flashinfer", QWEN3)
    assert "no moe_runner_backend knob" in found[1], found
    assert refused("flashinfer", {**QWEN3, "quantization_config": {"quant_method": "mxfp8"}}) == []


def test_validate_refuses_what_the_cells_knobs_and_local_model_decide(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3), encoding="utf-8")
    knobs = '      moe_a2a_backend: flashinfer_megamoe\n      tp_size: "2"\n'
    lines = _lines(_card(tmp_path, knobs, str(model)))
    assert any("knobs.moe_a2a_backend" in line and "--attn-dp-size" in line for line in lines)
    assert any("knobs.moe_a2a_backend" in line and "unquantized" in line for line in lines)
    assert len(lines) == 2, lines


def test_parse_gpu_facts_reads_nvidia_smi() -> None:
    assert parse_gpu_facts("9.0, 81559\n9.0, 81000\n") == GpuFacts((9, 0), 81000)
    assert parse_gpu_facts("12.0, 32607\n") == GpuFacts((12, 0), 32607)
    assert parse_gpu_facts("") is None
    assert parse_gpu_facts("9.0, [N/A]\n") is None


@pytest.mark.parametrize(
    ("backend", "gpu", "refused"),
    [("trtllm_mha", H100, True), ("trtllm_mha", B200, False),
     ("trtllm_mha", RTX5090, True), ("trtllm_mla", RTX5090, False),
     ("trtllm_mla", H100, True), ("flashinfer", H100, False)],
)  # fmt: skip
def test_trtllm_attention_is_refused_off_blackwell(
    backend: str, gpu: GpuFacts, refused: bool
) -> None:
    # sglang-kt 0.7.2: trtllm_mha on SM100 (major 10) only, trtllm_mla on majors 10 to 12.
    cell = Cell(knobs={"model": "/m", "kt_weight_path": "/w", "attention_backend": backend})
    found = sglang_cell_refusals(cell, SGLANG_KT, gpu)
    assert bool(found) == refused, found
    assert sglang_cell_refusals(cell, SGLANG_KT, None) == []  # validate cannot see the GPU


def _kt_card(folder: Path, backend: str) -> Path:
    card = REPO / "campaigns" / "sglang-kt-placement.yaml"
    for name in ("prompts", "maps"):
        (folder / name).symlink_to(REPO / "campaigns" / name)
    text = card.read_text(encoding="utf-8").replace(
        "      model: /models/Qwen3-30B-A3B\n",
        f"      model: /models/Qwen3-30B-A3B\n      attention_backend: {backend}\n",
        1,
    )
    (folder / "card.yaml").write_text(text, encoding="utf-8")
    return folder / "card.yaml"


def test_run_refuses_trtllm_attention_on_the_boxs_gpu_before_any_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_card(_kt_card(tmp_path, "trtllm_mha"))
    # No nvidia-smi on the box: nothing said, the engine refuses at boot.
    bare = tmp_path / "bare"
    bare.mkdir()
    monkeypatch.setenv("PATH", f"{bare}:/usr/bin:/bin")
    if any((Path(d) / "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has an nvidia-smi of its own")
    check_engine_inputs(loaded)
    smi = bare / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '9.0, 81559'\necho '9.0, 81559'\n", encoding="utf-8")
    smi.chmod(0o755)
    with pytest.raises(BadInput) as caught:
        check_engine_inputs(loaded)
    text = str(caught.value)
    for words in ("cells.uniform.knobs.attention_backend", "trtllm_mha", "SM100",
                  "compute capability 9.0", "box local"):  # fmt: skip
        assert words in text, text
    assert os.environ["PATH"].startswith(str(bare))
