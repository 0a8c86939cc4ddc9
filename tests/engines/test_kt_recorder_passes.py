"""KTransformers' own recorder judges how the harness pairs and reads its passes: a mask per
counted pass, and the prefills KT runs wholly on the GPU left out of the hit rate.

sglang-kt 0.7.2's recorder (``sglang/srt/eplb/expert_distribution.py``) appends, at the end of
every forward pass, the pass's counts and its GPU mask, each into a buffer of
``expert_distribution_recorder_buffer_size`` passes, and its ``dump_record`` writes the two to
two files: they are one length, pass i with pass i. Its recorder runs here as
``tests/engines/test_kt_conformance.py`` runs it: the module imported whole from the installed
wheel in vLLM's venv, the recorder made by ``ExpertDistributionRecorder.init_new`` on rank 0,
each pass recorded through its own hooks and dumped by its ``dump_record`` (what stands in, and
why, is said there and in ``tests/engines/sglang_site.py``).

With ``--kt-gpu-prefill-token-threshold N`` (N > 0), its ``kt_ep_wrapper.py`` (``apply``)
records each MoE layer's mask of the partial placement and then, for a pass of N tokens or more,
loads the layer whole onto the GPU and computes every expert there: the recorded mask calls
misses what ran on the GPU. That gate is read from the wheel's source (it needs a GPU and the
layer's weights to run), as are the recorder's pass end and the build's EPLB check;
the recorder then records such a pass as KT's code records it.
"""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.boxes.local import LocalBox
from harness.card import load_runtime_profile
from harness.errors import BadInput
from harness.formats.expert_distribution import combine_dumps, gpu_hits, read_dump
from harness.profiles.box import BoxSpec
from harness.runtimes.build_script import cache_root
from harness.runtimes.recorder import (
    FULL_GPU_COUNTER,
    per_token_counts,
    router_top_k,
    run_counters,
)
from tests.conftest import REPO
from tests.engines.test_kt_conformance import (
    KtRuntime,
    kt_runtime,  # noqa: F401 - the fixture
    run_kt_recorder,
)
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

PROFILE = REPO / "harness" / "profiles" / "data" / "runtimes" / "sglang-kt.yaml"
LAYERS, EXPERTS, TOP_K = 3, 8, 2


def _wheel_source(member: str) -> str:
    (wheel,) = sorted((cache_root() / "kt-wheels").glob("sglang_kt-0.7.2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode()


def _record(
    runtime: KtRuntime, folder: Path, tokens: list[int], masks: np.ndarray, seed: int
) -> tuple[list[Path], np.ndarray]:
    """KT's recorder over passes of ``tokens`` tokens each (every layer routed, ``masks`` the
    GPU experts per pass and layer): its dump's files, and the true counts."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    routing = [
        [[rng.choice(EXPERTS, TOP_K, replace=False).tolist() for _ in range(n)]
         for _ in range(LAYERS)]
        for n in tokens
    ]  # fmt: skip
    out = run_kt_recorder(runtime, folder, routing, masks.tolist(), EXPERTS)
    recorder = load_runtime_profile(PROFILE).telemetry.expert_recorder
    assert recorder is not None
    files = sorted({p for pattern in recorder.glob for p in out.glob(pattern)})
    true = np.zeros((len(tokens), LAYERS, EXPERTS), dtype=np.int64)
    for index, passes in enumerate(routing):
        for layer, ids in enumerate(passes):
            np.add.at(true[index, layer], np.asarray(ids, dtype=np.int64).ravel(), 1)
    return files, true


def test_kts_recorder_writes_a_mask_per_counted_pass_and_other_pairings_are_refused(
    kt_runtime: KtRuntime,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Both buffers take the same size from the same server argument, and one pass appends to
    # both (its _on_forward_pass_end): the two files of one dump are one length.
    source = _wheel_source("sglang/srt/eplb/expert_distribution.py")
    tree = ast.parse(source)
    end = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "_on_forward_pass_end"
    )
    body = ast.unparse(end)
    assert (
        "self._accumulator.append(" in body and "self._gpu_expert_mask_accumulator.append(" in body
    )
    assert "server_args.expert_distribution_recorder_buffer_size or 1000" in source
    rng = np.random.default_rng(3)
    first, true = _record(
        kt_runtime, tmp_path / "a", [4, 1, 1, 1], rng.random((4, LAYERS, EXPERTS)) < 0.5, 1
    )
    second, _ = _record(
        kt_runtime, tmp_path / "b", [3, 1, 1], rng.random((3, LAYERS, EXPERTS)) < 0.5, 2
    )
    counts_a, masks_a = (next(p for p in first if p.name.startswith(s)) for s in ("exp", "gpu"))
    masks_b = next(p for p in second if p.name.startswith("gpu"))
    own = combine_dumps([read_dump(counts_a), read_dump(masks_a)], "a")
    assert own.masks is not None and own.counts.shape[0] == own.masks.shape[0] == 4
    masks = read_dump(masks_a).masks
    hits = int((true * masks).sum())
    assert gpu_hits(own) == (hits, int(true.sum()) - hits)
    # Another dump's masks (three passes) with these counts (four): refused, both named.
    mixed = combine_dumps([read_dump(counts_a), read_dump(masks_b)], "mixed")
    with pytest.raises(BadInput) as caught:
        gpu_hits(mixed)
    message = str(caught.value)
    assert f"{masks_b}: gpu_expert_masks holds 3 passes" in message, message
    assert f"{counts_a}: logical_count 4" in message, message


def test_kts_full_gpu_gate_follows_the_mask_it_records() -> None:
    # In KT's MoE apply, the mask of the partial placement is recorded first; then a pass of
    # at least the threshold's tokens (the batch's rows), with a threshold above 0, takes the
    # full-GPU path and returns before any CPU expert runs.
    source = _wheel_source("sglang/srt/layers/moe/kt_ep_wrapper.py")
    applies = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef)
        and n.name == "apply"
        and any(
            isinstance(t, ast.Name) and t.id == "_full_gpu_gate"
            for a in ast.walk(n)
            if isinstance(a, ast.Assign)
            for t in a.targets
        )
    ]
    (apply,) = applies
    text = ast.unparse(apply)
    recorded = text.index(
        "recorder.on_gpu_expert_mask(self.kt_config.layer_idx, self.gpu_experts_mask_cuda)"
    )
    gate = text.index("_full_gpu_gate = ")
    assert recorded < gate
    gate_text = text[gate : text.index("\n", gate + 200)]
    assert "self.gpu_prefill_token_threshold > 0" in gate_text
    assert "num_tokens >= self.gpu_prefill_token_threshold" in gate_text
    assert "num_tokens = int(x.shape[0]) if x.dim() > 0 else 0" in text
    assert "x = dispatch_output.hidden_states" in text


def test_a_prefill_kt_ran_wholly_on_the_gpu_is_left_out_of_the_hit_rate(
    kt_runtime: KtRuntime,  # noqa: F811
    tmp_path: Path,
) -> None:
    # A 12-token prefill over a threshold of 8, a 5-token one under it, and decode steps: KT
    # records the same partial placement for each, but ran the first wholly on the GPU. Its
    # selections are full_gpu_selections, and hits and misses are the other passes'.
    placement = np.zeros((LAYERS, EXPERTS), dtype=bool)
    placement[:, :3] = True  # three GPU experts per layer
    tokens = [12, 1, 1, 5, 1]
    files, true = _record(
        kt_runtime, tmp_path / "run", tokens, np.stack([placement] * len(tokens)), 7
    )
    profile = load_runtime_profile(PROFILE)
    spec = profile.telemetry.expert_recorder
    assert spec is not None and spec.full_gpu_prefill_knob == "kt_gpu_prefill_token_threshold"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "kimi_k25", "text_config": {"num_experts_per_tok": TOP_K}})
    )
    top_k = router_top_k(LocalBox("local", BoxSpec()), str(model))
    assert top_k == TOP_K
    knobs = {"tp_size": "1", "kt_gpu_prefill_token_threshold": "8", "model": str(model)}
    dist = per_token_counts(combine_dumps([read_dump(p) for p in files], "run"), spec, knobs)
    counters = run_counters(dist, spec, knobs, top_k)
    hybrid = true[1:]
    hits = int((hybrid * placement).sum())
    assert counters["hits"] == hits and counters["misses"] == int(hybrid.sum()) - hits
    assert counters[FULL_GPU_COUNTER] == 12 * TOP_K * LAYERS
    assert counters["route_selections"] == int(true.sum())
    # What the hit rate was before: the full-GPU prefill's non-placed experts as misses.
    every = int((true * placement).sum())
    assert gpu_hits(dist) == (every, int(true.sum()) - every)
    assert counters["misses"] < int(true.sum()) - every
    # Without the threshold no pass is left out; without the top-k, no hit rate at all.
    plain = {**knobs, "kt_gpu_prefill_token_threshold": "0"}
    assert FULL_GPU_COUNTER not in run_counters(dist, spec, plain, None)
    assert run_counters(dist, spec, plain, None)["hits"] == every
    unknown = run_counters(dist, spec, knobs, None)
    assert "hits" not in unknown and "misses" not in unknown
    assert router_top_k(LocalBox("local", BoxSpec()), str(tmp_path / "nowhere")) is None


def test_kts_build_does_not_refuse_eplb_and_the_profile_says_so() -> None:
    # sglang-kt 0.7.2's server_args.py asks only ep_size > 1 of --enable-eplb; the profile's
    # header said KT refuses it.
    source = _wheel_source("sglang/srt/server_args.py")
    handler = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == "_handle_eplb_and_dispatch"
    )
    checks = [ast.unparse(n) for n in ast.walk(handler) if isinstance(n, ast.Assert | ast.Raise)]
    assert checks == ["assert self.ep_size > 1"], checks
    header = PROFILE.read_text(encoding="utf-8")
    assert "refuses --enable-eplb" not in header.replace("\n# ", " ")
    assert "does not refuse --enable-eplb" in header.replace("\n# ", " ")
    docs = (REPO / "docs" / "boxes-and-runtimes.md").read_text(encoding="utf-8")
    assert "build does not refuse EPLB" in docs.replace("\n", " ")
