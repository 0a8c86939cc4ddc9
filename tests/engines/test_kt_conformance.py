"""KTransformers' own code judges the frequency file `harness fit-map` writes, the check that
refuses one of another model's shape, and the reading of its recorder's two-file dumps.

No SGLang or KT server runs on a CPU, but their released modules import and run on one. The
wheels of sglang-kt 0.7.2 and kt-kernel 0.7.2 are downloaded once (`pip download --no-deps`,
into the harness cache) and installed whole, as shipped, each into a folder of its own
(tests/engines/sglang_site.py; kt-kernel apart because its wheel also ships top-level
`sgl_kernel`, `deep_gemm` and `triton_kernels` packages that sglang-kt's folder does not have).
One process of vLLM's venv (python 3.11, real CPU torch) per test module imports, whole:

- `kt_kernel` and `kt_kernel.experts_base`, native extension included (its CPU detection loads
  the AVX-512 build this CPU takes), whose `generate_gpu_experts_masks` sglang-kt imports;
- `sglang.srt.layers.moe.kt_ep_wrapper`, whose `_init_kt_gpu_experts_masks` is called as SGLang
  calls it at boot on tensor-parallel rank 0 (SGLang's own process groups of one rank, made by
  its `init_distributed_environment` and `initialize_model_parallel` over gloo, so its rank and
  its broadcast of the masks are its own), with the server arguments of a frequency placement
  (`kt_num_gpu_experts`, `kt_expert_placement_strategy`, `init_expert_location`, and the
  model's config as `get_hf_config` gives it): a 48-layer, 128-expert model with one dense layer
  (DeepSeek's `first_k_dense_replace`), and DeepSeek-V2-Lite's config, plain and nested under
  `text_config` as a VL model's is, on what `fit-map` writes from one short calibration with and
  without decay;
- `sglang.srt.eplb.expert_distribution`, whose `ExpertDistributionRecorder.init_new` makes the
  recorder a KT server makes with `--expert-distribution-recorder-mode stat` and
  `--record-kt-gpu-expert-distribution` on rank 0; it is started, records each pass through
  `with_forward_pass`, `with_current_layer`, `on_select_experts` and `on_gpu_expert_mask`, and
  its `dump_record` writes the counts and the masks to their two files.

Stood in: what tests/engines/sglang_site.py stands in for (`sgl_kernel`, `torchvision`, the
GPU: its docstring says why); SGLang is shown no GPU while it makes its process groups (a CPU
box's are gloo's, on the CPU); the server arguments and the expert-location metadata the two
entry points read are given as plain objects holding those fields; and in the recorder's
module only, its gatherer's counts, which it allocates on "cuda", are allocated on the CPU, and
its device module's `empty_cache` and stream-capture query answer as an idle GPU's would.
Nothing of theirs is copied here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
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
from harness.runtimes.log_counters import log_snapshot
from harness.runtimes.recorder import per_token_counts
from harness.sim.fitmap import coverage, frequency_hot
from harness.sim.trace_files import load_trace
from tests.conftest import REPO
from tests.engines.sglang_site import STAND_INS, ask, close, gpu_env
from tests.engines.sglang_site import site as engine_site
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture
from tests.sim.test_fitmap import cli

pytestmark = pytest.mark.slow

WHEELS = {"sglang-kt==0.7.2": "sglang_kt-0.7.2-", "kt-kernel==0.7.2": "kt_kernel-0.7.2-"}
LAYERS, EXPERTS, DENSE, PER_LAYER = 48, 128, 1, 8

# Runs in vLLM's venv, one process for a test module: the stand-ins, SGLang's tensor-parallel
# group of one rank, sglang-kt's and kt-kernel's modules imported whole, then one job per
# line of stdin, each answered on stdout by a line "@@" + JSON: what the job returned or the
# exception it raised, and what KT logged meanwhile.
RUN_KT = (
    STAND_INS
    + r"""
import json, logging, time, traceback

store = sys.argv[1]
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
logging.getLogger().addHandler(Keep())

from sglang.srt.distributed import parallel_state
from sglang.srt.utils import common

# The boot's process groups on one rank (tp rank 0), over gloo: this box's only device is its
# CPU, so SGLang is let see none while it makes them, then the stand-in H100s again.
torch.cuda.is_available = lambda: False
common.is_cuda.cache_clear(), common.is_cuda_alike.cache_clear()
parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                            distributed_init_method=f"file://{store}",
                                            backend="gloo")
parallel_state.initialize_model_parallel(1, backend="gloo")
torch.cuda.is_available = lambda: True
common.is_cuda.cache_clear(), common.is_cuda_alike.cache_clear()
assert parallel_state.get_tensor_model_parallel_rank() == 0

from kt_kernel import experts_base
from sglang.srt.eplb import expert_distribution
from sglang.srt.layers.moe import kt_ep_wrapper

assert kt_ep_wrapper.generate_gpu_experts_masks is experts_base.generate_gpu_experts_masks

def attributes(value):
    if isinstance(value, dict):
        return types.SimpleNamespace(**{k: attributes(v) for k, v in value.items()})
    return value

def masks(config, init, per_layer):
    # As SGLang calls it at boot: the server arguments of a frequency placement.
    kt_ep_wrapper._KT_GPU_EXPERTS_MASKS = None  # its once-per-process cache
    args = types.SimpleNamespace(get_hf_config=lambda: attributes(config),
                                 kt_gpu_experts_ratio=None, kt_num_gpu_experts=per_layer,
                                 kt_expert_placement_strategy="frequency",
                                 init_expert_location=init)
    return kt_ep_wrapper._init_kt_gpu_experts_masks(args).tolist()

class CpuTorch(types.ModuleType):
    # The recorder's torch, but its gatherer's counts (allocated on "cuda") on the CPU, and
    # its device module's cache emptied and stream capture asked of as a GPU's would be.
    def __getattr__(self, name):
        return getattr(torch, name)
    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, **kwargs)
    @staticmethod
    def get_device_module(*args):
        return types.SimpleNamespace(empty_cache=lambda: None,
                                     is_current_stream_capturing=lambda: False)

expert_distribution.torch = CpuTorch("torch")

def record(out_dir, routing, masks, experts):
    # A KT server's recorder on rank 0 with --expert-distribution-recorder-mode stat and
    # --record-kt-gpu-expert-distribution: started, each pass recorded as the model's forward
    # records it, then dumped to files, as the /dump_expert_distribution_record call does.
    os.environ["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"] = out_dir
    layers = len(routing[0])
    server_args = types.SimpleNamespace(expert_distribution_recorder_mode="stat",
                                        expert_distribution_recorder_buffer_size=-1,
                                        enable_expert_distribution_metrics=False,
                                        record_kt_gpu_expert_distribution=True,
                                        eplb_min_rebalancing_utilization_threshold=1.0,
                                        moe_a2a_backend="none", device="cpu")
    meta = types.SimpleNamespace(num_layers=layers, num_physical_experts=experts,
                                 num_logical_experts=experts, num_local_physical_experts=experts,
                                 physical_to_logical_map=torch.arange(experts).repeat(layers, 1),
                                 ep_size=1)
    recorder = expert_distribution.ExpertDistributionRecorder.init_new(server_args, meta, 0)
    recorder.start_record()
    for index, passes in enumerate(routing):
        with recorder.with_forward_pass(index, None):
            for layer, topk_ids in enumerate(passes):
                with recorder.with_current_layer(layer):
                    recorder.on_select_experts(torch.tensor(topk_ids))
                    recorder.on_gpu_expert_mask(
                        layer, torch.tensor(masks[index][layer], dtype=torch.bool))
    recorder.stop_record()
    recorder.dump_record("file")
    return out_dir

jobs = {"masks": masks, "record": record}
for line in sys.stdin:
    job = json.loads(line)
    logged.clear()
    try:
        answer = {"value": jobs[job.pop("kind")](**job)}
    except Exception as exc:
        traceback.print_exc()
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    answer["log"] = list(logged)
    print("@@" + json.dumps(answer), flush=True)
os._exit(0)  # what SGLang registered to run at exit is for a server's shutdown, not this
"""
)


def kt_wheels(python: str) -> list[Path]:
    """sglang-kt's and kt-kernel's released wheels, downloaded once into the harness cache."""
    folder = cache_root() / "kt-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for requirement, prefix in WHEELS.items():
        found = sorted(folder.glob(f"{prefix}*.whl"))
        if not found:
            subprocess.run(
                [python, "-m", "pip", "download", "--no-deps", "--quiet",
                 requirement, "-d", str(folder)],
                check=True, timeout=900,
            )  # fmt: skip
            found = sorted(folder.glob(f"{prefix}*.whl"))
        wheels.append(found[0])
    return wheels


class KtRuntime:
    """sglang-kt 0.7.2 and kt-kernel 0.7.2, imported whole in one process of vLLM's venv."""

    def __init__(self, python: str, folder: Path) -> None:
        sglang_kt, kt_kernel = kt_wheels(python)
        sites = [engine_site("sglang-kt-0.7.2", [sglang_kt], python),
                 engine_site("kt-kernel-0.7.2", [kt_kernel], python, needs=[])]  # fmt: skip
        self.stderr = folder / "stderr.txt"
        with self.stderr.open("w") as errors:
            self.process = subprocess.Popen(
                [python, "-c", RUN_KT, str(folder / "store")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
                env=gpu_env(folder, sites),
            )  # fmt: skip

    def ask(self, kind: str, **job: Any) -> dict[str, Any]:
        """One job's answer: {"value": ...} or {"error": "Type: message"}, and "log"."""
        answer: dict[str, Any] = ask(self.process, {"kind": kind, **job}, self.stderr)
        return answer

    def close(self) -> None:
        close(self.process)


@pytest.fixture(scope="module")
def kt_runtime(
    tmp_path_factory: pytest.TempPathFactory,
    torch_python: str,  # noqa: F811
) -> Iterator[KtRuntime]:
    """KT's modules imported whole once for a test module."""
    runtime = KtRuntime(torch_python, tmp_path_factory.mktemp("kt-runtime"))
    yield runtime
    runtime.close()


def _kt_masks(runtime: KtRuntime, init_file: Path) -> dict[str, Any]:
    """KT's GPU masks of a model of LAYERS x EXPERTS with DENSE dense layers."""
    config = {"num_hidden_layers": LAYERS, "n_routed_experts": EXPERTS,
              "first_k_dense_replace": DENSE, "moe_layer_freq": 1}  # fmt: skip
    return runtime.ask("masks", config=config, init=str(init_file), per_layer=PER_LAYER)


def _dense_prefix_counts() -> np.ndarray:
    """Counts of a model whose layer 0 is dense (no router: nothing recorded), every other
    count distinct so the global top is one set whatever the order of ties."""
    counts = np.random.default_rng(5).permutation(LAYERS * EXPERTS).reshape(LAYERS, EXPERTS)
    counts[:DENSE] = 0
    return counts + (counts > 0)


def test_kts_own_loader_places_what_fit_map_scores_for_a_dense_prefix_model(
    kt_runtime: KtRuntime,
    tmp_path: Path,
) -> None:
    counts = _dense_prefix_counts()
    dump = tmp_path / "counts.json"
    write_count_dump(dump, counts, 1.0)
    frequency = tmp_path / "kt-frequency.pt"
    code, text = cli("fit-map", str(dump), "--format", "kt-frequency", "-o", str(frequency))
    assert code == 0 and f"logical_count [1, {LAYERS}, {EXPERTS}]" in text
    done = _kt_masks(kt_runtime, frequency)
    assert "error" not in done, done
    assert any("with activation frequency data" in line for line in done["log"])
    masks = np.array(done["value"])
    assert masks.shape == (LAYERS, EXPERTS)
    assert masks[:DENSE].all()  # KT keeps a dense layer wholly on the GPU
    # Its MoE layers hold K x MoE layers experts, the ones fit-map's scoring assumes.
    assert int(masks[DENSE:].sum()) == PER_LAYER * (LAYERS - DENSE)
    ours = frequency_hot(counts, PER_LAYER)
    for layer in range(DENSE, LAYERS):
        assert np.flatnonzero(masks[layer]).tolist() == ours[layer], layer
    # The line KT logged making them is what kt_num_gpu_experts' engagement signature counts.
    profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / "sglang-kt.yaml")
    specs = profile.telemetry.log_counters
    counted = log_snapshot("\n".join(done["log"]) + "\n", specs)
    assert counted["kt_gpu_experts"] == PER_LAYER * (LAYERS - DENSE)


def test_kts_loader_refuses_a_two_dimensional_file_and_ignores_a_json(
    kt_runtime: KtRuntime,
    tmp_path: Path,
) -> None:
    # What fit-map wrote before: [layers, experts], which KT refuses at boot.
    flat = tmp_path / "flat.pt"
    write_torch_file(flat, {"logical_count": _dense_prefix_counts()})
    done = _kt_masks(kt_runtime, flat)
    assert "Expected activation counts tensor with 3 dims" in done.get("error", ""), done
    # A .json is not read at all: KT places uniformly, which `harness validate` refuses.
    as_json = tmp_path / "counts.json"
    as_json.write_text(json.dumps({"logical_count": _dense_prefix_counts().tolist()}))
    done = _kt_masks(kt_runtime, as_json)
    assert "error" not in done, done
    assert any("WITHOUT activation frequency data" in line for line in done["log"])


def test_the_harness_refuses_exactly_the_frequency_files_kts_loader_refuses(
    kt_runtime: KtRuntime,
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
        done = _kt_masks(kt_runtime, path)
        assert (ours is None) == ("error" not in done), (path.name, ours, done)
        if ours is not None:
            assert "doesn't match model" in done["error"], done


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
    kt_runtime: KtRuntime,
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
    placements, cases, printed = [], [], {}
    for label, decay in HALF_LIVES.items():
        frequency = tmp_path / f"kt-{label}.pt"
        fit = ["--format", "kt-frequency", "--top", f"{GPU_PER_LAYER}", "-o", str(frequency)]
        code, text = cli("fit-map", str(calibration), *decay, *fit, "--score", str(held))
        assert code == 0, text
        printed[label] = next(line for line in text.splitlines() if line.startswith("coverage "))
        for name, config in configs.items():
            shape = logical_count_shape(frequency)
            assert kt_frequency_refusal(shape, json.loads(config.read_text())) is None
            job = {"config": json.loads(config.read_text()), "init": str(frequency),
                   "per_layer": GPU_PER_LAYER}  # fmt: skip
            answer = kt_runtime.ask("masks", **job)
            assert "error" not in answer, answer
            placements.append(answer["value"])
            cases.append((label, name))
    moe = range(V2_LITE["first_k_dense_replace"], V2_LITE["num_hidden_layers"])
    budget = GPU_PER_LAYER * len(moe)
    held_trace = load_trace(held)
    differ, lines = {}, {}
    for (label, name), placed in zip(cases, placements, strict=True):
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


def run_kt_recorder(
    runtime: KtRuntime, folder: Path, routing: Any, masks: Any, experts: int
) -> Path:
    """KT's own recorder (sglang-kt's expert_distribution module, imported whole) over
    ``routing`` [passes][layers][tokens][top-k] and ``masks`` [passes][layers][experts], on
    rank 0; the folder its dump went to."""
    out = folder / "dumps"
    answer = runtime.ask("record", out_dir=str(out), routing=routing, masks=masks, experts=experts)
    assert "error" not in answer, answer
    return out


def test_kts_own_recorder_writes_the_two_files_whose_hits_the_harness_reads(
    kt_runtime: KtRuntime,
    tmp_path: Path,
) -> None:
    # A KT server's dump is two files: the counts, and the GPU masks of every pass beside
    # them. KT's own recorder writes both; the harness reads them with the sglang-kt
    # profile's globs, as finish_recording does, into route counts and GPU hits and misses.
    passes, layers, tokens, top_k, experts = 4, 3, 6, 2, 8
    rng = np.random.default_rng(23)
    routing = np.array([[[rng.choice(experts, top_k, replace=False) for _ in range(tokens)]
                         for _ in range(layers)] for _ in range(passes)])  # fmt: skip
    masks = rng.random((passes, layers, experts)) < 0.4  # dynamic placement moves them
    out = run_kt_recorder(kt_runtime, tmp_path, routing.tolist(), masks.tolist(), experts)
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
