"""llama.cpp's MoE-offload knobs in the llama-cpp profile: the expert cache's exit line as
counters, the --fit plan kept in the run's identity, the warning for an unpinned fit, and (slow)
every knob's flag in the built binaries' --help, and a build without a flag refusing its knob at
boot.

The cache lines and the fit plan are printed only by builds this machine cannot run (the expert
cache needs a GPU backend; --fit plans only for GPU devices), so their tests read fixture text
in the format the sources print: the expert cache's exit lines as upstream llama.cpp's
src/llama-moe-cache.cpp (`log_stats`, ggml-org/llama.cpp commit 4b060f27) prints them, one per
batch class — `"llama_moe_cache: %s: hits = %zu, misses = %zu, hit rate = %.2f%%, uploaded =
%.2f MiB\n"` with "ubatch <= 8" and "ubatch  > 8", each only if it had a lookup, then `"…: large
batches: %zu experts copied from the cache, %.2f MiB\n"` —, and common/fit.cpp's
`"%s:   - %s: %2u layers (%2u overflowing), %6ld MiB used, %6ld MiB free"`
(llama-cpp-python 0.3.36's vendored llama.cpp; `llama_params_fit_impl` in older builds). The
threads card (tests/engines/test_llamacpp.py) runs with `fit: "off"` pinned.
"""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest

from harness.analyze.metrics import counter_metrics
from harness.boxes.local import LocalBox
from harness.card import load_card
from harness.card.knob_pins import knob_pin_warnings
from harness.card.resolve import load_runtime_profile
from harness.cli import main
from harness.errors import RuntimeBootError
from harness.profiles.box import BoxSpec
from harness.runtimes.applied_policy import add_exit_counters, identity_lines
from harness.runtimes.boot import boot, boot_spec
from harness.runtimes.llamacpp import build
from harness.runtimes.log_counters import log_snapshot
from tests.conftest import REPO

PROFILE = REPO / "campaigns" / "runtimes" / "llama-cpp.yaml"
CARD = REPO / "campaigns" / "llama-cpp-moe-offload.yaml"

# What upstream's log_stats prints after a run whose decode ubatches (<= 8 tokens) hit 89.4%
# and whose prompt ubatches (9-32 tokens) hit 30.0%: the engine's total is the sum of both.
CACHE_LINES = (
    "llama_moe_cache: ubatch <= 8: hits = 88000, misses = 10400, hit rate = 89.43%, "
    "uploaded = 1300.00 MiB\n"
    "llama_moe_cache: ubatch  > 8: hits = 3234, misses = 7546, hit rate = 30.00%, "
    "uploaded = 943.25 MiB\n"
    "llama_moe_cache: large batches: 5120 experts copied from the cache, 640.00 MiB\n"
)
FIT_PLAN = """\
common_params_fit_impl: projected to use 151234 MiB of device memory vs. 139264 MiB of free device memory
common_params_fit_impl: filling dense layers back-to-front:
common_params_fit_impl:   - CUDA0 (NVIDIA H200): 48 layers ( 6 overflowing), 137012 MiB used,   1204 MiB free
common_fit_params: successfully fit params to free device memory
llama_params_fit_impl:   - CUDA0 (NVIDIA RTX 6000 Ada Generation): 30 layers ( 1 overflowing),  47400 MiB used,   1108 MiB free
main: server is listening on http://127.0.0.1:8080
"""  # noqa: E501


def test_the_expert_cache_lines_are_read_after_the_stop_as_the_engines_totals() -> None:
    specs = load_runtime_profile(PROFILE).telemetry.log_counters
    log = f"main: server is listening\nprompt eval time = 4.00 ms / 3 tokens\n{CACHE_LINES}"
    # Read while the server runs, the line is not there yet; after the stop it is.
    assert "hits" not in log_snapshot("main: server is listening\n", specs)
    payload = {"before": {}, "after": {}, "delta": {}, "missing": {}}
    done = add_exit_counters(payload, specs, log, where="server.log")
    assert done["before"]["hits"] == 0.0
    # Both batch classes, summed: the engine's total hit rate, not the last line's 30%.
    assert done["delta"]["hits"] == 91234 and done["delta"]["misses"] == 17946
    assert done["delta"]["expert_loads"] == 17946
    assert done["delta"]["bytes_read"] == pytest.approx(2243.25 * 2**20)
    # Copies of cached experts for large batches upload nothing: counted apart.
    assert done["delta"]["moe_cache_copies"] == 5120
    assert done["delta"]["moe_cache_copied_bytes"] == pytest.approx(640 * 2**20)
    metrics = counter_metrics(done)
    assert metrics["hit_rate"] == pytest.approx(91234 / (91234 + 17946))
    assert metrics["expert_loads"] == 17946
    # Only decode ubatches looked up (a run of short prompts): one line, the same totals.
    decode_only = CACHE_LINES.splitlines()[0] + "\n"
    alone = add_exit_counters(payload, specs, decode_only, where="server.log")
    assert alone["delta"]["hits"] == 88000 and alone["delta"]["misses"] == 10400
    # A build without the cache prints no line: the counters are missing, never 0.
    silent = add_exit_counters(payload, specs, "main: server is listening\n", where="server.log")
    assert {"hits", "misses", "bytes_read", "expert_loads"} <= set(silent["missing"])
    assert "hits" not in silent["delta"]


# Lines a llama-cpp-python 0.3.36 llama-server printed here (built with
# HARNESS_CACHE=/work/cache29b scripts/build-llama-server.sh): its timing lines carry a prefix.
TIMINGS_0_3_36 = """\
0.01.403.391 I slot print_timing: id  0 | task 3 | prompt eval time =      16.00 ms /   112 tokens (    0.14 ms per token,  7000.00 tokens per second)
0.01.403.465 I slot print_timing: id  0 | task 3 |        eval time =      26.04 ms /     8 tokens (    3.72 ms per token,   268.87 tokens per second)
"""  # noqa: E501
# And what the 0.3.16 build `make llama-server` makes printed (the threads card's run here).
TIMINGS_0_3_16 = """\
prompt eval time =      23.62 ms /   112 tokens (    0.21 ms per token,  4742.35 tokens per second)
       eval time =      57.23 ms /    16 tokens (    3.58 ms per token,   279.60 tokens per second)
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [(TIMINGS_0_3_36, (16.0, 112.0, 26.04, 8.0)), (TIMINGS_0_3_16, (23.62, 112.0, 57.23, 16.0))],
    ids=["0.3.36", "0.3.16"],
)
def test_request_timings_are_read_from_old_and_new_builds(
    text: str, expected: tuple[float, ...]
) -> None:
    specs = load_runtime_profile(PROFILE).telemetry.log_counters
    got = log_snapshot(text, specs)
    names = ("log_prompt_ms", "log_prompt_tokens", "log_eval_ms", "log_eval_tokens")
    assert tuple(got[n] for n in names) == pytest.approx(expected)


def test_the_fit_plan_is_kept_in_the_runs_identity() -> None:
    patterns = load_runtime_profile(PROFILE).telemetry.identity_lines
    kept = identity_lines(patterns, FIT_PLAN)
    assert len(kept) == 5 and "server is listening" not in " ".join(kept)
    assert kept[2].startswith("common_params_fit_impl:   - CUDA0 (NVIDIA H200): 48 layers")
    assert kept[4].startswith("llama_params_fit_impl:   - CUDA0")
    many = "common_fit_params: x\n" * 70
    cut = identity_lines(patterns, many)
    assert len(cut) == 65 and cut[-1] == "... 6 more matching lines"


def test_a_cell_placing_experts_without_pinning_fit_is_warned() -> None:
    loaded = load_card(CARD)
    assert knob_pin_warnings(loaded) == []  # the shipped card pins fit in both cells
    cells = dict(loaded.card.cells)
    knobs = {k: v for k, v in cells["cache"].knobs.items() if k != "fit"}
    cells["cache"] = cells["cache"].model_copy(update={"knobs": knobs})
    unpinned = loaded.card.model_copy(update={"cells": cells})
    from dataclasses import replace

    (warning,) = knob_pin_warnings(replace(loaded, card=unpinned))
    assert "cells.cache.knobs: sets cpu_moe, n_gpu_layers but not fit" in warning
    assert 'Set `fit: "off"`' in warning


def _cache_card(folder: Path, moe_cache_mib: str) -> Path:
    """The shipped offload card with the cache cell's ``moe_cache_mib`` set to ``moe_cache_mib``."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    text = CARD.read_text(encoding="utf-8")
    assert text.count("moe_cache_mib: 8192}") == 1
    card = folder / "card.yaml"
    card.write_text(text.replace("moe_cache_mib: 8192}", f"moe_cache_mib: {moe_cache_mib}}}"))
    return card


def test_moe_cache_mib_auto_is_refused_at_validate_naming_the_field_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Upstream declares --moe-cache-mib an int option (`int value`, negative refused), so its
    # parser refuses `auto` at boot (the slow test below runs that parse in the built binary);
    # `validate` refuses it first (exit 2), and the profile offers no other word.
    code = main(["validate", str(_cache_card(tmp_path, "auto"))], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cells.cache.knobs.moe_cache_mib: must be a whole number of MiB" in err, err
    assert "no `auto`" in err, err
    knob = load_runtime_profile(PROFILE).knobs["moe_cache_mib"]
    assert knob.check("8192") is None and knob.check("auto") is not None


def test_no_knob_offers_a_flag_in_no_source() -> None:
    # --moe-cache-cpu-share is in no llama.cpp source (not the pinned 0.3.36, not upstream's
    # cache at 4b060f27): no profile offers it, and no doc names it.
    for path in (REPO / "harness" / "profiles" / "data" / "runtimes").glob("*.yaml"):
        assert "moe-cache-cpu-share" not in path.read_text(encoding="utf-8"), path
        assert "moe_cache_cpu_share" not in load_runtime_profile(path).knobs, path
    for doc in (REPO / "README.md", *(REPO / "docs").glob("*.md")):
        text = doc.read_text(encoding="utf-8")
        assert "moe_cache_cpu_share" not in text and "moe-cache-cpu-share" not in text, doc


# ---- the built llama-server (slow: it needs `make llama-server`) ------------------------------


def test_the_pinned_build_is_the_build_scripts_default() -> None:
    script = build.BUILD_SCRIPT.read_text(encoding="utf-8")
    assert f'version="${{HARNESS_LLAMA_CPP_PY_VERSION:-{build.PINNED_VERSION}}}"' in script


# Knobs whose flag the pinned build lacks, and why: upstream's later expert cache, and
# llama-bench's -mmp (0.3.16's; 0.3.36 loads by -lm). Everything else must reach the binary.
NOT_IN_THE_PINNED_BUILD = {
    "llama-cpp": {"moe_cache_mib", "mlock", "no_mmap"},
    "llama-bench": {"mmap"},
}


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "binary"), [("llama-cpp", "llama-server"),
                                                  ("llama-bench", "llama-bench")])  # fmt: skip
def test_every_knob_of_the_profile_is_in_the_built_binarys_help(profile: str, binary: str) -> None:
    build.ensure_built()
    done = subprocess.run(
        [str(build.binary(binary)), "--help"], capture_output=True, text=True, timeout=60
    )
    listed = done.stdout + done.stderr
    flags = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", listed))
    variables = set(re.findall(r"\(env: (LLAMA_ARG_\w+)\)", listed))
    knobs = load_runtime_profile(REPO / f"campaigns/runtimes/{profile}.yaml").knobs
    missing = {
        name: knob.arg or knob.env
        for name, knob in knobs.items()
        if (knob.arg and knob.arg not in flags)
        or (knob.env and knob.env.startswith("LLAMA_ARG_") and knob.env not in variables)
    }
    assert set(missing) == NOT_IN_THE_PINNED_BUILD[profile], missing
    if binary == "llama-server":  # the MoE placement and fit knobs, by name
        assert {"--fit", "--fit-target", "--fit-ctx", "--load-mode", "--n-cpu-moe"} <= flags
        assert {"--cpu-moe", "--override-tensor"} <= flags
    else:
        assert {"-ncmoe", "-lm", "-ot", "-fitt"} <= flags


@pytest.mark.slow
def test_a_build_without_the_flag_refuses_the_knob_at_boot(tmp_path: Path) -> None:
    # The pinned llama.cpp (llama-cpp-python 0.3.36's) has no --moe-cache-mib, a fork's flag: the
    # knob is a flag, so the server refuses it before loading anything, and the boot error
    # shows why.
    build.ensure_built()
    loaded = load_card(CARD)
    cell = loaded.card.cells["cache"]
    knobs = {"model": str(tmp_path / "none.gguf"), "moe_cache_mib": 64}
    box = LocalBox("local", BoxSpec())
    spec = boot_spec(
        loaded.runtime, cell.model_copy(update={"knobs": knobs}), port=box.free_port(),
        run_dir=str(tmp_path / "r"), python="python3", bind_host="127.0.0.1",
        cache_dir=str(tmp_path), uploaded={},
    )  # fmt: skip
    assert "--moe-cache-mib" in spec.argv
    with pytest.raises(RuntimeBootError) as caught:
        boot(box, loaded.runtime, spec)
    message = str(caught.value)
    assert "exited during boot" in message
    assert "error: invalid argument: --moe-cache-mib" in message


@pytest.mark.slow
@pytest.mark.parametrize("value", ["auto", "-1", "0", "8192"])
def test_the_knob_refuses_what_llama_cpps_int_parse_refuses(value: str) -> None:
    # Upstream's --moe-cache-mib is an int option whose handler refuses a negative value, the
    # form of the pinned build's --n-cpu-moe (`[](common_params & params, int value) { if
    # (value < 0) throw ...`), parsed by the same common_params_parse (std::stoi): the built
    # binary judges each value through --n-cpu-moe (`--version` after it exits 0 once the value
    # parses), and the moe_cache_mib knob refuses exactly the values it refuses.
    build.ensure_built()
    done = subprocess.run(
        [str(build.binary("llama-server")), "--n-cpu-moe", value, "--version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    engine_refuses = done.returncode != 0
    if engine_refuses:
        assert 'error while handling argument "--n-cpu-moe"' in done.stderr, done.stderr
    knob = load_runtime_profile(PROFILE).knobs["moe_cache_mib"]
    assert (knob.check(value) is not None) == engine_refuses, (value, done.stderr[-300:])
