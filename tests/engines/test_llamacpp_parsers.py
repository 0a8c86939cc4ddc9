"""llama.cpp's own parsers judge what `harness validate` refuses of the llama-cpp and llama-bench
profiles.

For each profile, every value a card can give each knob (each choice and the engine's words
beside them, a switch on and off, a pattern's representative and boundary values inside and
outside it) and the combinations the engine relates (``fit`` with the placement knobs it pins,
``cpu_moe`` with ``n_cpu_moe``, batch against micro-batch and context, threads against batch
threads, the fit targets) are cells of one card. `harness validate` (``load_card``) judges the
card; each cell's command line and environment are built by harness's own ``boot_spec``
(llama-cpp passes most knobs as the ``LLAMA_ARG_*`` variables llama-server parses with the same
handlers as its flags), and the pinned build (``make llama-server``: llama-cpp-python 0.3.36's
vendored llama.cpp) judges it, one process per cell, run for real as the profile starts it
(``sh -c 'exec …'``), with the model pointed at a file that does not exist:

- llama-server: ``common_params_parse`` (the environment, then argv, then its post-parse checks)
  and what the server checks before the model. Refused: the parser's message (``error while
  handling argument …`` / ``… environment variable …``, ``error: invalid argument: …``) or an
  assertion before the model (``GGML_ASSERT``: 4096 tensor overrides). Accepted: the server went
  on to load the model (``loading model``, or with ``-lv 1`` only its ``failed to load model``).
  ``--version`` exits inside the argument loop, before the post-parse checks, so it judges only
  the cells whose log level (``-lv 0`` or below) silences even the load's error.
- llama-bench: its own ``parse_cmd_params`` (``error: invalid parameter for argument: …`` and
  its usage, exit 1; for a bad ``-ot`` it names the argument after it) or a crash before the
  model (``std::bad_alloc``: ``-ncmoe 999999999``). Accepted: it went on to load the model
  (``failed to load model``) or had no test to run (exit 0).

Nothing is stood in; each process takes tens of milliseconds. What the build does past the
model's load (a zero batch, a negative context) was seen running it on the tiny GGUF and is
the reason the profiles refuse values its parser takes (``NARROWER``, each still asserted taken
by the parser). ``ENGINE_ALONE`` lists what the build refuses and validate cannot know (the
box's buffer types; the flags this build lacks, tests/engines/test_llama_moe_offload.py).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.card import Cell, load_runtime_profile
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import boot_spec, knob_text
from harness.runtimes.llamacpp import build
from tests.conftest import REPO
from tests.engines.test_llama_moe_offload import NOT_IN_THE_PINNED_BUILD
from tests.engines.validate_cells import validate_refusals

pytestmark = pytest.mark.slow

PROFILES = {"llama-cpp": "llama-server", "llama-bench": "llama-bench"}
CARDS = {
    "llama-cpp": REPO / "campaigns" / "llama-cpp-threads.yaml",
    "llama-bench": REPO / "campaigns" / "llama-bench-threads.yaml",
}
MISSING_MODEL = "/nonexistent/harness-parser-probe.gguf"

# Values an int knob may be given, in and out of range: std::stoi's bounds are int32's.
WHOLE = ["0", "1", "8", "999999999", "2147483647", "2147483648", "-1", "-8", "auto", "1.5", ""]
# llama-bench's parse_int_range reads lists and ranges (first-last, +step or *step) as well.
RANGES = [*WHOLE, "1,2", "1-4", "1-8*2", "2,"]
# A pattern knob's values; a choice knob's words outside its choices (a new pattern knob fails
# the test until it is listed).
VALUES: dict[str, dict[str, list[Any]]] = {
    "llama-cpp": {
        # Not 999999999: the parser builds one tensor override per layer (out of memory).
        "n_cpu_moe": ["0", "1", "8", "999", "4095", "4096", "2147483648", "-1", "auto", "1.5", "",
                      "all", "1,2"],
        "cpu_moe": ["true", "on", "enabled", "2", ""],
        "override_tensor": [
            "exps=CPU", r"blk\.[0-9]+\.ffn_.*_exps=CPU", "ffn_up_exps=CPU,ffn_down_exps=CPU",
            "=CPU", "exps", "exps=GPU", "exps=CUDA0", "", "exps=CPU,", "exps=CPU=CPU",
        ],
        "fit": ["true", "false", "enabled", "disabled", "auto", "yes", ""],
        "fit_target": [
            "0", "1024", "999999999", "99999999999999999999", "1024,2048", "1024/2048",
            ",".join(["64"] * 15), ",".join(["64"] * 16), "1024,", ",1024", ",", "-1", "auto",
            "1.5", "",
        ],
        "fit_ctx": WHOLE,
        "load_mode": ["MMAP", "mmap,mlock", "direct", ""],
        "threads": [*WHOLE, "two"],
        "threads_batch": WHOLE,
        "batch_size": WHOLE,
        "ubatch_size": WHOLE,
        "ctx_size": WHOLE,
        "n_gpu_layers": [*WHOLE, "all", "-2", "ALL"],
        "flash_attn": ["true", "false", "enabled", "disabled", "-1", "yes", ""],
        "log_verbosity": [*WHOLE, "4", "10"],
        "moe_cache_mib": ["64"],
    },
    "llama-bench": {
        "threads": RANGES,
        "n_gen": RANGES,
        "repetitions": [*WHOLE, "1,2"],
        "batch_size": RANGES,
        "ubatch_size": RANGES,
        "n_gpu_layers": [*RANGES, "-1,2", "all"],
        "flash_attn": ["true", "false", "enabled", "disabled", "-1", "yes", "", "0,1"],
        "n_cpu_moe": [*RANGES, "4095", "4096"],
        "override_tensor": [
            "exps=CPU", r"blk\.[0-9]+\.ffn_.*_exps=CPU", "ffn_up_exps=CPU;ffn_down_exps=CPU",
            "ffn_up_exps=CPU,ffn_down_exps=CPU", "=CPU", "exps", "exps=GPU", "exps=CUDA0", "",
            "exps=CPU;",
        ],
        "load_mode": ["MMAP", "mmap,mlock", "direct", ""],
    },
}  # fmt: skip
# Knobs every cell sets (not varied): where the model is.
FIXED = {"llama-cpp": {"model": MISSING_MODEL}, "llama-bench": {}}

# The combinations the engine relates, as knob grids crossed in full (None: not set).
PAIRS: dict[str, list[dict[str, list[Any]]]] = {
    "llama-cpp": [
        # knob_pins: --fit rewrites the placement a cell leaves unset
        {"fit": ["on", "off"], "n_cpu_moe": [None, "4"], "cpu_moe": [None, "1"],
         "override_tensor": [None, "exps=CPU"], "n_gpu_layers": [None, "99"]},
        {"fit": ["on"], "fit_target": [None, "1024", "1024,2048"], "fit_ctx": [None, "4096"],
         "ctx_size": [None, "0", "8192"]},
        {"batch_size": ["8", "2048"], "ubatch_size": ["8", "512"], "ctx_size": [None, "64"]},
        {"threads": ["1", "4"], "threads_batch": ["1", "4"]},
        {"load_mode": ["mmap", "none"], "n_gpu_layers": ["0", "all"]},
    ],
    "llama-bench": [
        {"n_cpu_moe": [None, "4"], "override_tensor": [None, "exps=CPU"],
         "n_gpu_layers": [None, "0", "99"]},
        {"batch_size": ["8", "2048"], "ubatch_size": ["8", "512"]},
        {"threads": ["1", "4"], "n_gen": ["1", "32"], "repetitions": ["1", "3"]},
        {"load_mode": ["mmap", "none"], "flash_attn": ["on", "off"]},
    ],
}  # fmt: skip

# Why a profile refuses a value the pinned build's parser takes (seen running the build on a
# tiny model where it says so).
STOI = "std::stoi reads the leading digits and drops the rest (1.5 runs as 1): whole numbers only"
NINE_DIGITS = "9 digits at most; 10-digit values up to 2^31-1 parse, and no count needs them"
WRAPS = "a negative size wraps in llama.cpp's unsigned field"
ONE_TEST = "a list or range is one llama-bench test per value, each a CSV row; a run is one row"
TRAILING = "a trailing separator is dropped: write the value without it"
LAYERS = (
    "999 layers at most: llama.cpp builds one tensor override per layer, and 4096 in all "
    "(with -ot's and --cpu-moe's) abort"
)
EMPTY = "an empty value is llama-bench's default: leave the knob out"
SERVER_INTS = (  # n_cpu_moe first: it stops at 3 digits
    "n_cpu_moe",
    "fit_ctx",
    "threads",
    "threads_batch",
    "batch_size",
    "ubatch_size",
    "ctx_size",
    "n_gpu_layers",
    "log_verbosity",
)
BENCH_RANGES = ("threads", "n_gen", "batch_size", "ubatch_size", "n_gpu_layers", "n_cpu_moe")

# What the profiles refuse and the pinned build's parser takes, on purpose, and why. Each is
# still asserted accepted by the engine, so a release that starts refusing one is seen.
NARROWER: dict[str, dict[tuple[str, str], str]] = {
    "llama-cpp": {
        **{(knob, "1.5"): STOI for knob in (*SERVER_INTS, "fit_target")},
        **{(knob, "2147483647"): NINE_DIGITS for knob in SERVER_INTS[1:]},
        **{("cpu_moe", word): "LLAMA_ARG_CPU_MOE is on for on/enabled/true/1 and silently off "
           "for any other value: the profile takes 1 and 0 (YAML's true/false reach it as 1/0)"
           for word in ("true", "on", "enabled", "2", "")},
        ("n_cpu_moe", "1,2"): STOI,
        ("n_cpu_moe", "4095"): LAYERS,
        ("fit_target", "-1"): "std::stoull wraps -1 to 2^64-1 MiB",
        ("fit_target", "1024,"): TRAILING,
        ("fit_ctx", "-1"): f"{WRAPS} (-c 0 is how to keep the model's whole context)",
        ("fit_ctx", "-8"): WRAPS,
        ("batch_size", "0"): "aborts at the model's load (GGML_ASSERT(n_outputs >= 1))",
        ("batch_size", "-1"): f"{WRAPS}, then is cut to the context",
        ("batch_size", "-8"): f"{WRAPS}, then is cut to the context",
        ("ubatch_size", "-1"): f"{WRAPS}, then is cut to the batch (0 is the batch size)",
        ("ubatch_size", "-8"): f"{WRAPS}, then is cut to the batch (0 is the batch size)",
        ("ctx_size", "-1"): f"{WRAPS}: the load fails (no buffer for the KV cache)",
        ("ctx_size", "-8"): f"{WRAPS}: the load fails (no buffer for the KV cache)",
    },
    "llama-bench": {
        **{(knob, value): ONE_TEST for knob in BENCH_RANGES for value in ("1,2", "1-4", "1-8*2")},
        **{(knob, "2,"): TRAILING for knob in BENCH_RANGES},
        **{(knob, ""): EMPTY for knob in (*BENCH_RANGES, "override_tensor")},
        **{("n_cpu_moe", v): f"{LAYERS} llama-server (llama-bench's runs out of memory at "
           "999999999)" for v in ("4095", "4096")},
        ("threads", "0"): "segfaults at the first test",
        ("n_gen", "0"): "no test to run: no row",
        ("batch_size", "0"): "aborts at the first test (GGML_ASSERT)",
        **{("repetitions", v): "no repetition is timed: avg_ts is 0" for v in ("0", "-1", "-8")},
        ("repetitions", "1.5"): STOI,
        ("repetitions", "1,2"): STOI,
        ("repetitions", "2147483647"): NINE_DIGITS,
        ("n_gpu_layers", "-1,2"): ONE_TEST,
        ("flash_attn", "0,1"): ONE_TEST,
        ("load_mode", "mmap,mlock"): ONE_TEST,
        ("override_tensor", "ffn_up_exps=CPU,ffn_down_exps=CPU"): f"{ONE_TEST} (';' joins "
        "placements within one test)",
        ("override_tensor", "exps=CPU;"): TRAILING,
    },
}  # fmt: skip

# What the pinned build refuses and validate cannot: a buffer type names a device of the box
# the run is on (CUDA0 on a CUDA box), and this build has CPU only; the knobs whose flag this
# build lacks (tests/engines/test_llama_moe_offload.py) are refused by name.
ENGINE_ALONE: dict[str, dict[tuple[str, str], str]] = {
    "llama-cpp": {
        ("override_tensor", "exps=CUDA0"): "a CUDA box's buffer type",
        ("override_tensor", "exps=GPU"): "no backend here names a buffer type GPU",
        ("moe_cache_mib", "64"): "--moe-cache-mib: not in the pinned build",
        ("mlock", "1"): "--mlock: not in the pinned build (load_mode)",
        ("no_mmap", "1"): "--no-mmap: not in the pinned build (load_mode)",
    },
    "llama-bench": {
        ("override_tensor", "exps=CUDA0"): "a CUDA box's buffer type",
        ("override_tensor", "exps=GPU"): "no backend here names a buffer type GPU",
        ("mmap", "0"): "-mmp: not in the pinned build (load_mode)",
        ("mmap", "1"): "-mmp: not in the pinned build (load_mode)",
    },
}
# The parsers' refusals, as they print them (llama-server: common/arg.cpp; llama-bench:
# tools/llama-bench/llama-bench.cpp, parse_cmd_params).
REFUSED = {
    "llama-server": re.compile(
        r'error while handling (?:argument|environment variable) "[^"]+": .*'
        r"|error: invalid argument: .*"
        r"|GGML_ASSERT\(.*\) failed"  # past the parser, before the model: too many overrides
    ),
    "llama-bench": re.compile(
        r"error: invalid parameter for argument: .*"
        r"|terminate called after throwing an instance of .*"  # past the parser: -ncmoe 999999999
    ),
}
# What a process prints once its arguments are taken and it goes on to load the model.
LOADING = {
    "llama-server": re.compile(r"loading model '|failed to load model"),  # -lv 1: errors only
    "llama-bench": re.compile(r"error: failed to load model '"),
}


def _values(profile_name: str, name: str, spec: Any) -> list[Any]:
    """Every value a card can give a knob: each choice and the engine's words beside them, a
    switch on and off, a pattern's representative and boundary values."""
    if spec.switch:
        return [True, False]
    return [*(spec.choices or []), *VALUES[profile_name].get(name, [])]


def _cells(profile_name: str, profile: RuntimeProfile) -> dict[str, dict[str, Any]]:
    """The card's cells: nothing set, each knob value alone, then the pairs' grids."""
    fixed = FIXED[profile_name]
    varied = [name for name in profile.knobs if name not in fixed]
    missing = [n for n in varied if not profile.knobs[n].switch and not _values(
        profile_name, n, profile.knobs[n])]  # fmt: skip
    assert not missing, f"{profile_name}: give these knobs values to try: {missing}"
    settings: list[dict[str, Any]] = [{}]
    settings += [{name: value} for name in varied
                 for value in _values(profile_name, name, profile.knobs[name])]  # fmt: skip
    for grid in PAIRS[profile_name]:
        for values in itertools.product(*grid.values()):
            settings.append({k: v for k, v in zip(grid, values, strict=True) if v is not None})
    cells = {}
    for index, knobs in enumerate(settings):
        cell: dict[str, Any] = {"knobs": {**fixed, **knobs}}
        if "model" in profile.files and "model" not in fixed:  # llama-bench: an uploaded file
            cell["files"] = {"model": "models/none.gguf"}
        cells[f"c{index}"] = cell
    return cells


def _command(profile: RuntimeProfile, cell: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment harness boots the cell with (port 0: any free one)."""
    uploaded = {"model": MISSING_MODEL} if cell.get("files") else {}
    spec = boot_spec(profile, Cell.model_validate(cell), port=0, run_dir="/nonexistent/run",
                     python="python3", bind_host="127.0.0.1", cache_dir="/nonexistent/cache",
                     uploaded=uploaded)  # fmt: skip
    return spec.argv, spec.env


def _judge(binary: str, argv: list[str], env: dict[str, str]) -> str | None:
    """The pinned build's verdict on one command line: its refusal, or None once it goes on to
    load the model (or, llama-bench, has no test to run)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    done = subprocess.run(argv, env={**base, **env}, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    text = done.stdout + done.stderr
    refused = REFUSED[binary].search(text)
    if refused:
        assert done.returncode != 0, text[-2000:]
        return refused.group(0)
    if binary == "llama-server" and not text.strip():
        # A quiet log (-lv 0 or below) hides even the load's error: `--version` after the
        # arguments exits 0 only once the environment and every argument before it parsed.
        again = subprocess.run([*argv, "--version"], env={**base, **env}, capture_output=True,
                               text=True, timeout=60, check=False)  # fmt: skip
        assert again.returncode == 0, (argv, env, again.stderr[-2000:])
        return None
    reached = LOADING[binary].search(text) or (binary == "llama-bench" and done.returncode == 0)
    assert reached, (argv, env, done.returncode, text[-2000:])
    return None


def _validate_refusals(
    folder: Path, profile_name: str, cells: dict[str, Any]
) -> dict[str, list[str]]:
    """What `harness validate` refuses of each cell (its problem lines), one card for all."""
    (folder / "prompts").symlink_to(REPO / "campaigns" / "prompts")
    (folder / "models").mkdir()
    (folder / "models" / "none.gguf").write_bytes(b"")
    card = yaml.safe_load(CARDS[profile_name].read_text(encoding="utf-8"))
    card.update(control="c0", cells=cells)
    card["gates"] = [{"kind": "better", "metric": "decode_tok_s"}]
    return validate_refusals(card, folder)


Judged = dict[str, tuple[dict[str, Any], dict[str, str | None], str | None]]


@pytest.fixture(scope="module")
def judged() -> Judged:
    """Per profile: its cells, the pinned build's verdict on each, and its verdict on a probe it
    must refuse (threads "two" straight to the binary: the judge can refuse)."""
    build.ensure_built()
    out: Judged = {}
    for name, binary in PROFILES.items():
        profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / f"{name}.yaml")
        cells = _cells(name, profile)
        commands = [_command(profile, cell) for cell in cells.values()]
        argv, env = commands[0]
        commands.append(([*argv, "-t", "two"], env))
        argvs, envs = zip(*commands, strict=True)
        with ThreadPoolExecutor(max_workers=4) as pool:
            *verdicts, probed = pool.map(_judge, itertools.repeat(binary), argvs, envs)
        out[name] = (cells, dict(zip(cells, verdicts, strict=True)), probed)
    return out


def _set(cell: dict[str, Any], pairs: dict[tuple[str, str], str]) -> bool:
    """Whether the cell sets any (knob, value) of ``pairs`` (values as the runtime reads them)."""
    return any(knob_text(cell["knobs"].get(k, "\0")) == v for k, v in pairs)


@pytest.mark.parametrize("profile_name", PROFILES)
def test_the_pinned_build_refuses_a_value_its_parser_cannot_read(
    judged: Judged, profile_name: str
) -> None:
    _, verdicts, probed = judged[profile_name]
    assert probed is not None and "-t" in probed, probed
    assert verdicts["c0"] is None  # the card's bare cell boots past its arguments


@pytest.mark.parametrize("profile_name", PROFILES)
def test_validate_refuses_what_the_pinned_build_refuses(
    judged: Judged, tmp_path: Path, profile_name: str
) -> None:
    cells, verdicts, _ = judged[profile_name]
    refused = _validate_refusals(tmp_path, profile_name, cells)
    engine = {name for name, why in verdicts.items() if why is not None}
    listed = {**NARROWER[profile_name], **ENGINE_ALONE[profile_name]}
    stale = {pair for pair in listed if not any(_set(cell, {pair: ""}) for cell in cells.values())}
    assert not stale, f"listed but in no cell: {stale}"
    lacking = {knob for knob, _ in ENGINE_ALONE[profile_name]} - {"override_tensor"}
    assert lacking == NOT_IN_THE_PINNED_BUILD[profile_name]
    alone = {n for n, cell in cells.items() if _set(cell, ENGINE_ALONE[profile_name])}
    assert alone <= engine, {n: cells[n]["knobs"] for n in alone - engine}
    assert not alone & set(refused), {n: refused[n] for n in alone & set(refused)}
    narrower = {n for n, cell in cells.items() if _set(cell, NARROWER[profile_name])}
    assert not narrower & engine, {n: (cells[n]["knobs"], verdicts[n]) for n in narrower & engine}
    assert narrower <= set(refused), {n: cells[n]["knobs"] for n in narrower - set(refused)}
    engine -= alone
    assert set(refused) - narrower == engine, {
        "validate alone": {n: (cells[n]["knobs"], refused[n])
                           for n in sorted(set(refused) - narrower - engine)},
        "engine alone": {n: (cells[n]["knobs"], verdicts[n])
                         for n in sorted(engine - set(refused))},
    }  # fmt: skip
