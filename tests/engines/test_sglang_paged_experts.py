"""SGLang's own Paged Experts check judges what `harness validate` refuses of a Paged Experts cell.

SGLang 0.5.23 refuses a Paged Experts server it cannot run when it builds the first MoE layer
(``srt/layers/moe/paged_experts/method.py``, ``check_paged_experts_compat``: more than one GPU,
EPLB, speculative decoding, fewer resident experts than the router's top-k, fused shared
experts), after the weights began loading on a GPU box. Whether a model's shared expert is
fused is decided before that (``srt/layers/moe/utils.py``, ``resolve_shared_experts_config``, by
the model class's ``shared_experts_fusion_disable_reason`` and ``num_fusable_shared_experts``:
``srt/models/deepseek_v2.py`` for DeepSeek-V3/R1).

A card sets every combination of the knobs and arguments they judge, for a DeepSeek-V3-shaped
and a Qwen3-MoE-shaped model. Each cell's command line, built by harness's own ``boot_spec``,
is judged in one process by the release installed whole (``tests/engines/sglang_site.py``, in
vLLM's venv) as a server judges it: its parser and argument resolution (``prepare_server_args``,
``ServerArgs.resolve_once``, ``check_server_args``; some cells are refused there already), the
arguments published for the scheduler of rank 0 (``runtime_context.publish``), SGLang's
``ModelConfig`` of the model's config.json, the model class from its registry, its shared-expert
resolution, and ``check_paged_experts_compat`` imported whole. Stood in: what
``sglang_site.py`` stands in for (``sgl_kernel``, ``torchvision``, the GPU: an H100), and the
MoE layer the check is handed (what a ``FusedMoE`` would hold: the router's top-k, the shared
experts resolution fused into it, an unquantized method and its expert format), because
building one allocates its weights on the GPU.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.card import load_card, load_runtime_profile
from harness.errors import CardError
from tests.conftest import REPO
from tests.engines.sglang_site import STAND_INS, gpu_env
from tests.engines.sglang_site import site as engine_site
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture
from tests.engines.test_sglang_conformance import _wheel
from tests.engines.test_sglang_parsers import _argv

pytestmark = pytest.mark.slow

CARD = REPO / "campaigns" / "sglang-kt-placement.yaml"

# The two model shapes: DeepSeek-V3's (its shared expert fused by default) and Qwen3-MoE's (no
# shared expert), each routing 8 experts per token; small otherwise (SGLang reads the config).
_SMALL = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
          "max_position_embeddings": 4096}  # fmt: skip
MODELS = {
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "n_group": 8,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        **_SMALL,
    },
    "qwen3-moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "head_dim": 16,
        **_SMALL,
    },
}
# What a cell can set of what the check judges (None: left unset).
SETTINGS = {
    "paged_experts_num_resident": [None, "4", "8"],
    "tp_size": [None, "2"],
    "enable_eplb": [None, True],
    "speculative": [False, True],
    "disable_shared_experts_fusion": [None, True],
}


# Runs in vLLM's venv: the stand-ins, then per cell (its command line, on stdin) the server's
# arguments parsed, resolved and checked as SGLang's launcher does, published for the scheduler
# of rank 0, the model's ModelConfig and class, its shared experts resolved, and the Paged
# Experts check run on the layer a FusedMoE of that model would be; the verdicts to a file.
RUN_CHECK = (
    STAND_INS
    + r"""
import json, logging

out_path = sys.argv[1]
from sglang.srt import runtime_context
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.moe.paged_experts.method import check_paged_experts_compat
from sglang.srt.layers.moe.utils import resolve_shared_experts_config
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.server_args import prepare_server_args

def judge(argv):
    try:
        args = prepare_server_args(argv)
        args.resolve_once()
        args.check_server_args()
    except BaseException as exc:
        return f"at its arguments: {type(exc).__name__}: {exc}"
    runtime_context.publish(args, role="scheduler",
                            ranks=runtime_context.SpawnRanks(world_rank=0, gpu_id=0))
    config = ModelConfig.from_server_args(args)
    model_class, _ = ModelRegistry.resolve_model_cls(config.hf_config.architectures)
    shared = resolve_shared_experts_config(model_class, config.hf_config, None)
    # The layer a FusedMoE of this model holds (stood in: building one allocates on the GPU).
    layer = types.SimpleNamespace(top_k=config.hf_text_config.num_experts_per_tok,
                                  quant_method=object(),
                                  num_fused_shared_experts=shared.num_fused_shared_experts)
    try:
        check_paged_experts_compat(layer, expert_format=object())  # unquantized: a format
    except RuntimeError as exc:
        return str(exc)
    return None

verdicts = [judge(argv) for argv in json.load(sys.stdin)]
logging.shutdown()
with open(out_path, "w", encoding="utf-8") as out:
    json.dump(verdicts, out)
os._exit(0)  # what SGLang registered to run at exit is for a server's shutdown, not this
"""
)


def _sglang_verdicts(python: str, cells: dict[str, Any], folder: Path) -> dict[str, str | None]:
    """SGLang's refusal of each cell's server (None: it builds its MoE layers)."""
    release = engine_site("sglang-0.5.23", [_wheel()], python)
    profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / "sglang.yaml")
    commands = [_argv(profile, cell) for _, cell in cells.values()]
    out = folder / "verdicts.json"
    done = subprocess.run(
        [python, "-c", RUN_CHECK, str(out)],
        input=json.dumps(commands), capture_output=True, text=True, timeout=900,
        env=gpu_env(folder, [release]), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(zip(cells, json.loads(out.read_text()), strict=True))


def _card(folder: Path) -> tuple[Path, dict[str, tuple[str, dict[str, Any]]]]:
    """A local-box sglang card whose cells set every combination of SETTINGS with Paged Experts
    on, on each model (a folder here with its config.json): (card, {cell: (model, cell)})."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    base = yaml.safe_load(CARD.read_text(encoding="utf-8"))
    cells: dict[str, tuple[str, dict[str, Any]]] = {}
    for model, config in MODELS.items():
        (folder / model).mkdir()
        (folder / model / "config.json").write_text(json.dumps(config), encoding="utf-8")
        for values in itertools.product(*SETTINGS.values()):
            chosen = dict(zip(SETTINGS, values, strict=True))
            knobs: dict[str, Any] = {"model": str(folder / model), "enable_paged_experts": True}
            knobs.update({k: v for k, v in chosen.items() if v is not None and k != "speculative"})
            if knobs.get("enable_eplb"):
                knobs["ep_size"] = "1"
            cell: dict[str, Any] = {"knobs": knobs}
            if chosen["speculative"]:
                cell["args"] = ["--speculative-algorithm", "EAGLE"]
            cells[f"c{len(cells)}"] = (model, cell)
    text = {**base, "runtime": "sglang", "control": "c0"}
    text["cells"] = {name: cell for name, (_, cell) in cells.items()}
    card = folder / "card.yaml"
    card.write_text(yaml.safe_dump(text), encoding="utf-8")
    return card, cells


def test_validate_refuses_exactly_the_paged_experts_cells_sglang_refuses(
    torch_python: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    # The recorder the sglang profile drives refuses EPLB on its own rule (it would reset the
    # recorder): that refusal is not Paged Experts', so it is read apart.
    card, cells = _card(tmp_path)
    with pytest.raises(CardError) as caught:
        load_card(card)
    refused: dict[str, list[str]] = {}
    for line in caught.value.lines():
        found = re.search(r": cells\.(c\d+)\.knobs\.(\w+): (.*)", line)
        assert found, line
        if found.group(2) == "enable_eplb" and "EPLB shares" in found.group(3):
            continue
        refused.setdefault(found.group(1), []).append(found.group(3))
    verdicts = _sglang_verdicts(torch_python, cells, tmp_path)
    sglang_refuses = {name for name, why in verdicts.items() if why is not None}
    assert 0 < len(sglang_refuses) < len(cells)
    assert set(refused) == sglang_refuses, {
        "validate only": {n: refused[n] for n in sorted(set(refused) - sglang_refuses)},
        "SGLang only": {n: verdicts[n] for n in sorted(sglang_refuses - set(refused))},
    }
    # Each of SGLang's reasons is one of validate's, cell by cell.
    reasons = {
        "must be at least the router's top-k": "fewer than the model's router top-k",
        "speculative decoding is not supported": "speculative decoding",
        "fused shared experts are not supported": "disable_shared_experts_fusion: true",
        "--tp-size must be 1": "tp_size > 1",
        "--enable-eplb is not supported": "refuses it with enable_eplb",
        "--paged-experts-num-resident is required": "needs paged_experts_num_resident",
    }
    # EPLB needs expert parallelism, which Paged Experts refuses: SGLang's argument resolution
    # refuses those cells first (it asserts ep_size > 1), before any layer is built.
    at_arguments = {n for n in sglang_refuses if str(verdicts[n]).startswith("at its arguments")}
    assert all(cells[n][1]["knobs"].get("enable_eplb") for n in at_arguments), {
        n: verdicts[n] for n in at_arguments
    }
    assert all(any("with enable_eplb" in p for p in refused[n]) for n in at_arguments)
    for name in sglang_refuses - at_arguments:
        theirs = verdicts[name]
        assert theirs is not None
        for their_words, our_words in reasons.items():
            assert (their_words in theirs) == any(our_words in p for p in refused[name]), (
                name,
                theirs,
                refused[name],
            )
