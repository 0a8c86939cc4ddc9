"""SGLang's own Paged Experts check judges what `harness validate` refuses of a Paged Experts cell.

SGLang 0.5.23 refuses a Paged Experts server it cannot run when it builds the first MoE layer
(``srt/layers/moe/paged_experts/method.py``, ``check_paged_experts_compat``: more than one GPU,
EPLB, speculative decoding, fewer resident experts than the router's top-k, fused shared
experts), after the weights began loading on a GPU box. Whether a model's shared expert is
fused is decided before that (``srt/layers/moe/utils.py``, ``resolve_shared_experts_config``, by
the model class's ``shared_experts_fusion_disable_reason`` and ``num_fusable_shared_experts``:
``srt/models/deepseek_v2.py`` for DeepSeek-V3/R1). Those functions are taken from the released
wheel unchanged (read at run time, nothing of theirs copied here) and run on each cell of a card
that sets every combination of the knobs and arguments they judge, for a DeepSeek-V3-shaped and
a Qwen3-MoE-shaped model. Stand-ins, for what a CPU has not: the server's runtime context (read
from the cell's knobs and arguments), an H100's compute capability (9.0), unquantized experts,
and CUDA-graph backends that pass (no knob of the profile sets them).
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import textwrap
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.card import load_card
from harness.errors import CardError
from tests.conftest import REPO
from tests.engines.test_sglang_conformance import _wheel

pytestmark = pytest.mark.slow

CARD = REPO / "campaigns" / "sglang-kt-placement.yaml"

# The two model shapes: DeepSeek-V3's (its shared expert fused by default) and Qwen3-MoE's (no
# shared expert), each routing 8 experts per token.
MODELS = {
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
    },
    "qwen3-moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "num_experts": 128,
        "num_experts_per_tok": 8,
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


def _function(source: str, name: str, within: str | None = None) -> str:
    """The source of function ``name`` (in class ``within``), as the release has it."""
    body = ast.parse(source).body
    if within is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == within).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])  # with its decorators
    lines = source.splitlines()[first - 1 : node.end_lineno]
    return textwrap.dedent("\n".join(lines)) + "\n"


def _class_attribute(source: str, within: str, name: str) -> Any:
    cls = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == within
    )
    node = next(
        n
        for n in cls.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name for t in n.targets)
    )
    return ast.literal_eval(node.value)


class _SglangJudge:
    """SGLang's Paged Experts check and shared-expert resolution, from the wheel."""

    def __init__(self) -> None:
        with zipfile.ZipFile(_wheel()) as wheel:
            read = {
                name: wheel.read(f"sglang/srt/{name}").decode()
                for name in (
                    "layers/moe/paged_experts/method.py",
                    "layers/moe/utils.py",
                    "models/deepseek_v2.py",
                    "models/deepseek_common/utils.py",
                    "models/qwen3_moe.py",
                )
            }
        self.space: dict[str, Any] = {}
        for path, name in (
            ("layers/moe/paged_experts/method.py", "check_paged_experts_compat"),
            ("layers/moe/paged_experts/method.py", "_router_top_k"),
            ("layers/moe/utils.py", "resolve_shared_experts_config"),
            ("models/deepseek_common/utils.py", "quant_blocks_shared_experts_fusion"),
        ):
            exec(_function(read[path], name), self.space)
        deepseek = read["models/deepseek_v2.py"]
        methods = {
            name: _function(deepseek, name, "DeepseekV2ForCausalLM")
            for name in ("shared_experts_fusion_disable_reason", "num_fusable_shared_experts")
        }
        architecture = _class_attribute(
            deepseek, "DeepseekV2ForCausalLM", "fused_shared_experts_architecture"
        )
        body = "\n".join(textwrap.indent(code, "    ") for code in methods.values())
        exec(
            f"class DeepseekV2ForCausalLM:\n    fused_shared_experts_architecture = "
            f"{architecture!r}\n{body}",
            self.space,
        )
        # Qwen3-MoE's model class declares neither hook, so SGLang fuses nothing for it.
        qwen = read["models/qwen3_moe.py"]
        assert "num_fusable_shared_experts" not in qwen
        assert "shared_experts_fusion_disable_reason" not in qwen
        self.model_classes = {
            "deepseek-v3": self.space["DeepseekV2ForCausalLM"],
            "qwen3-moe": type("Qwen3MoeForCausalLM", (), {}),
        }

    def refusal(self, model: str, cell: dict[str, Any]) -> str | None:
        """SGLang's RuntimeError for the cell's server on ``model`` (None: it runs)."""
        knobs, args = cell["knobs"], cell.get("args", [])
        sizes = {"tp_size": int(knobs.get("tp_size", 1)), "ep_size": 1, "pp_size": 1}
        parallel = types.SimpleNamespace(**sizes, dp_size=1, moe_ep_size=1)
        resident = knobs.get("paged_experts_num_resident")
        moe = types.SimpleNamespace(
            enable_eplb=bool(knobs.get("enable_eplb")),
            paged_experts_num_resident=int(resident) if resident else None,
            enable_fused_moe_sum_all_reduce=False,
            disable_shared_experts_fusion=bool(knobs.get("disable_shared_experts_fusion")),
            enforce_shared_experts_fusion=False,
            enable_waterfill=False,
        )
        algorithm = args[args.index("--speculative-algorithm") + 1] if args else None
        config = _attributes(MODELS[model])
        stand_ins = {
            "get_parallel": lambda: parallel,
            "get_exec": lambda: types.SimpleNamespace(moe=moe),
            "get_spec": lambda: types.SimpleNamespace(speculative_algorithm=algorithm),
            "get_model": lambda: types.SimpleNamespace(load_format="auto"),
            "process_model_config": lambda: types.SimpleNamespace(hf_text_config=config),
            "check_cuda_graph_backend": lambda phase, backend: True,
            "Phase": types.SimpleNamespace(PREFILL="prefill", DECODE="decode"),
            "Backend": types.SimpleNamespace(BREAKABLE="b", DISABLED="d", FULL="f"),
            "FORMATS": [],
            "SharedExpertsConfig": types.SimpleNamespace,
            "log_info_on_rank0": lambda logger, message: None,
            "logger": None,
            "is_sm90_supported": lambda: True,
            "get_moe_runner_backend": lambda: types.SimpleNamespace(is_marlin=lambda: False),
            "is_sbo_enabled": lambda: False,
            "is_tbo_enabled": lambda: False,
            "is_deepep_class_backend": lambda: False,  # moe_a2a_backend none
            "is_wint4afp8_or_wint4a16_config": lambda quant: False,
            "_is_cuda": True,
            "_is_hip": False,
            "_is_musa": False,
            "torch": types.SimpleNamespace(
                cuda=types.SimpleNamespace(get_device_capability=lambda *a: (9, 0))
            ),
        }
        self.space.update(stand_ins)
        shared = self.space["resolve_shared_experts_config"](
            self.model_classes[model], config, None
        )
        layer = types.SimpleNamespace(
            top_k=config.num_experts_per_tok,
            quant_method=object(),
            num_fused_shared_experts=shared.num_fused_shared_experts,
        )
        try:
            self.space["check_paged_experts_compat"](layer, object())
        except RuntimeError as exc:
            return str(exc)
        return None


def _attributes(value: Any) -> Any:
    """A config.json as the attributes of an HF config object."""
    if isinstance(value, dict):
        return types.SimpleNamespace(**{k: _attributes(v) for k, v in value.items()})
    return value


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


def test_validate_refuses_exactly_the_paged_experts_cells_sglang_refuses(tmp_path: Path) -> None:
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
    judge = _SglangJudge()
    verdicts = {name: judge.refusal(model, cell) for name, (model, cell) in cells.items()}
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
    for name in sglang_refuses:
        theirs = verdicts[name]
        assert theirs is not None
        for their_words, our_words in reasons.items():
            assert (their_words in theirs) == any(our_words in p for p in refused[name]), (
                name,
                theirs,
                refused[name],
            )
