"""SGLang's released sources judge the flags the sglang profile sends and the dumps it reads.

No SGLang server runs on a CPU, but two parts of it need no GPU. The released wheel (sglang
0.5.23) is downloaded once (``pip download --no-deps``, into the harness cache) and read at run
time; nothing of theirs is copied here.

- Its server arguments are annotated fields of dataclasses (``srt/arg_groups/fields/*.py``; a
  field ``tp_size`` is the flag ``--tp-size``, ``Arg(aliases=[...])`` adds others), read with
  ``ast``: a profile flag no field declares is one the build refuses at boot
  (``--enable-expert-distribution-metrics`` was, until this test). KTransformers' build
  (sglang-kt 0.7.2) still declares them with ``add_argument`` in ``srt/server_args.py``; the
  sglang-kt profile's flags are read against those (``--kt-expert-frequency-file`` was offered
  until this test).
- Its expert-distribution recorder (``srt/eplb/expert_distribution.py``): the single-pass
  gatherer that counts ``topk_ids``, the stat and per-pass accumulators and ``_dump_to_file``
  are taken out of the source unchanged and run in vLLM's venv (real torch) on two
  tensor-parallel ranks over gloo, each recording the same routing as TP ranks do. What they
  dump (rank 0's all-reduced counts in stat mode, a file of passes per rank in per_pass mode) is
  read by the harness's own reader: the counts are twice the routing, and the profile's
  ``replicas_knob`` divides them back.
- Its ``--init-expert-location`` loader (``srt/eplb/expert_location.py`` and its EPLB
  algorithms, imported unchanged from the wheel's files, the server's runtime context given):
  the counts ``fit-map --format sglang-pt|sglang-json`` writes, for a dense-prefix model.
- Its routed-experts response field: the detokenizer's encoder, the ``SglExt`` model the
  completion response carries it in, and SGLang's own decoder, run the same way on captured
  routing; the harness's reader gets the rows back.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.card import load_runtime_profile
from harness.drive.response_routes import decode_routes
from harness.formats.expert_distribution import combine_dumps, read_dump
from harness.runtimes.build_script import cache_root
from harness.runtimes.recorder import per_token_counts
from tests.conftest import REPO
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


# Runs in vLLM's venv, once per rank: SGLang's recorder pieces from the released source, the
# server's surroundings (its arguments, device, env) given as SGLang's own defaults for a
# stat recording on CPU.
RUN_RECORDER = r"""
import ast, json, logging, math, sys, time, types, typing
from abc import ABC
from pathlib import Path
import torch
import torch.distributed

source_path, rank, world, store, out_dir, routing_path, experts, mode = sys.argv[1:9]
rank, world = int(rank), int(world)
torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                     world_size=world)
source = open(source_path, encoding="utf-8").read()
wanted = {"_SinglePassGatherer", "_LayerBasedGpuSinglePassGatherer",
          "_SelectExpertsSinglePassGatherer", "_Accumulator", "_UtilizationRateAccumulatorMixin",
          "_StatAccumulator", "_Buffer", "_CircularBuffer", "_InfiniteBuffer", "_dump_to_file",
          "_convert_global_physical_count_to_logical_count", "_DetailAccumulator"}
tree = ast.parse(source)
code = "from __future__ import annotations\n" + "\n\n".join(
    ast.get_source_segment(source, node) for node in tree.body
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted)
moe = types.SimpleNamespace(expert_distribution_recorder_mode=mode,
                            expert_distribution_recorder_buffer_size=-1,
                            moe_a2a_backend="none",
                            eplb_min_rebalancing_utilization_threshold=1.0)
space = {"torch": torch, "math": math, "time": time, "Path": Path, "ABC": ABC,
         "logger": logging.getLogger("sglang"), "_SINGLE_PASS_GATHERER_KEY_PRIMARY": "primary",
         "get_exec": lambda: types.SimpleNamespace(moe=moe),
         "get_device": lambda: "cpu",
         "get_device_namespace": lambda: types.SimpleNamespace(device="cpu"),
         "reports_expert_balancedness": lambda: False,
         "envs": types.SimpleNamespace(SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR=
                                       types.SimpleNamespace(get=lambda: out_dir))}
space.update({name: getattr(typing, name) for name in typing.__all__})
torch.get_device_module = lambda *a: types.SimpleNamespace(empty_cache=lambda: None)
exec(code, space)
routing = json.load(open(routing_path))  # [passes][layers][tokens][top_k]
layers, experts = len(routing[0]), int(experts)
meta = types.SimpleNamespace(num_layers=layers, num_physical_experts=experts,
                             num_logical_experts=experts, num_local_physical_experts=experts,
                             physical_to_logical_map=torch.arange(experts).repeat(layers, 1),
                             ep_size=1)
gatherer = space["_SelectExpertsSinglePassGatherer"](meta, rank)
# SGLang's own choice of accumulator for the mode (_Accumulator.get_class): stat sums the
# passes over ranks; per_pass keeps each pass, each rank writing a file of its own.
accumulator = space["_StatAccumulator" if mode == "stat" else "_DetailAccumulator"](meta, rank)
for index, passes in enumerate(routing):
    gatherer.reset()
    for layer, topk_ids in enumerate(passes):
        gatherer.on_select_experts(layer, torch.tensor(topk_ids))
    accumulator.append(index, "primary", gatherer.collect(), {})
accumulator.dump("file")
torch.distributed.destroy_process_group()
"""


@pytest.mark.parametrize("mode", ["stat", "per_pass"])
def test_sglangs_own_recorder_sums_tp_ranks(
    torch_python: str,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    # SGLang's own gatherer, accumulator and dump, on two TP ranks: the counts are twice the
    # routing, and the profile's replicas_knob (tp_size) divides them back. In stat mode rank 0
    # writes the all-reduced counts; in per_pass mode each rank writes its own file of passes.
    with zipfile.ZipFile(_wheel()) as wheel:
        source = tmp_path / "expert_distribution.py"
        source.write_bytes(wheel.read("sglang/srt/eplb/expert_distribution.py"))
    passes, layers, tokens, top_k, experts = 3, 4, 5, 2, 8
    rng = np.random.default_rng(11)
    routing = np.stack([
        np.stack([
            np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])
            for _ in range(layers)
        ])
        for _ in range(passes)
    ])  # fmt: skip
    (tmp_path / "routing.json").write_text(json.dumps(routing.tolist()))
    out = tmp_path / "dumps"
    ranks = [
        subprocess.Popen(
            [
                torch_python,
                "-c",
                RUN_RECORDER,
                str(source),
                str(rank),
                "2",
                str(tmp_path / "store"),
                str(out),
                str(tmp_path / "routing.json"),
                str(experts),
                mode,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=300)
        assert rank.returncode == 0, err
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


# Runs in vLLM's venv: SGLang's own encoder of a request's captured routing
# (DetokenizerManager._b64_encode_per_request, srt/managers/detokenizer_manager.py), the
# response extension it lands in (SglExt, srt/entrypoints/openai/protocol.py: a
# CompletionResponse's `sglext`), and SGLang's own decoder for users
# (extract_routed_experts_from_meta_info, srt/state_capturer/routed_experts.py). pybase64, which
# SGLang imports for speed, is the standard library's base64 here (its drop-in API).
RUN_ROUTES = r"""
import ast, base64, json, sys, textwrap, typing
import numpy as np
import pydantic
import torch

detokenizer, protocol, capturer, routing_path = sys.argv[1:5]

def member(path, name, within=None):
    source = open(path, encoding="utf-8").read()
    body = ast.parse(source).body
    if within is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == within).body
    node = next(n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                and n.name == name)
    lines = [l for l in textwrap.dedent(ast.get_source_segment(source, node, padded=True))
             .splitlines() if not l.lstrip().startswith("@staticmethod")]
    return "\n".join(lines)

space = {"pybase64": base64, "torch": torch, "np": np, "__name__": "sglang_protocol"}
space.update({name: getattr(pydantic, name) for name in pydantic.__all__})
space.update({name: getattr(typing, name) for name in typing.__all__})
code = "\n\n".join(member(path, name, within) for path, name, within in (
    (detokenizer, "_b64_encode_per_request", "DetokenizerManager"),
    (protocol, "CachedTokensDetails", None),
    (protocol, "SpecTokensDetails", None),
    (protocol, "SglExt", None),
    (capturer, "extract_routed_experts_from_meta_info", None)))
exec("from __future__ import annotations\n" + code, space)
for model in ("CachedTokensDetails", "SpecTokensDetails", "SglExt"):
    space[model].model_rebuild(_types_namespace=space)
routing = torch.tensor(json.load(open(routing_path)), dtype=torch.int32)  # [rows, layers, top_k]
(encoded,) = space["_b64_encode_per_request"]([routing])
body = {"sglext": space["SglExt"](routed_experts=encoded).model_dump(mode="json")}
decoded = space["extract_routed_experts_from_meta_info"]({"meta_info": {"routed_experts": encoded}})
print(json.dumps({"body": body, "decoded": decoded.tolist()}))
"""


def test_sglangs_own_routing_serializer_is_what_the_harness_decodes(
    torch_python: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    # `collect --routes-from-responses` on SGLang reads `sglext.routed_experts`: SGLang's own
    # encoder writes it, from the capturer's [tokens, layers, top_k] int32 rows, and the
    # harness's reader gets those rows back; SGLang's own decoder agrees on the flat ids.
    members = {
        "detokenizer": "sglang/srt/managers/detokenizer_manager.py",
        "protocol": "sglang/srt/entrypoints/openai/protocol.py",
        "capturer": "sglang/srt/state_capturer/routed_experts.py",
    }
    paths = {}
    with zipfile.ZipFile(_wheel()) as wheel:
        for key, member in members.items():
            paths[key] = tmp_path / f"{key}.py"
            paths[key].write_bytes(wheel.read(member))
    rows, layers, top_k, experts = 7, 3, 2, 16
    rng = np.random.default_rng(3)
    routing = np.array([[rng.choice(experts, top_k, replace=False) for _ in range(layers)]
                        for _ in range(rows)])  # fmt: skip
    (tmp_path / "routing.json").write_text(json.dumps(routing.tolist()))
    done = subprocess.run(
        [torch_python, "-c", RUN_ROUTES, str(paths["detokenizer"]), str(paths["protocol"]),
         str(paths["capturer"]), str(tmp_path / "routing.json")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/sglang.yaml")
    spec = profile.telemetry.response_routes
    assert spec is not None
    got = decode_routes(out["body"], spec, rows, "request 1", top_k=top_k)
    assert np.array_equal(got, routing)
    assert np.array_equal(got.ravel(), np.array(out["decoded"]))


# Runs in vLLM's venv with the released eplb package (expert_location.py and eplb_algorithms/,
# unchanged) importable as sglang.srt.eplb. What a server would have set up around it is given:
# its runtime context (the --init-expert-location path, redundant experts, one EP rank over
# gloo, on CPU), no elastic EP, and the model class's get_model_config_for_expert_location,
# taken from DeepSeek-V2's source (num_hidden_layers rows, dense layers included).
RUN_LOCATION = r"""
import ast, json, sys, textwrap, types
import torch

root, deepseek, init_file, layers, experts, redundant, store = sys.argv[1:8]
sys.path.insert(0, root)
torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
ns = types.SimpleNamespace
moe = ns(init_expert_location=init_file, ep_num_redundant_experts=int(redundant),
         eplb_algorithm="auto", ep_dispatch_algorithm="static", ep_join_mode="none",
         moe_a2a_backend="none")
context = types.ModuleType("sglang.srt.runtime_context")
context.get_device = lambda: ns(device="cpu")
context.get_exec = lambda: ns(moe=moe)
context.get_parallel = lambda: ns(ep_size=1, nnodes=1, elastic_ep_initial_size=None, tp_size=1)
context.get_resources = lambda: ns()
sys.modules["sglang.srt.runtime_context"] = context
elastic = types.ModuleType("sglang.srt.elastic_ep.elastic_ep")
elastic.elastic_expanded_world_enabled = lambda: False
sys.modules["sglang.srt.elastic_ep"] = types.ModuleType("sglang.srt.elastic_ep")
sys.modules["sglang.srt.elastic_ep.elastic_ep"] = elastic
from sglang.srt.eplb import expert_location

source = open(deepseek, encoding="utf-8").read()
method = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)
              and n.name == "get_model_config_for_expert_location")
space = {"ModelConfigForExpertLocation": expert_location.ModelConfigForExpertLocation}
exec(textwrap.dedent(ast.get_source_segment(source, method, padded=True)), space)
model_class = ns(get_model_config_for_expert_location=
                 lambda config: space["get_model_config_for_expert_location"](None, config))
loader = types.ModuleType("sglang.srt.model_loader")
loader.get_model_architecture = lambda model_config: (model_class, "DeepseekV2ForCausalLM")
sys.modules["sglang.srt.model_loader"] = loader
hf = ns(num_hidden_layers=int(layers), n_routed_experts=int(experts), n_group=None)
meta = expert_location.compute_initial_expert_location_metadata(ns(hf_config=hf), moe_ep_rank=0)
print(json.dumps(meta.physical_to_logical_map.tolist()))
"""


@pytest.mark.parametrize("source", ["counts", "decayed"])
@pytest.mark.parametrize("suffix", ["pt", "json"])
def test_sglangs_own_loader_takes_fit_maps_counts_for_a_dense_prefix_model(
    torch_python: str,  # noqa: F811
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

    layers, experts, dense, redundant = 4, 8, 1, 2
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
    root = tmp_path / "site"
    with zipfile.ZipFile(_wheel()) as wheel:
        for member in wheel.namelist():
            if member.startswith("sglang/srt/eplb/") and member.endswith(".py"):
                (root / member).parent.mkdir(parents=True, exist_ok=True)
                (root / member).write_bytes(wheel.read(member))
        deepseek = tmp_path / "deepseek_v2.py"
        deepseek.write_bytes(wheel.read("sglang/srt/models/deepseek_v2.py"))
    for package in ("sglang", "sglang/srt"):
        (root / package / "__init__.py").touch()
    done = subprocess.run(
        [torch_python, "-c", RUN_LOCATION, str(root), str(deepseek), str(init), str(layers),
         str(experts), str(redundant), str(tmp_path / "store")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    placed = np.array(json.loads(done.stdout))
    assert placed.shape == (layers, experts + redundant)
    for layer in range(layers):
        assert set(placed[layer]) == set(range(experts)), layer
    for layer in range(dense, layers):
        replicas = np.bincount(placed[layer], minlength=experts)
        expected = np.ones(experts)
        for _ in range(redundant):
            expected[np.argmax(written[layer] / expected)] += 1
        assert replicas.tolist() == expected.tolist(), (layer, replicas, written[layer])
