"""SGLang's own Paged Experts residency, run on a routing, agrees with the harness's replay of it.

Paged Experts (SGLang 0.5.23) counts no hits, so a run's ``replayed_hit_rate`` is the harness's
replay of its LRU (:mod:`harness.policy.paged_experts`) over the passes its recorder dumped. Here
SGLang's own residency module, ``sglang.srt.layers.moe.paged_experts.residency`` (its ``Wave``,
``LRUPolicy`` and ``plan_waves``), is imported whole from the released wheel installed as shipped
(with its package, whose ``__init__`` imports the Paged Experts MoE method and so much of
SGLang's layers) and runs on real CPU torch (vLLM's venv) over the same routing, each step's
distinct experts taken as ``EagerExecutor._run`` takes them (the test checks that line is in the
wheel's ``executor.py``; the executor itself needs a GPU): its page-ins per step and layer are
the replay's, so hits are equal. The replay reads only the recorder's per-pass counts, the same
routing without token order, which the host policy does not use. One process runs the LRU for
every slot count. Stood in, only so that the package imports on a CPU: what
``tests/engines/sglang_site.py`` stands in for (``sgl_kernel``, ``torchvision``, the GPU; its
docstring says why). The residency code calls none of them.
"""

from __future__ import annotations

import json
import subprocess
import zipfile

import numpy as np
import pytest

from harness.card import load_runtime_profile
from harness.formats.expert_distribution import ExpertDistribution
from harness.policy.paged_experts import PagedExpertsLru, replay_paged_experts
from harness.runtimes.recorder import run_counters
from tests.conftest import REPO
from tests.engines.sglang_site import STAND_INS, gpu_env
from tests.engines.sglang_site import site as engine_site
from tests.engines.test_real_torch import torch_python  # noqa: F401 - the fixture
from tests.engines.test_sglang_conformance import _wheel

pytestmark = pytest.mark.slow

# How EagerExecutor._run (executor.py) takes a step's distinct experts: sorted, padding dropped.
DISTINCT = "distinct = [e for e in torch.unique(topk_ids).tolist() if e >= 0]"

# Runs in vLLM's venv: the stand-ins, then SGLang's residency module imported whole, its LRU over
# a routing [passes][layers][tokens][top_k] for each slot count, printing the page-ins of every
# (pass, layer) per slot count.
RUN_RESIDENCY = (
    STAND_INS
    + r"""
import json
from sglang.srt.layers.moe.paged_experts import residency

routing_path, counts = sys.argv[1], json.loads(sys.argv[2])
routing = json.load(open(routing_path))
out = {}
for slots in counts:
    policies = None
    loads = []
    for passes in routing:
        if policies is None:
            policies = [residency.LRUPolicy(slots) for _ in passes]  # one per MoE layer
        row = []
        for policy, topk in zip(policies, passes):
            topk_ids = torch.tensor(topk, dtype=torch.int32)
            DISTINCT_LINE
            waves = residency.plan_waves(policy=policy, distinct=distinct)
            row.append(sum(len(wave.loads) for wave in waves))
        loads.append(row)
    out[slots] = loads
print("@@" + json.dumps(out), flush=True)
os._exit(0)  # what SGLang registered to run at exit is for a server's shutdown, not this
""".replace("DISTINCT_LINE", DISTINCT)
)
SLOTS = (4, 8, 16)
EXPERTS, TOP_K, LAYERS = 32, 4, 3


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


@pytest.fixture(scope="module")
def lru_loads(
    torch_python: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
    """The routing, and SGLang's page-ins of it (per pass and layer) for each slot count."""
    folder = tmp_path_factory.mktemp("paged-residency")
    with zipfile.ZipFile(_wheel()) as wheel:
        executor = wheel.read("sglang/srt/layers/moe/paged_experts/executor.py").decode()
    assert DISTINCT in executor  # the step's experts as SGLang's host path takes them
    release = engine_site("sglang-0.5.23", [_wheel()], torch_python)
    routing = _routing(np.random.default_rng(7), EXPERTS, TOP_K, LAYERS)
    (folder / "routing.json").write_text(
        json.dumps([[layer.tolist() for layer in step] for step in routing])
    )
    done = subprocess.run(
        [torch_python, "-c", RUN_RESIDENCY, str(folder / "routing.json"), json.dumps(SLOTS)],
        capture_output=True, text=True, timeout=300, check=False,
        env=gpu_env(folder, [release]),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("@@")]
    loads = {int(slots): np.asarray(rows) for slots, rows in json.loads(line[2:]).items()}
    return routing, loads


@pytest.mark.parametrize("slots", SLOTS)
def test_sglangs_own_lru_pages_in_what_the_replay_pages_in(
    lru_loads: tuple[list[np.ndarray], dict[int, np.ndarray]],
    slots: int,
) -> None:
    routing, loads = lru_loads
    experts, layers = EXPERTS, LAYERS
    sglang_loads = loads[slots]
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
