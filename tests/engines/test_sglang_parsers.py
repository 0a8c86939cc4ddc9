"""SGLang's own server-argument parser and validation judge what `harness validate` refuses.

For each profile that boots SGLang (``sglang`` and ``sglang-eplb`` on SGLang 0.5.23,
``sglang-kt`` on KTransformers' build, sglang-kt 0.7.2), every knob value a card can give and
the pairs the engine's validation relates are cells of one card. `harness validate`
(``load_card``) judges the card; each cell's command line is built by harness's own
``boot_spec``, and the release judges it as ``python -m sglang.launch_server`` does before it
touches a GPU:

- 0.5.23: ``sglang.srt.server_args.prepare_server_args(argv)`` (its argparse parser and
  ``ServerArgs``), ``ServerArgs.resolve_once()`` (the resolution pipeline of
  ``srt/arg_groups/``, every hook and validator, with the model's config.json read), then
  ``check_server_args()``, as ``launch_server.run_server`` and ``entrypoints/engine.py`` call them.
- 0.7.2: ``prepare_server_args(argv)`` (its ``ServerArgs.__post_init__`` resolves and validates),
  then ``check_server_args()`` (``entrypoints/engine.py``, ``_launch_subprocesses``).

The released wheels are installed whole, as shipped (``pip install --no-deps --target``, one
folder per release in the harness cache, made once), with the pure-Python modules their import
needs and vLLM's venv lacks (orjson, IPython, traitlets, gguf, nvidia-ml-py), and run in vLLM's
venv (python 3.11, CPU torch, transformers 5.19), one subprocess per release for all cells.

Stood in, because they cannot load on a CPU:

- ``sgl_kernel`` (SGLang's CUDA kernels; its PyPI build needs a GPU to load): an empty package
  whose names are placeholders, and ``torch.library.register_fake`` skips the ``sgl_kernel::``
  ops SGLang registers fake kernels for (the extension would have defined them). Nothing here
  calls a kernel.
- ``torchvision``: the only build on the index links ``libc10_cuda`` and fails to load against
  CPU torch. SGLang's multimodal config modules import its transforms at import time; nothing
  that resolves arguments calls them. transformers is told (before the stand-in goes in) that
  torchvision is absent, as on any machine without it.
- The GPU: CUDA reported available, eight H100s (compute capability 9.0, 80 GiB), and an
  ``nvidia-smi`` on PATH that prints their memory (sglang-kt reads it at ``__post_init__``, and
  0.5.23 picks the chunked prefill size and decode CUDA-graph batch from it). Every cell runs on
  the same stand-in box, so a refusal that depends on the GPU is judged as on an H100 box; what
  harness refuses of such a cell it refuses at `run`, from the box's ``nvidia-smi`` before a boot
  (harness/execute/engine_inputs.py), and is judged here by the same function on the stand-in's
  reading.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.card import Cell, load_runtime_profile
from harness.card.sglang_checks import sglang_cell_refusals
from harness.execute.engine_inputs import parse_gpu_facts
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import BootSpec, boot_spec
from tests.conftest import REPO
from tests.engines.sglang_site import STAND_INS, gpu_env
from tests.engines.sglang_site import site as engine_site
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture
from tests.engines.test_sglang_conformance import _kt_wheel, _wheel
from tests.engines.validate_cells import validate_refusals

pytestmark = pytest.mark.slow

CARD = REPO / "campaigns" / "sglang-kt-placement.yaml"
FREQUENCY_FILE = REPO / "campaigns" / "maps" / "kt-frequency-refbox.pt"
# A Qwen3-MoE-shaped model's config.json, what resolution reads of the model: 8 layers of 64
# experts, the shape the shipped KT frequency file was fitted for.
MODEL_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_hidden_layers": 8,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}

# A pattern knob's values: a representative valid one and its boundaries the pattern admits.
PATTERN_VALUES = {
    "tp_size": ["1", "2"],
    "ep_size": ["1", "2"],
    "mem_fraction_static": ["0.85", ".1"],
    "context_length": ["4096", "1"],
    "chunked_prefill_size": ["8192", "-1"],
    "max_running_requests": ["64", "1"],
    "expert_distribution_recorder_buffer_size": ["-1", "1"],
    "eplb_algorithm": ["auto", "deepseek", "zz"],
    "eplb_rebalance_num_iterations": ["1000", "1"],
    "eplb_rebalance_layers_per_chunk": ["1", "4"],
    "eplb_min_rebalancing_utilization_threshold": ["0.5", "0", "1.0"],
    "ep_num_redundant_experts": ["0", "16"],
    "paged_experts_num_resident": ["8", "1"],
    "moe_a2a_backend": ["none", "deepep", "zz"],
    "kt_method": ["AMXINT4", "AMXINT8", "ZZ"],
    "kt_cpuinfer": ["32", "1"],
    "kt_threadpool_count": ["2", "1"],
    "kt_num_gpu_experts": ["8", "0"],
    "kt_gpu_experts_ratio": ["0.5", "0", "1"],
    "kt_gpu_prefill_token_threshold": ["512", "0"],
    "kt_max_deferred_experts_per_token": ["2", "0"],
    "attention_backend": ["flashinfer", "triton", "zz"],
    "attn_dp_size": ["1", "2"],
    "mori_num_max_dispatch_tokens_per_rank": ["8192", "1"],
    "pplx_num_max_dispatch_tokens_per_rank": ["8192", "1"],
    "deepep_v2_num_max_dispatch_tokens_per_rank": ["8192", "1"],
}
# The stand-in GPU as `nvidia-smi --query-gpu=compute_cap,memory.total` reads it on a box: the
# eight H100s the fake nvidia-smi of tests/engines/sglang_site.py prints the memory of.
STAND_IN_GPU = parse_gpu_facts("9.0, 81559\n" * 8)
# Knobs every cell sets (not varied): where the model and KT's CPU weights are.
FIXED = ("python", "model", "kt_weight_path")

# The pairs the engines' validation relates (0.5.23: srt/arg_groups/parallel_hook.py
# handle_eplb_and_dispatch, moe_hook.py handle_a2a_moe; paged experts, method.py; 0.7.2: its
# server_args.py _handle_eplb_and_dispatch, _handle_a2a_moe and the kt_* handling), as knob
# grids crossed in full.
PAIRS: dict[str, list[dict[str, list[Any]]]] = {
    "sglang": [
        {"ep_dispatch_algorithm": ["static", "dynamic", "fake", "lp"],
         "moe_a2a_backend": ["none", "deepep", "zz"], "ep_size": ["1", "2"]},
        {"moe_a2a_backend": ["deepep"], "tp_size": ["1", "2"], "ep_size": ["1", "2"]},
        {"enable_paged_experts": [True], "paged_experts_num_resident": [None, "8"],
         "tp_size": ["1", "2"], "ep_size": ["1", "2"]},
        {"enable_paged_experts": [True], "paged_experts_num_resident": ["8"],
         "disable_shared_experts_fusion": [True], "disable_cuda_graph": [True]},
        {"expert_distribution_recorder_mode": ["stat", "per_pass", "per_token", "stat_approx"],
         "expert_balancedness_report_mode": ["off", "both"]},
        {"ep_num_redundant_experts": ["0", "16"], "ep_size": ["1", "2"]},
        {"return_routed_experts": [True], "disable_radix_cache": [True, False]},
        # The all-to-all backends' needs (moe_hook.py, handle_a2a_moe and the token budgets):
        # attention DP against TP, and each dispatch budget against the chunked prefill.
        {"moe_a2a_backend": ["none", "flashinfer", "pplx", "flashinfer_megamoe", "mori",
                             "deepep_v2"],
         "attn_dp_size": ["1", "2"], "tp_size": ["1", "2"]},
        {"moe_a2a_backend": ["mori"], "tp_size": ["2"], "attn_dp_size": ["1", "2"],
         "chunked_prefill_size": [None, "4096", "8192", "-1"],
         "mori_num_max_dispatch_tokens_per_rank": [None, "8192"]},
        {"moe_a2a_backend": ["pplx"], "tp_size": ["2"], "attn_dp_size": ["2"],
         "chunked_prefill_size": [None, "256", "-1"],
         "pplx_num_max_dispatch_tokens_per_rank": [None, "8192"]},
        {"moe_a2a_backend": ["flashinfer"], "tp_size": ["2"], "attn_dp_size": ["2"],
         "chunked_prefill_size": [None, "-1"]},
        {"moe_a2a_backend": ["deepep_v2"], "tp_size": ["2"], "attn_dp_size": ["1", "2"],
         "chunked_prefill_size": [None, "256", "-1"],
         "deepep_v2_num_max_dispatch_tokens_per_rank": [None, "256", "16384"],
         "disable_cuda_graph": [None, True], "max_running_requests": [None, "64"]},
    ],
    "sglang-eplb": [
        {"enable_eplb": [True, False], "ep_size": ["1", "2"], "tp_size": ["1", "2"]},
        {"enable_eplb": [True], "ep_size": ["2"], "tp_size": ["2"],
         "ep_dispatch_algorithm": ["static", "dynamic", "fake", "lp"],
         "moe_a2a_backend": ["none", "deepep"]},
        {"enable_eplb": [True], "ep_size": ["2"], "tp_size": ["2"],
         "ep_num_redundant_experts": ["0", "16"], "eplb_algorithm": ["auto", "deepseek"]},
        {"enable_eplb": [True], "ep_size": ["2"], "tp_size": ["2"],
         "eplb_rebalance_layers_per_chunk": ["1"],
         "eplb_min_rebalancing_utilization_threshold": ["0", "0.5"]},
    ],
    "sglang-kt": [
        {"kt_expert_placement_strategy": ["uniform", "frequency", "front-loading", "random"],
         "kt_enable_dynamic_expert_update": [True, False]},
        {"kt_num_gpu_experts": ["0", "8", "16"], "kt_gpu_experts_ratio": [None, "0.5"]},
        {"kt_gpu_prefill_token_threshold": ["0", "512"],
         "kt_max_deferred_experts_per_token": ["0", "2"]},
        {"tp_size": ["1", "2"], "kt_num_gpu_experts": ["8"], "kt_method": ["AMXINT4", "MXFP4"]},
        {"record_kt_gpu_expert_distribution": [True, False],
         "expert_distribution_recorder_buffer_size": ["-1", "1000"]},
    ],
}  # fmt: skip
# Whole-cell extras: speculative decoding (an argument, no knob) against Paged Experts.
EXTRA_CELLS: dict[str, list[dict[str, Any]]] = {
    "sglang": [
        {"knobs": {"enable_paged_experts": True, "paged_experts_num_resident": "8"},
         "args": ["--speculative-algorithm", "EAGLE"]},
    ],
    "sglang-eplb": [],
    "sglang-kt": [],
}  # fmt: skip

# What validate refuses on rules of the harness's own, not the engine's: read apart.
HARNESS_ONLY = {
    # The recorder the profile drives would be reset by EPLB (cell_checks._check_eplb_recorder).
    "EPLB shares",
}
# What the engine refuses only past argument resolution, with a GPU and the model's weights:
# Paged Experts' check runs when the first MoE layer is built (0.5.23,
# srt/layers/moe/paged_experts/method.py, check_paged_experts_compat), so its parser takes what
# validate refuses of it; tests/engines/test_sglang_paged_experts.py runs that check.
AT_MODEL_LOAD = ("needs paged_experts_num_resident", "runs on a single GPU only",
                 "SGLang refuses it with enable_eplb", "SGLang refuses it with speculative",
                 "fewer than the model's router top-k")  # fmt: skip


# Runs in vLLM's venv: the stand-ins (the module docstring says which and why), then each
# command line judged as `python -m sglang.launch_server` judges it before any GPU work.
RUN_PARSER = (
    STAND_INS
    + r"""
import json, logging

out_path = sys.argv[1]

from sglang.srt.server_args import prepare_server_args

def judge(argv, env):
    # The cell's environment for its judging alone (SGLang reads its variables when it
    # resolves, and may set some), then the process's own again.
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        args = prepare_server_args(argv)
        if hasattr(args, "resolve_once"):
            args.resolve_once()
        args.check_server_args()
    except BaseException as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"refused": None}

verdicts = [judge(line["argv"], line["env"]) for line in json.load(sys.stdin)]
logging.shutdown()
with open(out_path, "w", encoding="utf-8") as out:
    json.dump(verdicts, out)
"""
)


def _engine_verdicts(
    python: str, site: Path, commands: list[dict[str, Any]], tmp: Path
) -> list[Any]:
    """The release's verdict on each command line and its environment (None: it boots past its
    arguments)."""
    out = tmp / "verdicts.json"
    env = gpu_env(tmp, [site])
    done = subprocess.run(
        [python, "-c", RUN_PARSER, str(out)],
        input=json.dumps(commands), capture_output=True, text=True, timeout=900, env=env,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return [verdict["refused"] for verdict in json.loads(out.read_text())]


def _values(name: str, profile: RuntimeProfile) -> list[Any]:
    """Every value a card can give a knob: each choice, a switch on and off, a pattern's
    representative and boundary values."""
    spec = profile.knobs[name]
    if spec.choices:
        return list(spec.choices)
    if spec.switch:
        return [True, False]
    return PATTERN_VALUES[name]


def _cells(profile_name: str, profile: RuntimeProfile, model: Path) -> dict[str, dict[str, Any]]:
    """The card's cells: each knob value alone, then the pairs' grids and the extra cells."""
    base: dict[str, Any] = {"model": str(model)}
    if "kt_weight_path" in profile.knobs:
        base.update(kt_weight_path=str(model), kt_method="AMXINT4")
    settings: list[dict[str, Any]] = [{}]
    settings += [{"knobs": {knob: value}} for knob in profile.knobs if knob not in FIXED
                 for value in _values(knob, profile)]  # fmt: skip
    for grid in PAIRS[profile_name]:
        for values in itertools.product(*grid.values()):
            knobs = {k: v for k, v in zip(grid, values, strict=True) if v is not None}
            settings.append({"knobs": knobs})
    settings += EXTRA_CELLS[profile_name]
    cells = {}
    for index, setting in enumerate(settings):
        cell: dict[str, Any] = {"knobs": {**base, **setting.get("knobs", {})}}
        if setting.get("args"):
            cell["args"] = setting["args"]
        if cell["knobs"].get("kt_expert_placement_strategy") == "frequency":
            cell["files"] = {"init_expert_location": str(FREQUENCY_FILE)}
        cells[f"c{index}"] = cell
    return cells


def _harness_refusals(folder: Path, profile_name: str, cells: dict[str, Any]) -> dict[str, list]:
    """What `harness validate` refuses of each cell (its problem lines), one card for all, and
    what `harness run` refuses of it before a boot on the stand-in GPU."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    card = yaml.safe_load(CARD.read_text(encoding="utf-8"))
    card.update(runtime=profile_name, control="c0", cells=cells)
    card["gates"] = [{"kind": "better", "metric": "decode_tok_s"}]  # one every profile has
    refused = validate_refusals(card, folder)
    profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / f"{profile_name}.yaml")
    assert STAND_IN_GPU is not None
    for name, cell in cells.items():
        for _, problem in sglang_cell_refusals(Cell.model_validate(cell), profile, STAND_IN_GPU):
            refused.setdefault(name, []).append(problem)
    return refused


def _boot(profile: RuntimeProfile, cell: dict[str, Any]) -> BootSpec:
    """The boot harness makes of the cell."""
    uploaded = {key: "/runs/r0/files/" + Path(value).name
                for key, value in cell.get("files", {}).items()}  # fmt: skip
    uploaded = {key: str(FREQUENCY_FILE) for key in uploaded}  # the engine may read it
    spec = boot_spec(profile, Cell.model_validate(cell), port=30000, run_dir="/runs/r0",
                     python="python3", bind_host="127.0.0.1", cache_dir="/runs/cache",
                     uploaded=uploaded)  # fmt: skip
    assert spec.argv[:2] == ["sh", "-c"] and spec.argv[3] == "sglang", spec.argv
    return spec


def _argv(profile: RuntimeProfile, cell: dict[str, Any]) -> list[str]:
    """The command line harness boots the cell with, after `python -m sglang.launch_server`."""
    return _boot(profile, cell).argv[4:]


def _command(profile: RuntimeProfile, cell: dict[str, Any]) -> dict[str, Any]:
    """The cell's command line (:func:`_argv`) and the environment its knobs set."""
    spec = _boot(profile, cell)
    env = {var: value for var, value in spec.env.items()
           if profile.knob_for_env(var) and not var.startswith("HARNESS_")}  # fmt: skip
    return {"argv": spec.argv[4:], "env": env}


RELEASES = {
    "sglang": ("sglang-0.5.23", lambda: [_wheel()]),
    "sglang-eplb": ("sglang-0.5.23", lambda: [_wheel()]),
    "sglang-kt": ("sglang-kt-0.7.2", lambda: [_kt_wheel()]),
}


PROFILES = ("sglang", "sglang-eplb", "sglang-kt")


@pytest.fixture(scope="module")
def judged(
    torch_python: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, dict[str, Any], dict[str, str | None]]]:
    """Per profile: the model folder, its cells and the release's verdict on each; one
    subprocess per release (the two 0.5.23 profiles' command lines judged together). A probe
    each release must refuse (argparse: --tp-size takes an integer) shows the judge can."""
    folder = tmp_path_factory.mktemp("sglang-parsers")
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG), encoding="utf-8")
    cells, commands = {}, {}
    for name in PROFILES:
        profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / f"{name}.yaml")
        cells[name] = _cells(name, profile, model)
        commands[name] = [_command(profile, cell) for cell in cells[name].values()]
    out: dict[str, tuple[Path, dict[str, Any], dict[str, str | None]]] = {}
    for release in dict.fromkeys(RELEASES[name][0] for name in PROFILES):
        names = [name for name in PROFILES if RELEASES[name][0] == release]
        site = engine_site(release, RELEASES[names[0]][1](), torch_python)
        lines = [line for name in names for line in commands[name]]
        probe = {"argv": [*lines[0]["argv"], "--tp-size", "two"], "env": {}}
        work = folder / release
        work.mkdir()
        *verdicts, probed = _engine_verdicts(torch_python, site, [*lines, probe], work)
        assert probed is not None and probed.startswith("SystemExit"), probed
        for name in names:
            mine, verdicts = verdicts[: len(commands[name])], verdicts[len(commands[name]) :]
            out[name] = (model, cells[name], dict(zip(cells[name], mine, strict=True)))
    return out


@pytest.mark.parametrize("profile_name", PROFILES)
def test_validate_refuses_what_the_release_refuses(
    judged: dict[str, tuple[Path, dict[str, Any], dict[str, str | None]]],
    tmp_path: Path,
    profile_name: str,
) -> None:
    _, cells, verdicts = judged[profile_name]
    refused = _harness_refusals(tmp_path, profile_name, cells)
    engine = {name for name, why in verdicts.items() if why is not None}
    assert len(engine) < len(cells), verdicts
    assert set(refused) >= engine, {
        n: (cells[n]["knobs"], verdicts[n]) for n in sorted(engine - set(refused))
    }
    # What validate alone refuses, it refuses on the harness's own rules or on what the engine
    # refuses only at the model's load; never where the engine's arguments would boot it.
    reasons = (*HARNESS_ONLY, *AT_MODEL_LOAD)
    unexplained = {
        name: (cells[name]["knobs"], lines)
        for name, lines in refused.items()
        if name not in engine and not all(any(w in line for w in reasons) for line in lines)
    }
    assert not unexplained, unexplained
