"""The engagement signatures' log lines as the engines' own code prints them.

No SGLang, sglang-kt or Metal ds4 server runs on this CPU box, so each line is printed from the
engine's released source: the f-string or %-format read out of the wheel (SGLang 0.5.23,
sglang-kt 0.7.2) and evaluated with its fields filled in, and ds4's fprintf format (ba2a729's
ds4.c, C string pieces and PRIu64 as written) compiled into a three-line driver and printed by
the C library. Each is then counted by the shipped profile's log counters, so a reworded line
fails here rather than reading *not engaged* on the GPU box. (vLLM's lines are printed by its own
loggers in test_vllm_eplb.py; KT's GPU-mask line by KT's own mask code in test_kt_conformance.py.)
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from harness.card import load_runtime_profile
from harness.runtimes.log_counters import log_snapshot
from tests.conftest import REPO
from tests.engines.logged import logger_call
from tests.engines.test_ds4_parsers import _tarball
from tests.engines.test_kt_conformance import kt_wheels
from tests.engines.test_sglang_conformance import _wheel as sglang_wheel

RUNTIMES = REPO / "campaigns" / "runtimes"
SGLANG_PREFIX = "[2026-12-07 10:00:00 TP0] "  # SGLang's log format on a tensor-parallel rank


def _counted(profile: str, log: str) -> dict[str, float]:
    specs = load_runtime_profile(RUNTIMES / f"{profile}.yaml").telemetry.log_counters
    return log_snapshot(log, specs)


def _logged(source: str, needle: str) -> ast.expr:
    """The message of the first ``logger.info(...)`` whose message contains ``needle``."""
    return logger_call(source, needle).args[0]


def _render(message: ast.expr, names: dict[str, Any]) -> str:
    text = eval(compile(ast.Expression(message), "release", "eval"), names)
    assert isinstance(text, str)
    return text


def _from_wheel(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode("utf-8")


@pytest.mark.slow
def test_sglangs_eplb_start_and_weight_lines_are_counted() -> None:
    wheel = sglang_wheel()
    eplb = _logged(_from_wheel(wheel, "sglang/srt/eplb/eplb_manager.py"), "system started")
    manager = types.SimpleNamespace(_rebalance_num_iterations=1000)
    started = SGLANG_PREFIX + _render(eplb, {"self": manager})
    for profile in ("sglang", "sglang-eplb"):
        assert _counted(profile, started + "\n")["eplb_started"] == 1, started
    loaded = _logged(
        _from_wheel(wheel, "sglang/srt/model_executor/model_runner.py"), "Load weight end"
    )
    runner = types.SimpleNamespace(
        weight_load_time=41.7, model=type("DeepseekV3ForCausalLM", (), {})(),
        weight_load_mem_usage=12.34,
    )  # fmt: skip
    for quant in ("", "quant=fp8"):
        fields = {"self": runner, "quant_str": quant, "after_avail_memory": 61.2, "type": type}
        line = SGLANG_PREFIX + _render(loaded, fields)
        assert _counted("sglang", line + "\n")["weight_mem_gb"] == pytest.approx(12.34), line


@pytest.mark.slow
def test_kts_layerwise_prefill_lines_count_the_expert_updates() -> None:
    sglang_kt, _ = kt_wheels(sys.executable)
    source = _from_wheel(sglang_kt, "sglang/srt/layers/moe/kt_ep_wrapper.py")
    with_update = _logged(source, "expert update = ")
    plain = _logged(source, "KT layerwise prefill: layer %d compute = %.2f ms'")
    assert isinstance(with_update, ast.Constant) and isinstance(plain, ast.Constant)
    log = "".join(
        SGLANG_PREFIX + line + "\n"
        for line in (str(with_update.value) % (3, 4.5, 0.25), str(plain.value) % (4, 4.1))
    )
    # Only the prefill that ran the dynamic expert update counts toward its signature.
    assert _counted("sglang-kt", log)["kt_expert_updates"] == 1, log


# ds4's fprintf calls of the Metal expert profiler's close, as ds4.c writes them.
DS4_WROTE = re.compile(
    r'fprintf\(\s*stderr,\s*((?:"[^"]*"\s*(?:PRIu64\s*)?)*"ds4: wrote Metal expert '
    r'(?:hotlist|locality profile)[^;]*?selections\)\\n")',
)


@pytest.mark.slow
def test_ds4s_profiler_lines_as_its_printf_writes_them(tmp_path: Path) -> None:
    with tarfile.open(_tarball()) as tar:
        handle = tar.extractfile(tar.getmember("./ds4.c"))
        assert handle is not None
        source = handle.read().decode("utf-8", errors="replace")
    formats = [m.group(1) for m in DS4_WROTE.finditer(source)]
    assert len(formats) == 2, formats  # the hotlist's and the locality profile's
    calls = "".join(
        f'    fprintf(stdout, {f}, "/tmp/ds4/out.json", (uint64_t)43, (uint64_t)1032);\n'
        for f in formats
    )
    (tmp_path / "driver.c").write_text(
        f"#include <inttypes.h>\n#include <stdio.h>\nint main(void) {{\n{calls}    return 0;\n}}\n"
    )
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "no C compiler: ds4 could not have been built either"
    subprocess.run([compiler, "-o", "driver", "driver.c"], cwd=tmp_path, check=True, timeout=120)
    log = subprocess.run(
        [str(tmp_path / "driver")], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    log += "ds4: expert profile/hotlist is Metal-only for now; ignoring for cpu backend\n"
    for profile in ("ds4", "ds4-server"):
        counted = _counted(profile, log)
        assert counted["expert_profile_records"] == 43, log
        assert counted["expert_hotlist_records"] == 43, log
