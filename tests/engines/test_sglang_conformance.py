"""SGLang's released sources judge the flags the sglang profile sends and the dumps it reads.

No SGLang server runs on a CPU, but parts of it need no GPU. The released wheel (sglang
0.5.23) is downloaded once (``pip download --no-deps``, into the harness cache) and read, or
installed whole and imported, at run time; nothing of theirs is copied here.

- Its server arguments are annotated fields of dataclasses (``srt/arg_groups/fields/*.py``; a
  field ``tp_size`` is the flag ``--tp-size``, ``Arg(aliases=[...])`` adds others), read with
  ``ast``: a profile flag no field declares is one the build refuses at boot
  (``--enable-expert-distribution-metrics`` was, until this test). KTransformers' build
  (sglang-kt 0.7.2) still declares them with ``add_argument`` in ``srt/server_args.py``; the
  sglang-kt profile's flags are read against those (``--kt-expert-frequency-file`` was offered
  until this test).
- Its expert-distribution recorder: the module ``sglang.srt.eplb.expert_distribution``,
  imported whole from the wheel installed as shipped (``tests/engines/sglang_site.py``), in
  vLLM's venv (real CPU torch), on two tensor-parallel ranks (one process each, over gloo). Each
  rank parses the server arguments of a ``--tp-size 2`` boot with the recorder's mode
  (``prepare_server_args``) and publishes them as a scheduler of its rank does
  (``runtime_context.publish``); SGLang's ``ExpertDistributionRecorder.init_new`` makes the
  recorder, which is started, fed the same routing on both ranks through its forward-pass,
  layer and ``on_select_experts`` hooks as TP ranks are, stopped and dumped (``dump_record``).
  What they dump (rank 0's all-reduced counts in stat mode, a file of passes per rank in
  per_pass mode) is read by the harness's own reader: the counts are twice the routing, and the
  profile's ``replicas_knob`` divides them back. Stood in: what ``sglang_site.py`` stands in for
  (``sgl_kernel``, ``torchvision``, the GPU; its docstring says why), the expert-location
  metadata (a plain object of the fields the recorder reads: one logical expert per physical
  one), and, in the recorder's module only, its counts and buffers, which it allocates on the
  server's "cuda", allocated on the CPU, with its device module's ``empty_cache`` and
  stream-capture query answering as an idle GPU's would.
- Its ``--init-expert-location`` loader: ``sglang.srt.eplb.expert_location`` imported whole the
  same way, in one process: for each file ``fit-map --format sglang-pt|sglang-json`` writes for
  a DeepSeek-V2-shaped model with a dense layer 0, the server arguments of a boot with
  ``--init-expert-location`` and ``--ep-num-redundant-experts`` are parsed and published for
  the scheduler of rank 0 (one rank over gloo), SGLang's ``ModelConfig`` reads the model's
  config.json, and ``compute_initial_expert_location_metadata`` (its model registry's
  DeepSeek-V2 class and EPLB algorithms) places the counts as the model runner does at boot.
  Stood in: ``sglang_site.py``'s stand-ins, and the device the module moves the map to (the
  server's "cuda"): this box's CPU.
- Its routed-experts response field: the detokenizer's encoder, the ``SglExt`` model the
  completion response carries it in, and SGLang's own decoder (their modules imported whole the
  same way), run on captured routing; the harness's reader gets the rows back.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from harness.card import load_runtime_profile
from harness.drive.response_routes import decode_routes
from harness.formats.expert_distribution import combine_dumps, read_dump
from harness.runtimes.build_script import cache_root
from harness.runtimes.recorder import per_token_counts
from tests.conftest import REPO
from tests.engines.sglang_site import STAND_INS, ask, close, gpu_env
from tests.engines.sglang_site import site as engine_site
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

RELEASE = "sglang==0.5.23"
DECLARING = ("sglang/srt/arg_groups/", "sglang/srt/server_args.py")


def _wheel() -> Path:
    """The released wheel, downloaded once into the harness cache."""
    folder = cache_root() / "sglang-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("sglang-0.5.23-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", RELEASE,
             "-d", str(folder)],
            check=True, timeout=900,
        )  # fmt: skip
        found = sorted(folder.glob("sglang-0.5.23-*.whl"))
    return found[0]


@pytest.fixture(scope="module")
def declared_flags() -> set[str]:
    """Every flag the released build's argument dataclasses declare."""
    flags: set[str] = set()
    with zipfile.ZipFile(_wheel()) as wheel:
        for member in wheel.namelist():
            if not member.endswith(".py") or not member.startswith(DECLARING):
                continue
            for node in ast.walk(ast.parse(wheel.read(member))):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    flags.add("--" + node.target.id.replace("_", "-"))
                elif (
                    isinstance(node, ast.keyword)
                    and node.arg == "aliases"
                    and isinstance(node.value, ast.List)
                ):
                    flags.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    assert "--tp-size" in flags and "--expert-distribution-recorder-mode" in flags
    return flags


def _profile_flags(name: str) -> set[str]:
    """Every flag a runtime profile can put on a boot's command line: its boot command's, each
    knob's on and off flags, and each file knob's."""
    profile = yaml.safe_load(
        (REPO / f"harness/profiles/data/runtimes/{name}.yaml").read_text(encoding="utf-8")
    )
    sent = {word for word in profile["boot"]["command"] if str(word).startswith("--")}
    sent |= {spec[key] for spec in profile["knobs"].values() for key in ("arg", "off_arg")
             if spec.get(key)}  # fmt: skip
    sent |= {route.split(":", 1)[1] for route in profile.get("files", {}).values()
             if route.startswith("arg:")}  # fmt: skip
    return sent


def test_every_flag_of_the_sglang_profile_is_one_the_release_declares(
    declared_flags: set[str],
) -> None:
    sent = _profile_flags("sglang")
    assert sent - declared_flags == set()
    # The flag 0.5.23 dropped, and what replaced it.
    assert "--enable-expert-distribution-metrics" not in declared_flags
    assert "--expert-balancedness-report-mode" in sent


def test_every_flag_of_the_sglang_eplb_profile_is_one_the_release_declares(
    declared_flags: set[str],
) -> None:
    # EPLB and its rebalance knobs, and none of the recorder's: EPLB owns the recorder there
    # (it sizes the recorder's buffer to its own rebalance period, eplb/eplb_manager.py).
    sent = _profile_flags("sglang-eplb")
    assert sent - declared_flags == set()
    rebalance = {
        "--enable-eplb",
        "--eplb-algorithm",
        "--eplb-rebalance-num-iterations",
        "--eplb-rebalance-layers-per-chunk",
        "--eplb-min-rebalancing-utilization-threshold",
        "--ep-num-redundant-experts",
        "--ep-size",
    }
    assert rebalance <= sent
    assert not {flag for flag in sent if "expert-distribution" in flag}
    assert "--enable-paged-experts" not in sent  # SGLang refuses Paged Experts with EPLB


def _kt_wheel() -> Path:
    """KTransformers' SGLang build, sglang-kt 0.7.2 (the newest release), downloaded once into
    the harness cache beside kt-kernel's (tests/engines/test_kt_conformance.py)."""
    folder = cache_root() / "kt-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("sglang_kt-0.7.2-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "sglang-kt==0.7.2", "-d", str(folder)],
            check=True, timeout=900,
        )  # fmt: skip
        found = sorted(folder.glob("sglang_kt-0.7.2-*.whl"))
    return found[0]


def test_every_flag_of_the_sglang_kt_profile_is_one_its_release_declares() -> None:
    # sglang-kt keeps the older argparse server arguments: each flag is a string given to
    # `parser.add_argument` in its srt/server_args.py (aliases too). A profile flag none of
    # them names is one the build refuses at boot.
    with zipfile.ZipFile(_kt_wheel()) as wheel:
        tree = ast.parse(wheel.read("sglang/srt/server_args.py"))
    declared = {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")
    }
    assert {"--kt-num-gpu-experts", "--init-expert-location", "--model-path"} <= declared
    sent = _profile_flags("sglang-kt")
    assert sent - declared == set()
    # Offered once "in newer builds"; no release has it.
    assert "--kt-expert-frequency-file" not in declared


# Runs in vLLM's venv, once per tensor-parallel rank: the stand-ins, the ranks' gloo group,
# SGLang's expert_distribution module imported whole; then, per line of stdin (a recorder mode,
# a routing and where to dump), the server's arguments as SGLang parses and publishes them for a
# scheduler of that rank, its recorder made, started, fed each pass as the model's forward
# feeds it, stopped and dumped to files; "@@" on stdout when done.
RUN_RECORDER = (
    STAND_INS
    + r"""
import json

rank, world, store, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
from sglang.srt import runtime_context
from sglang.srt.eplb import expert_distribution
from sglang.srt.server_args import prepare_server_args

torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                     world_size=world)

class CpuTorch(types.ModuleType):
    # The recorder's torch, but its counts and buffers (allocated on the server's "cuda")
    # on the CPU, and its device module's cache emptied and stream capture asked of as an
    # idle GPU's would be.
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
for line in sys.stdin:
    job = json.loads(line)
    os.environ["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"] = job["out_dir"]
    args = prepare_server_args(["--model-path", model, "--tp-size", str(world),
                                "--expert-distribution-recorder-mode", job["mode"],
                                "--expert-distribution-recorder-buffer-size", "-1"])
    runtime_context.publish(args, role="scheduler",
                            ranks=runtime_context.SpawnRanks(world_rank=rank, gpu_id=rank))
    routing, experts = job["routing"], job["experts"]  # [passes][layers][tokens][top_k]
    layers = len(routing[0])
    meta = types.SimpleNamespace(num_layers=layers, num_physical_experts=experts,
                                 num_logical_experts=experts, num_local_physical_experts=experts,
                                 physical_to_logical_map=torch.arange(experts).repeat(layers, 1),
                                 ep_size=1)
    recorder = expert_distribution.ExpertDistributionRecorder.init_new(meta, rank)
    recorder.start_record()
    for index, passes in enumerate(routing):
        with recorder.with_forward_pass(index, None):
            for layer, topk_ids in enumerate(passes):
                with recorder.with_current_layer(layer):
                    recorder.on_select_experts(torch.tensor(topk_ids))
    recorder.stop_record()
    recorder.dump_record("file")
    print("@@", flush=True)
torch.distributed.destroy_process_group()
os._exit(0)  # what SGLang registered to run at exit is for a server's shutdown, not this
"""
)
# The model the recorder's server is booted on (what argument resolution reads of it): the
# shape of the routing recorded, 4 layers of 8 experts, 2 per token.
RECORDER_MODEL = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_hidden_layers": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


class _Ranks:
    """SGLang 0.5.23's recorder module imported whole on two TP ranks, one process each."""

    def __init__(self, python: str, folder: Path) -> None:
        release = engine_site("sglang-0.5.23", [_wheel()], python)
        (folder / "model").mkdir()
        (folder / "model" / "config.json").write_text(json.dumps(RECORDER_MODEL))
        self.logs = [folder / f"rank{rank}.txt" for rank in (0, 1)]
        self.ranks = []
        for rank, log in enumerate(self.logs):
            with log.open("w") as errors:
                self.ranks.append(
                    subprocess.Popen(
                        [python, "-c", RUN_RECORDER, str(rank), "2", str(folder / "store"),
                         str(folder / "model")],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
                        env=gpu_env(folder, [release]),
                    )
                )  # fmt: skip

    def record(self, **job: Any) -> None:
        """Both ranks record the same job; returns once both have dumped."""
        for rank in self.ranks:
            assert rank.stdin is not None
            rank.stdin.write(json.dumps(job) + "\n")
            rank.stdin.flush()
        for rank, log in zip(self.ranks, self.logs, strict=True):
            assert rank.stdout is not None
            if not any(line.startswith("@@") for line in rank.stdout):
                raise AssertionError(log.read_text()[-4000:])

    def close(self) -> None:
        # Every rank's input closed before any is waited for: a rank ends with its peer.
        for rank in self.ranks:
            assert rank.stdin is not None
            rank.stdin.close()
        for rank in self.ranks:
            close(rank)


@pytest.fixture(scope="module")
def tp_ranks(
    torch_python: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_Ranks]:
    ranks = _Ranks(torch_python, tmp_path_factory.mktemp("sglang-ranks"))
    yield ranks
    ranks.close()


@pytest.mark.parametrize("mode", ["stat", "per_pass"])
def test_sglangs_own_recorder_sums_tp_ranks(
    tp_ranks: _Ranks,
    tmp_path: Path,
    mode: str,
) -> None:
    # SGLang's own recorder, on two TP ranks: the counts are twice the routing, and the
    # profile's replicas_knob (tp_size) divides them back. In stat mode rank 0 writes the
    # all-reduced counts; in per_pass mode each rank writes its own file of passes.
    passes, layers, tokens, top_k, experts = 3, 4, 5, 2, 8
    rng = np.random.default_rng(11)
    routing = np.stack([
        np.stack([
            np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])
            for _ in range(layers)
        ])
        for _ in range(passes)
    ])  # fmt: skip
    out = tmp_path / "dumps"
    tp_ranks.record(mode=mode, routing=routing.tolist(), experts=experts, out_dir=str(out))
    dumps = sorted(out.glob("expert_distribution_recorder_*.pt"))
    assert len(dumps) == (1 if mode == "stat" else 2), dumps  # rank 0's, or one per rank
    true = np.zeros((passes, layers, experts), dtype=np.int64)
    for p, layer in np.ndindex(passes, layers):
        np.add.at(true[p, layer], routing[p, layer].ravel(), 1)
    dist = combine_dumps([read_dump(dump) for dump in dumps], str(out))
    assert np.array_equal(dist.counts, 2 * true)  # SGLang's all-reduce sums both TP ranks
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/sglang.yaml")
    recorder = profile.telemetry.expert_recorder
    assert recorder is not None
    assert np.array_equal(per_token_counts(dist, recorder, {"tp_size": "2"}).counts, true)


# Runs in vLLM's venv: the stand-ins, then the three modules imported whole: SGLang's own encoder
# of a request's captured routing (DetokenizerManager._b64_encode_per_request,
# srt/managers/detokenizer_manager.py), the response extension it lands in (SglExt,
# srt/entrypoints/openai/protocol.py: a CompletionResponse's `sglext`), and SGLang's own decoder
# for users (extract_routed_experts_from_meta_info, srt/state_capturer/routed_experts.py).
RUN_ROUTES = (
    STAND_INS
    + r"""
import json
import torch
from sglang.srt.entrypoints.openai.protocol import SglExt
from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.state_capturer.routed_experts import extract_routed_experts_from_meta_info

routing = torch.tensor(json.load(open(sys.argv[1])), dtype=torch.int32)  # [rows, layers, top_k]
(encoded,) = DetokenizerManager._b64_encode_per_request([routing])
body = {"sglext": SglExt(routed_experts=encoded).model_dump(mode="json")}
decoded = extract_routed_experts_from_meta_info({"meta_info": {"routed_experts": encoded}})
print("@@" + json.dumps({"body": body, "decoded": decoded.tolist()}))
"""
)


def test_sglangs_own_routing_serializer_is_what_the_harness_decodes(
    torch_python: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    # `collect --routes-from-responses` on SGLang reads `sglext.routed_experts`: SGLang's own
    # encoder writes it, from the capturer's [tokens, layers, top_k] int32 rows, and the
    # harness's reader gets those rows back; SGLang's own decoder agrees on the flat ids.
    release = engine_site("sglang-0.5.23", [_wheel()], torch_python)
    rows, layers, top_k, experts = 7, 3, 2, 16
    rng = np.random.default_rng(3)
    routing = np.array([[rng.choice(experts, top_k, replace=False) for _ in range(layers)]
                        for _ in range(rows)])  # fmt: skip
    (tmp_path / "routing.json").write_text(json.dumps(routing.tolist()))
    done = subprocess.run(
        [torch_python, "-c", RUN_ROUTES, str(tmp_path / "routing.json")],
        capture_output=True, text=True, timeout=300, check=False,
        env=gpu_env(tmp_path, [release]),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = next(line for line in done.stdout.splitlines() if line.startswith("@@"))
    out = json.loads(answer[2:])
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/sglang.yaml")
    spec = profile.telemetry.response_routes
    assert spec is not None
    got = decode_routes(out["body"], spec, rows, "request 1", top_k=top_k)
    assert np.array_equal(got, routing)
    assert np.array_equal(got.ravel(), np.array(out["decoded"]))


# Runs in vLLM's venv, one process for the module: the stand-ins, a gloo group of one rank,
# then per line of stdin (an --init-expert-location file) the server's arguments as SGLang
# parses and publishes them for the scheduler of rank 0, its ModelConfig of the model, and its
# sglang.srt.eplb.expert_location (imported whole) computing the initial expert location as
# the model runner does at boot; the physical-to-logical map on stdout after "@@".
RUN_LOCATION = (
    STAND_INS
    + r"""
import json

model, store, redundant = sys.argv[1], sys.argv[2], sys.argv[3]
from sglang.srt import runtime_context
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.eplb import expert_location
from sglang.srt.server_args import prepare_server_args

torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
# Where the server's device would hold the map: this box's CPU.
expert_location.get_device = lambda: types.SimpleNamespace(device="cpu")
for line in sys.stdin:
    init_file = json.loads(line)
    args = prepare_server_args(["--model-path", model, "--init-expert-location", init_file,
                                "--ep-num-redundant-experts", redundant])
    runtime_context.publish(args, role="scheduler",
                            ranks=runtime_context.SpawnRanks(world_rank=0, gpu_id=0))
    meta = expert_location.compute_initial_expert_location_metadata(
        ModelConfig.from_server_args(args), moe_ep_rank=0)
    print("@@" + json.dumps(meta.physical_to_logical_map.tolist()), flush=True)
torch.distributed.destroy_process_group()
os._exit(0)  # what SGLang registered to run at exit is for a server's shutdown, not this
"""
)
LOCATION_LAYERS, LOCATION_EXPERTS, LOCATION_DENSE, LOCATION_REDUNDANT = 4, 8, 1, 2
# A DeepSeek-V2-shaped model's config.json (layer 0 dense), what the loader reads of the model.
LOCATION_MODEL = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "num_hidden_layers": LOCATION_LAYERS,
    "n_routed_experts": LOCATION_EXPERTS,
    "first_k_dense_replace": LOCATION_DENSE,
    "moe_layer_freq": 1,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


class _Loader:
    """SGLang 0.5.23's expert-location loader, imported whole in one process."""

    def __init__(self, python: str, folder: Path) -> None:
        release = engine_site("sglang-0.5.23", [_wheel()], python)
        (folder / "model").mkdir()
        (folder / "model" / "config.json").write_text(json.dumps(LOCATION_MODEL))
        self.log = folder / "stderr.txt"
        with self.log.open("w") as errors:
            self.process = subprocess.Popen(
                [python, "-c", RUN_LOCATION, str(folder / "model"), str(folder / "store"),
                 str(LOCATION_REDUNDANT)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
                env=gpu_env(folder, [release]),
            )  # fmt: skip

    def place(self, init_file: Path) -> list[list[int]]:
        """The physical-to-logical map SGLang boots with from ``init_file``."""
        placed: list[list[int]] = ask(self.process, str(init_file), self.log)
        return placed

    def close(self) -> None:
        close(self.process)


@pytest.fixture(scope="module")
def location_loader(
    torch_python: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_Loader]:
    loader = _Loader(torch_python, tmp_path_factory.mktemp("sglang-location"))
    yield loader
    loader.close()


@pytest.mark.parametrize("source", ["counts", "decayed"])
@pytest.mark.parametrize("suffix", ["pt", "json"])
def test_sglangs_own_loader_takes_fit_maps_counts_for_a_dense_prefix_model(
    location_loader: _Loader,
    tmp_path: Path,
    suffix: str,
    source: str,
) -> None:
    # `fit-map --format sglang-pt|sglang-json` writes SGLang's --init-expert-location counts;
    # SGLang's own loader (compute_initial_expert_location_metadata -> init_by_eplb -> its EPLB
    # algorithm) places them for a DeepSeek-shaped model whose layer 0 is dense: every layer
    # holds every expert, and the redundant slots go to each MoE layer's hottest experts by the
    # counts the harness wrote (one slot at a time, to the most count per replica), so the file
    # is read the right way round. Decayed counts (a trace fitted with a half-life) are written
    # as float32 fractions, which it takes as it takes integers.
    from harness.formats.expert_distribution import read_logical_count
    from harness.formats.maps import write_count_dump
    from tests.sim.test_fitmap import cli

    layers, experts = LOCATION_LAYERS, LOCATION_EXPERTS
    dense, redundant = LOCATION_DENSE, LOCATION_REDUNDANT
    init = tmp_path / f"location.{suffix}"
    fit = ["--format", f"sglang-{suffix}", "-o", str(init)]
    if source == "counts":
        counts = np.random.default_rng(9).permutation(layers * experts).reshape(layers, experts)
        counts = counts + 1
        counts[:dense] = 0
        dump = tmp_path / "counts.json"
        write_count_dump(dump, counts, 1.0)
        code, text = cli("fit-map", str(dump), *fit)
    else:
        rng = np.random.default_rng(9)
        popular = [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]
        routing = np.array([[rng.choice(experts, 2, replace=False, p=popular)
                             for _ in range(dense, layers)] for _ in range(12)])  # fmt: skip
        trace = tmp_path / "trace.npz"
        np.savez(trace, experts=routing, moe_layers=np.arange(dense, layers), dense_layers=[0])
        code, text = cli("fit-map", str(trace), "--decay-half-life-steps", "2", *fit)
        assert "decay-weighted" in text
    assert code == 0, text
    written = read_logical_count(init)
    assert source == "counts" or not np.array_equal(written, np.rint(written))
    placed = np.array(location_loader.place(init))
    assert placed.shape == (layers, experts + redundant)
    for layer in range(layers):
        assert set(placed[layer]) == set(range(experts)), layer
    for layer in range(dense, layers):
        replicas = np.bincount(placed[layer], minlength=experts)
        expected = np.ones(experts)
        for _ in range(redundant):
            expected[np.argmax(written[layer] / expected)] += 1
        assert replicas.tolist() == expected.tolist(), (layer, replicas, written[layer])
