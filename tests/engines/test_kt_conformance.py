"""KTransformers' own code judges the frequency file `harness fit-map` writes, the check that
refuses one of another model's shape, and the reading of its recorder's two-file dumps.

No SGLang or KT server runs on a CPU, and their packages do not import without a GPU stack, but
the function that turns a frequency file into GPU expert masks is plain torch: sglang-kt
0.7.2's `_init_kt_gpu_experts_masks` (sglang/srt/layers/moe/kt_ep_wrapper.py) and kt-kernel
0.7.2's `generate_gpu_experts_masks` (kt_kernel/experts_base.py). The released wheels are
downloaded once (`pip download --no-deps`, into the harness cache), those two functions are
taken out of their sources unchanged and run in vLLM's venv (real torch) with the server
arguments a 48-layer, 128-expert model with one dense layer (DeepSeek's `first_k_dense_replace`)
would give them, and with DeepSeek-V2-Lite's config, plain and nested under `text_config` as a VL
model's is, on what `fit-map` writes from one short calibration with and without decay. Its
recorder (sglang/srt/eplb/expert_distribution.py: the stat gatherer and accumulator, the
GPU-mask gatherer and accumulator, and `dump_record`) runs the same way on one rank and writes
the counts and the masks to their two files. Nothing of theirs is copied here:
the test reads their files at run time.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.card import load_runtime_profile
from harness.formats.expert_distribution import (
    combine_dumps,
    gpu_hits,
    kt_frequency_refusal,
    logical_count_shape,
    read_dump,
    read_logical_count,
)
from harness.formats.maps import write_count_dump
from harness.formats.torchfile import write_torch_file
from harness.runtimes.build_script import cache_root
from harness.runtimes.recorder import per_token_counts
from harness.sim.fitmap import coverage, frequency_hot
from harness.sim.trace_files import load_trace
from tests.conftest import REPO
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture
from tests.sim.test_fitmap import cli

pytestmark = pytest.mark.slow

WHEELS = {
    "sglang-kt==0.7.2": ("sglang_kt-0.7.2-", "sglang/srt/layers/moe/kt_ep_wrapper.py"),
    "kt-kernel==0.7.2": ("kt_kernel-0.7.2-", "kt_kernel/experts_base.py"),
}
LAYERS, EXPERTS, DENSE, PER_LAYER = 48, 128, 1, 8

# Runs in vLLM's venv: KT's two functions from their released sources, as SGLang calls the first
# at boot (tensor-parallel rank 0, no process group).
KT_LOADER = """
import ast, json, logging, sys, types, typing
import torch
import torch.distributed as dist

wrapper, base = sys.argv[1:3]

def function(path, name):
    source = open(path, encoding="utf-8").read()
    node = next(n for n in ast.parse(source).body
                if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node)

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
space = {"torch": torch, "dist": dist, "logger": logging.getLogger("kt"),
         "Optional": typing.Optional, "List": typing.List, "_KT_GPU_EXPERTS_MASKS": None,
         "get_tensor_model_parallel_rank": lambda: 0}
exec(function(base, "generate_gpu_experts_masks"), space)
exec(function(wrapper, "_init_kt_gpu_experts_masks"), space)

def masks(config, init_file, per_layer):
    space["_KT_GPU_EXPERTS_MASKS"] = None  # its once-per-process cache
    args = types.SimpleNamespace(get_hf_config=lambda: config, kt_gpu_experts_ratio=None,
                                 kt_num_gpu_experts=per_layer,
                                 kt_expert_placement_strategy="frequency",
                                 init_expert_location=init_file)
    return space["_init_kt_gpu_experts_masks"](args).tolist()
"""

# One placement, printed: a model of LAYERS x EXPERTS with DENSE dense layers.
RUN_KT_LOADER = (
    KT_LOADER
    + """
init_file, layers, experts, dense, per_layer = sys.argv[3:8]
config = types.SimpleNamespace(num_hidden_layers=int(layers), n_routed_experts=int(experts),
                               first_k_dense_replace=int(dense), moe_layer_freq=1)
print(json.dumps(masks(config, init_file, int(per_layer))))
"""
)

# Many placements in one process: jobs [{"config": config.json, "init": file, "per_layer": K}],
# each config.json given as the attributes an HF config object has (nested configs, such as a
# VL model's text_config, as objects of their own).
RUN_KT_PLACEMENTS = (
    KT_LOADER
    + """
def attributes(value):
    if isinstance(value, dict):
        return types.SimpleNamespace(**{k: attributes(v) for k, v in value.items()})
    return value

out = []
for job in json.load(open(sys.argv[3])):
    config = attributes(json.load(open(job["config"])))
    out.append(masks(config, job["init"], job["per_layer"]))
print(json.dumps(out))
"""
)


@pytest.fixture(scope="module")
def kt_sources(tmp_path_factory: pytest.TempPathFactory, torch_python: str) -> dict[str, Path]:  # noqa: F811
    """The two source files, from the released wheels (downloaded once)."""
    folder = cache_root() / "kt-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    out = tmp_path_factory.mktemp("kt-sources")
    sources: dict[str, Path] = {}
    for requirement, (prefix, member) in WHEELS.items():
        found = sorted(folder.glob(f"{prefix}*.whl"))
        if not found:
            subprocess.run(
                [torch_python, "-m", "pip", "download", "--no-deps", "--quiet",
                 requirement, "-d", str(folder)],
                check=True, timeout=900,
            )  # fmt: skip
            found = sorted(folder.glob(f"{prefix}*.whl"))
        with zipfile.ZipFile(found[0]) as wheel:
            target = out / Path(member).name
            target.write_bytes(wheel.read(member))
        sources[member] = target
    return sources


def _kt_masks(
    python: str, sources: dict[str, Path], init_file: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", RUN_KT_LOADER, *_loader_sources(sources), str(init_file),
         str(LAYERS), str(EXPERTS), str(DENSE), str(PER_LAYER)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _loader_sources(sources: dict[str, Path]) -> list[str]:
    return [str(sources["sglang/srt/layers/moe/kt_ep_wrapper.py"]),
            str(sources["kt_kernel/experts_base.py"])]  # fmt: skip


def _dense_prefix_counts() -> np.ndarray:
    """Counts of a model whose layer 0 is dense (no router: nothing recorded), every other
    count distinct so the global top is one set whatever the order of ties."""
    counts = np.random.default_rng(5).permutation(LAYERS * EXPERTS).reshape(LAYERS, EXPERTS)
    counts[:DENSE] = 0
    return counts + (counts > 0)


def test_kts_own_loader_places_what_fit_map_scores_for_a_dense_prefix_model(
    torch_python: str,  # noqa: F811
    kt_sources: dict[str, Path],
    tmp_path: Path,
) -> None:
    counts = _dense_prefix_counts()
    dump = tmp_path / "counts.json"
    write_count_dump(dump, counts, 1.0)
    frequency = tmp_path / "kt-frequency.pt"
    code, text = cli("fit-map", str(dump), "--format", "kt-frequency", "-o", str(frequency))
    assert code == 0 and f"logical_count [1, {LAYERS}, {EXPERTS}]" in text
    done = _kt_masks(torch_python, kt_sources, frequency)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "with activation frequency data" in done.stderr
    masks = np.array(json.loads(done.stdout))
    assert masks.shape == (LAYERS, EXPERTS)
    assert masks[:DENSE].all()  # KT keeps a dense layer wholly on the GPU
    # Its MoE layers hold K x MoE layers experts, the ones fit-map's scoring assumes.
    assert int(masks[DENSE:].sum()) == PER_LAYER * (LAYERS - DENSE)
    ours = frequency_hot(counts, PER_LAYER)
    for layer in range(DENSE, LAYERS):
        assert np.flatnonzero(masks[layer]).tolist() == ours[layer], layer


def test_kts_loader_refuses_a_two_dimensional_file_and_ignores_a_json(
    torch_python: str,  # noqa: F811
    kt_sources: dict[str, Path],
    tmp_path: Path,
) -> None:
    # What fit-map wrote before: [layers, experts], which KT refuses at boot.
    flat = tmp_path / "flat.pt"
    write_torch_file(flat, {"logical_count": _dense_prefix_counts()})
    done = _kt_masks(torch_python, kt_sources, flat)
    assert done.returncode != 0 and "Expected activation counts tensor with 3 dims" in done.stderr
    # A .json is not read at all: KT places uniformly, which `harness validate` refuses.
    as_json = tmp_path / "counts.json"
    as_json.write_text(json.dumps({"logical_count": _dense_prefix_counts().tolist()}))
    done = _kt_masks(torch_python, kt_sources, as_json)
    assert done.returncode == 0 and "WITHOUT activation frequency data" in done.stderr


def test_the_harness_refuses_exactly_the_frequency_files_kts_loader_refuses(
    torch_python: str,  # noqa: F811
    kt_sources: dict[str, Path],
    tmp_path: Path,
) -> None:
    # `validate` and `run` judge a frequency file against the model's config.json before a
    # boot; KT's own loader is the judge of that judgement, on the shipped reference-runtime
    # file (8 x 64), a file of the right layers and the wrong experts, and a right one.
    config = {"num_hidden_layers": LAYERS, "n_routed_experts": EXPERTS}
    wrong_experts = tmp_path / "wrong-experts.pt"
    write_torch_file(wrong_experts, {"logical_count": np.ones((1, LAYERS, EXPERTS // 2))})
    right = tmp_path / "right.pt"
    write_torch_file(right, {"logical_count": _dense_prefix_counts()[None]})
    shipped = REPO / "campaigns" / "maps" / "kt-frequency-refbox.pt"
    for path in (shipped, wrong_experts, right):
        ours = kt_frequency_refusal(logical_count_shape(path), config)
        done = _kt_masks(torch_python, kt_sources, path)
        assert (ours is None) == (done.returncode == 0), (path.name, ours, done.stderr[-800:])
        if ours is not None:
            assert "doesn't match model" in done.stderr, done.stderr[-800:]


# DeepSeek-V2-Lite's shape (layer 0 dense, 26 MoE layers of 64 routed experts, 6 per token), as
# its config.json gives it, and the same model nested under `text_config` as a VL model's config
# (Kimi-K2.5's layout) nests it: KT unwraps it before it reads the shape.
V2_LITE = {
    "model_type": "deepseek_v2",
    "num_hidden_layers": 27,
    "n_routed_experts": 64,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_experts_per_tok": 6,
}
VL_WRAPPED = {
    "model_type": "kimi_k25",
    "text_config": V2_LITE,
    "vision_config": {"model_type": "moonvit", "hidden_size": 1152},
}
HALF_LIVES = {"2": ["--decay-half-life-steps", "2"], "20": ["--decay-half-life-steps", "20"],
              "none": []}  # fmt: skip
GPU_PER_LAYER = 8  # x 26 MoE layers: 208 GPU experts


def _v2_lite_trace(path: Path, tokens: int, seed: int) -> None:
    """A routing trace of V2_LITE's MoE layers (decode tokens, Zipf-popular experts per layer),
    as `collect --routes-from-responses` writes it: the dense layer named, not routed."""
    rng = np.random.default_rng(seed)
    layers = V2_LITE["num_hidden_layers"] - V2_LITE["first_k_dense_replace"]
    experts, top_k = V2_LITE["n_routed_experts"], V2_LITE["num_experts_per_tok"]
    popularity = 1.0 / np.arange(1, experts + 1) ** 1.1
    rows = np.empty((tokens, layers, top_k), dtype=np.int64)
    for layer in range(layers):
        weights = rng.permutation(popularity)
        for token in range(tokens):
            rows[token, layer] = rng.choice(
                experts, top_k, replace=False, p=weights / weights.sum()
            )
    np.savez(path, experts=rows, moe_layers=np.arange(1, layers + 1), dense_layers=np.array([0]))


def test_kts_own_loader_places_exactly_what_fit_map_scored(
    torch_python: str,  # noqa: F811
    kt_sources: dict[str, Path],
    tmp_path: Path,
) -> None:
    # One short calibration, fitted with decay half-lives 2, 20 and none: decayed counts are
    # fractions (most under one at a half-life of 2) and a short calibration ties at the cut. KT's
    # own loader, for the plain and the VL-wrapped config, places in the MoE layers exactly the
    # 208 experts `fit-map --score` scored, and the held-out coverage of its placement is the
    # line fit-map printed.
    calibration, held = tmp_path / "calibration.npz", tmp_path / "held.npz"
    _v2_lite_trace(calibration, 48, seed=1)
    _v2_lite_trace(held, 32, seed=2)
    configs = {}
    for name, config in (("v2-lite", V2_LITE), ("vl-wrapped", VL_WRAPPED)):
        configs[name] = tmp_path / name / "config.json"
        configs[name].parent.mkdir()
        configs[name].write_text(json.dumps(config), encoding="utf-8")
    jobs, cases, printed = [], [], {}
    for label, decay in HALF_LIVES.items():
        frequency = tmp_path / f"kt-{label}.pt"
        fit = ["--format", "kt-frequency", "--top", f"{GPU_PER_LAYER}", "-o", str(frequency)]
        code, text = cli("fit-map", str(calibration), *decay, *fit, "--score", str(held))
        assert code == 0, text
        printed[label] = next(line for line in text.splitlines() if line.startswith("coverage "))
        for name, config in configs.items():
            shape = logical_count_shape(frequency)
            assert kt_frequency_refusal(shape, json.loads(config.read_text())) is None
            jobs.append({"config": str(config), "init": str(frequency), "per_layer": GPU_PER_LAYER})
            cases.append((label, name))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    done = subprocess.run(
        [torch_python, "-c", RUN_KT_PLACEMENTS, *_loader_sources(kt_sources),
         str(tmp_path / "jobs.json")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    moe = range(V2_LITE["first_k_dense_replace"], V2_LITE["num_hidden_layers"])
    budget = GPU_PER_LAYER * len(moe)
    held_trace = load_trace(held)
    differ, lines = {}, {}
    for (label, name), placed in zip(cases, json.loads(done.stdout), strict=True):
        masks = np.array(placed, dtype=bool)
        assert masks[: moe.start].all()  # KT keeps the dense layer wholly on the GPU
        kt_hot = [np.flatnonzero(row).tolist() for row in masks]
        scored = frequency_hot(read_logical_count(tmp_path / f"kt-{label}.pt"), GPU_PER_LAYER)
        kt_set = {(layer, e) for layer in moe for e in kt_hot[layer]}
        ours = {(layer, e) for layer in moe for e in scored[layer]}
        differ[label, name] = budget - len(kt_set & ours)  # of the 208 KT places
        placed_line = f"coverage {coverage(held_trace, hot=kt_hot).text()}"
        lines[label, name] = placed_line == printed[label] or (placed_line, printed[label])
    assert differ == dict.fromkeys(cases, 0)
    assert lines == dict.fromkeys(cases, True)


# Runs in vLLM's venv: sglang-kt 0.7.2's recorder as a KT server records with
# --record-kt-gpu-expert-distribution on rank 0 — its gatherer and stat accumulator for the
# counts, its GPU-mask gatherer and accumulator, and its recorder's own `dump_record`, which
# writes the counts and the masks to two files. Their build allocates the gatherer's counts on
# "cuda"; on this CPU torch that one allocation is placed on the CPU (the only shim).
RUN_KT_RECORDER = r"""
import ast, json, logging, math, sys, textwrap, time, types, typing
from abc import ABC
from pathlib import Path
import torch
import torch.distributed

source_path, store, out_dir, routing_path, masks_path, experts = sys.argv[1:7]
experts = int(experts)
torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
source = open(source_path, encoding="utf-8").read()
tree = ast.parse(source)
wanted = {"_SinglePassGatherer", "_LayerBasedGpuSinglePassGatherer",
          "_SelectExpertsSinglePassGatherer", "_Accumulator", "_UtilizationRateAccumulatorMixin",
          "_StatAccumulator", "_Buffer", "_CircularBuffer", "_InfiniteBuffer", "_dump_to_file",
          "_convert_global_physical_count_to_logical_count", "_GpuExpertMaskGatherer",
          "_GpuExpertMaskAccumulator"}
parts = [ast.get_source_segment(source, node) for node in tree.body
         if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted]
recorder = next(n for n in tree.body
                if isinstance(n, ast.ClassDef) and n.name == "_ExpertDistributionRecorderReal")
dump_record = next(n for n in recorder.body
                   if isinstance(n, ast.FunctionDef) and n.name == "dump_record")
parts.append(textwrap.dedent(ast.get_source_segment(source, dump_record, padded=True)))

class CpuTorch(types.ModuleType):
    def __getattr__(self, name):
        return getattr(torch, name)
    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, **kwargs)

cpu_torch = CpuTorch("torch")
torch.get_device_module = lambda *a: types.SimpleNamespace(empty_cache=lambda: None)
server_args = types.SimpleNamespace(expert_distribution_recorder_mode="stat",
                                    expert_distribution_recorder_buffer_size=-1,
                                    enable_expert_distribution_metrics=False,
                                    record_kt_gpu_expert_distribution=True,
                                    eplb_min_rebalancing_utilization_threshold=1.0,
                                    device="cpu")
space = {"torch": cpu_torch, "math": math, "time": time, "Path": Path, "ABC": ABC,
         "logger": logging.getLogger("sglang"), "_SINGLE_PASS_GATHERER_KEY_PRIMARY": "primary",
         "envs": types.SimpleNamespace(SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR=
                                       types.SimpleNamespace(get=lambda: out_dir))}
space.update({name: getattr(typing, name) for name in typing.__all__})
exec("from __future__ import annotations\n" + "\n\n".join(parts), space)
routing = json.load(open(routing_path))  # [passes][layers][tokens][top_k]
masks = json.load(open(masks_path))  # [passes][layers][experts], which experts were on the GPU
layers = len(routing[0])
meta = types.SimpleNamespace(num_layers=layers, num_physical_experts=experts,
                             num_logical_experts=experts, num_local_physical_experts=experts,
                             physical_to_logical_map=torch.arange(experts).repeat(layers, 1),
                             ep_size=1)
gatherer = space["_SelectExpertsSinglePassGatherer"](meta, 0)
accumulator = space["_StatAccumulator"](server_args, meta, 0)
mask_gatherer = space["_GpuExpertMaskGatherer"](meta, device="cpu")
mask_accumulator = space["_GpuExpertMaskAccumulator"](server_args, meta)
for index, passes in enumerate(routing):  # as _on_forward_pass_end records one pass
    gatherer.reset()
    for layer, topk_ids in enumerate(passes):
        gatherer.on_select_experts(layer, torch.tensor(topk_ids))
        mask_gatherer.on_layer(layer, torch.tensor(masks[index][layer], dtype=torch.bool))
    accumulator.append(index, "primary", gatherer.collect(), {})
    mask_accumulator.append(mask_gatherer.collect())
    mask_gatherer.reset()
this = types.SimpleNamespace(_accumulator=accumulator, _record_kt_gpu_expert_distribution=True,
                             _gpu_expert_mask_accumulator=mask_accumulator,
                             _reset=lambda: None)
space["dump_record"](this, "file")
torch.distributed.destroy_process_group()
"""


def run_kt_recorder(
    python: str, source: Path, folder: Path, routing: Any, masks: Any, experts: int
) -> Path:
    """KT's own recorder (its module's source at ``source``) over ``routing`` [passes][layers]
    [tokens][top-k] and ``masks`` [passes][layers][experts], run in vLLM's venv on one rank;
    the folder its dump went to."""
    (folder / "routing.json").write_text(json.dumps(routing))
    (folder / "masks.json").write_text(json.dumps(masks))
    out = folder / "dumps"
    done = subprocess.run(
        [python, "-c", RUN_KT_RECORDER, str(source), str(folder / "store"), str(out),
         str(folder / "routing.json"), str(folder / "masks.json"), str(experts)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_kts_own_recorder_writes_the_two_files_whose_hits_the_harness_reads(
    torch_python: str,  # noqa: F811
    kt_sources: dict[str, Path],  # the wheels, downloaded once
    tmp_path: Path,
) -> None:
    # A KT server's dump is two files: the counts, and the GPU masks of every pass beside
    # them. KT's own recorder code writes both; the harness reads them with the sglang-kt
    # profile's globs, as finish_recording does, into route counts and GPU hits and misses.
    folder = cache_root() / "kt-wheels"
    (wheel,) = sorted(folder.glob("sglang_kt-0.7.2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        source = tmp_path / "expert_distribution.py"
        source.write_bytes(archive.read("sglang/srt/eplb/expert_distribution.py"))
    passes, layers, tokens, top_k, experts = 4, 3, 6, 2, 8
    rng = np.random.default_rng(23)
    routing = np.array([[[rng.choice(experts, top_k, replace=False) for _ in range(tokens)]
                         for _ in range(layers)] for _ in range(passes)])  # fmt: skip
    masks = rng.random((passes, layers, experts)) < 0.4  # dynamic placement moves them
    out = run_kt_recorder(torch_python, source, tmp_path, routing.tolist(), masks.tolist(), experts)
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/sglang-kt.yaml")
    recorder = profile.telemetry.expert_recorder
    assert recorder is not None
    files = sorted({p for pattern in recorder.glob for p in out.glob(pattern)})
    assert sorted(p.name.split("_")[0] for p in files) == ["expert", "gpu"], files
    dist = per_token_counts(
        combine_dumps([read_dump(p) for p in files], str(out)), recorder, {"tp_size": "1"}
    )
    true = np.zeros((passes, layers, experts), dtype=np.int64)
    for p, layer in np.ndindex(passes, layers):
        np.add.at(true[p, layer], routing[p, layer].ravel(), 1)
    assert np.array_equal(dist.counts, true)
    hits = int((true * masks).sum())
    assert gpu_hits(dist) == (hits, int(true.sum()) - hits)
