"""SGLang's own Paged Experts residency, run on a routing, agrees with the harness's replay of it.

Paged Experts (SGLang 0.5.23) counts no hits, so a run's ``replayed_hit_rate`` is the harness's
replay of its LRU (:mod:`harness.policy.paged_experts`) over the passes its recorder dumped. Here
SGLang's own ``Wave``, ``LRUPolicy`` and ``plan_waves`` (``srt/layers/moe/paged_experts/
residency.py``, cut from the released wheel with ``ast``, unchanged) run on real torch (vLLM's
venv) over the same routing, each step's distinct experts taken as ``EagerExecutor._run`` takes
them (the test checks that line is in the wheel's ``executor.py``): its page-ins per step and
layer are the replay's, so hits are equal. The replay reads only the recorder's per-pass counts,
the same routing without token order, which the host policy does not use.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.card import load_runtime_profile
from harness.formats.expert_distribution import ExpertDistribution
from harness.policy.paged_experts import PagedExpertsLru, replay_paged_experts
from harness.runtimes.recorder import run_counters
from tests.conftest import REPO
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture
from tests.engines.test_sglang_conformance import _wheel

pytestmark = pytest.mark.slow

# How EagerExecutor._run (executor.py) takes a step's distinct experts: sorted, padding dropped.
DISTINCT = "distinct = [e for e in torch.unique(topk_ids).tolist() if e >= 0]"

# Runs in vLLM's venv: SGLang's residency classes over a routing [passes][layers][tokens][top_k],
# printing the page-ins of every (pass, layer).
RUN_RESIDENCY = r"""
import ast, json, sys, typing
from collections import OrderedDict
import msgspec
import torch

source_path, routing_path, slots = sys.argv[1], sys.argv[2], int(sys.argv[3])
source = open(source_path, encoding="utf-8").read()
wanted = {"Wave", "LRUPolicy", "plan_waves"}
code = "from __future__ import annotations\n" + "\n\n".join(
    ast.get_source_segment(source, node) for node in ast.parse(source).body
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted)
space = {"msgspec": msgspec, "torch": torch, "OrderedDict": OrderedDict,
         "List": typing.List, "Tuple": typing.Tuple}
exec(code, space)
routing = json.load(open(routing_path))
policies = None
loads = []
for passes in routing:
    if policies is None:
        policies = [space["LRUPolicy"](slots) for _ in passes]  # one per MoE layer
    row = []
    for policy, topk in zip(policies, passes):
        topk_ids = torch.tensor(topk, dtype=torch.int32)
        DISTINCT_LINE
        waves = space["plan_waves"](policy=policy, distinct=distinct)
        row.append(sum(len(wave.loads) for wave in waves))
    loads.append(row)
print(json.dumps(loads))
""".replace("DISTINCT_LINE", DISTINCT)


def _routing(rng: np.random.Generator, experts: int, top_k: int, layers: int) -> list[np.ndarray]:
    """Passes of prefills (many tokens: more distinct experts than slots, so several waves)
    and decodes (one token), each layer's experts drawn with a skew so some stay resident."""
    weights = 1.0 / np.arange(1, experts + 1) ** 1.1
    passes = []
    for tokens in [12, 1, 1, 1, 1, 6, 1, 1, 1, 1, 1, 20, 1, 1, 1, 2, 1, 1, 1, 1]:
        per_layer = []
        for layer in range(layers):
            order = np.roll(np.arange(experts), 5 * layer)  # each layer its own hot set
            per_layer.append(
                np.stack([
                    order[rng.choice(experts, top_k, replace=False, p=weights / weights.sum())]
                    for _ in range(tokens)
                ])
            )  # fmt: skip
        passes.append(per_layer)
    return passes


@pytest.mark.parametrize("slots", [4, 8, 16])
def test_sglangs_own_lru_pages_in_what_the_replay_pages_in(
    torch_python: str,  # noqa: F811
    tmp_path: Path,
    slots: int,
) -> None:
    with zipfile.ZipFile(_wheel()) as wheel:
        source = tmp_path / "residency.py"
        source.write_bytes(wheel.read("sglang/srt/layers/moe/paged_experts/residency.py"))
        executor = wheel.read("sglang/srt/layers/moe/paged_experts/executor.py").decode()
    assert DISTINCT in executor  # the step's experts as SGLang's host path takes them
    experts, top_k, layers = 32, 4, 3
    routing = _routing(np.random.default_rng(7), experts, top_k, layers)
    (tmp_path / "routing.json").write_text(
        json.dumps([[layer.tolist() for layer in step] for step in routing])
    )
    command = [torch_python, "-c", RUN_RESIDENCY, str(source), str(tmp_path / "routing.json")]
    done = subprocess.run(
        [*command, str(slots)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    sglang_loads = np.asarray(json.loads(done.stdout))
    # What the recorder dumps of the same routing: selections per pass, layer and expert.
    counts = np.zeros((len(routing), layers, experts), dtype=np.int64)
    for index, step in enumerate(routing):
        for layer, topk in enumerate(step):
            np.add.at(counts[index, layer], topk.ravel(), 1)
    distinct = int((counts > 0).sum())
    policies = [PagedExpertsLru(slots) for _ in range(layers)]
    ours = np.asarray(
        [
            [
                policy.step(np.flatnonzero(counts[i, layer]).tolist())
                for layer, policy in enumerate(policies)
            ]
            for i in range(len(routing))
        ]
    )
    assert np.array_equal(ours, sglang_loads)  # page-ins, step by step and layer by layer
    replayed = replay_paged_experts(counts, slots)
    assert replayed.misses == int(sglang_loads.sum())
    assert replayed.hits == distinct - int(sglang_loads.sum())
    assert replayed.hits > 0 and replayed.misses > 0  # both occur: the check has teeth
    assert ((counts > 0).sum(axis=2) > slots).any()  # a prefill took several waves
    # The run's counters, as the sglang profile's recorder reads a Paged Experts cell's dump.
    profile = load_runtime_profile(REPO / "harness/profiles/data/runtimes/sglang.yaml")
    spec = profile.telemetry.expert_recorder
    assert spec is not None
    knobs = {"enable_paged_experts": "1", "paged_experts_num_resident": str(slots)}  # as booted
    counters = run_counters(ExpertDistribution(counts, None, "stat"), spec, knobs, None)
    assert counters["replayed_hits"] == replayed.hits
    assert counters["replayed_misses"] == replayed.misses
    assert "hits" not in counters and "misses" not in counters  # nothing measured
    off = run_counters(ExpertDistribution(counts, None, "stat"), spec, {}, None)
    assert "replayed_hits" not in off  # Paged Experts off: nothing replayed
