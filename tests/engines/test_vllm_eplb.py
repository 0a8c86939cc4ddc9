"""vLLM's expert offload and EPLB knobs (vllm.yaml, cuda-lane.yaml) and EPLB's load line as
counters.

EPLB needs several CUDA GPUs and a CUDA build of vLLM; the CPU build here has no expert
parallelism, so the load line is fixture text in the format of vLLM's
vllm/distributed/eplb/eplb_state.py (EplbState.step: `"EPLB step: %d for model %s:
avg_tokens=%.2f, max_tokens=%d, balancedness=%.4f, steps until the next rearrangement: %d"`;
earlier releases printed `"EPLB step: avg_tokens=%.2f, max_tokens=%d, balancedness=%.4f"`),
behind vLLM's logger prefix. The flags are the ones vllm/engine/arg_utils.py declares
(--cpu-offload-gb, --enable-expert-parallel, --enable-eplb/--no-enable-eplb, --eplb-config).
"""

from __future__ import annotations

import pytest

from harness.card import load_card
from harness.card.resolve import load_runtime_profile
from harness.runtimes.boot import boot_spec
from harness.runtimes.log_counters import log_snapshot, start_snapshot
from tests.conftest import REPO

RUNTIMES = REPO / "campaigns" / "runtimes"

LOG = """\
INFO 12-02 10:14:01 [eplb_state.py:530] EPLB step: 0 for model /models/moe: avg_tokens=1200.00, max_tokens=1600, balancedness=0.7500, steps until the next rearrangement: 3000
INFO 12-02 10:14:02 [loggers.py:127] Engine 000: Avg prompt throughput: 812.4 tokens/s
INFO 12-02 10:14:03 [eplb_state.py:412] EPLB step: avg_tokens=900.50, max_tokens=1000, balancedness=0.9005
"""  # noqa: E501


@pytest.mark.parametrize("name", ["vllm", "cuda-lane"])
def test_the_eplb_load_lines_add_up_to_a_runs_balancedness(name: str) -> None:
    specs = load_runtime_profile(RUNTIMES / f"{name}.yaml").telemetry.log_counters
    first, second = LOG.splitlines(keepends=True)[0], "".join(LOG.splitlines(keepends=True)[1:])
    before = start_snapshot(specs, first)
    after = log_snapshot(first + second, specs)
    assert before == {"eplb_avg_tokens": 1200.0, "eplb_max_tokens": 1600.0}
    assert after == {"eplb_avg_tokens": 2100.5, "eplb_max_tokens": 2600.0}
    delta = {k: after[k] - before[k] for k in after}
    assert delta["eplb_avg_tokens"] / delta["eplb_max_tokens"] == pytest.approx(0.9005)
    # Without log_balancedness (or EPLB) there is no line: nothing counted yet, not a fault.
    assert start_snapshot(specs, "INFO vllm serve\n") == {
        "eplb_avg_tokens": 0.0,
        "eplb_max_tokens": 0.0,
    }


def test_the_eplb_card_sends_the_flags_vllm_declares() -> None:
    loaded = load_card(REPO / "campaigns" / "vllm-eplb.yaml")
    argv = {}
    for name in ("static", "eplb"):
        spec = boot_spec(
            loaded.runtime, loaded.card.cells[name], port=8000, run_dir="/tmp/r",
            python="python3", bind_host="127.0.0.1", cache_dir="/tmp/c", uploaded={},
        )  # fmt: skip
        argv[name] = spec.argv
    assert "--no-enable-eplb" in argv["static"] and "--enable-eplb" not in argv["static"]
    eplb = argv["eplb"]
    assert "--enable-eplb" in eplb and "--enable-expert-parallel" in eplb
    assert eplb[eplb.index("--tensor-parallel-size") + 1] == "8"
    config = eplb[eplb.index("--eplb-config") + 1]
    assert config.startswith('{"window_size": 1000') and '"log_balancedness": true' in config


def test_offload_and_eplb_values_are_checked() -> None:
    knobs = load_runtime_profile(RUNTIMES / "vllm.yaml").knobs
    assert knobs["cpu_offload_gb"].check("24") is None
    assert knobs["cpu_offload_gb"].check("2.5") is None
    assert knobs["cpu_offload_gb"].check("lots") is not None
    assert knobs["eplb_config"].check('{"num_redundant_experts": 32}') is None
    assert knobs["eplb_config"].check("num_redundant_experts=32") is not None
