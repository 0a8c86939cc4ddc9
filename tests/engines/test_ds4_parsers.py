"""ds4's own argument parsers judge what `harness validate` refuses of the four ds4 profiles.

For each profile (``ds4`` and ``ds4-server`` on Metal, ``ds4-cpu`` and ``ds4-server-cpu`` on the
Linux CPU build), every value a card can give each knob (each choice, a switch on and off, a
pattern's representatives and boundaries inside and outside it) and the knobs ds4 relates
(``--ctx-start`` against ``--ctx-max``, ``--ctx-alloc`` against both and ``--gen-tokens``,
``--step-mul`` against ``--step-incr``, the expert cache against its preload, the prompt given
never or twice) are cells of one card per profile. `harness validate` (``load_card``) judges the
card. Each cell's argv and env are built by harness's own ``boot_spec`` and judged by ds4:

- Flags: the seed-004 build itself (``make cpu`` of ba2a729, ``harness.runtimes.ds4.build``), run
  with the cell's argv and env as the harness would start it. Its ``parse_options``
  (ds4_bench.c, ds4_server.c) exits 2 naming what it refuses; past it, ``ds4_engine_open`` runs.
  A cell is accepted when ds4 gets that far: the CPU profiles to the model's open (``cannot open
  model``: the model path is one that does not exist), the Metal profiles to the backend check
  that is the first thing ``ds4_engine_open`` does after checking the model path is not empty
  (``metal backend requested but it is unavailable in this build``: the CPU build parses
  ``--metal`` and every other flag with the code a Metal build runs, as only the ROCm build
  compiles the parsers differently). No weights are read; a cell takes milliseconds.
- ``DS4_METAL_STREAMING_EXPERT_HOTLIST_PRIORITY`` (``hotlist_priority``): ds4 parses it only for
  the Metal backend (``ds4_engine_open`` after the backend check, and the Metal graph), which the
  CPU build never reaches. It is judged by ds4's own parser,
  ``ds4_parse_streaming_hotlist_priority_policy`` of ds4_ssd.c (a file of plain C with no other
  dependency), compiled from the source tarball with a ten-line driver and called with the value.
- The other env knobs are judged by reading the source, because no ds4 code can refuse them:
  ``DS4_EXPERT_PROFILE`` and ``DS4_EXPERT_HOTLIST`` (``expert_profile``, ``expert_hotlist_out``)
  are paths, read by ds4.c after the model opens and ignored when empty;
  ``DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY`` and ``DS4_METAL_MEMORY_REPORT`` are tested for
  presence (``getenv(...) != NULL``), and the harness sets them to 1 or leaves them unset. The
  cells that set them still run the binary (their flags are judged). ``HARNESS_DS4_MODEL``
  (the CPU profiles' ``model``) is judged by the binary: the profiles' ``sh -c`` expands it into
  ``-m`` (an empty one to the default model's path).

Each binary refuses a probe (``--ctx-start two`` / ``--ctx two``) and the compiled parser refuses
``0``: the judges can refuse. validate must refuse exactly the cells ds4 refuses, with one list
apart. NARROWER: other spellings of a number ds4 reads (``007``, ``+7``, a leading space,
``12gb``, ``1e1``…), an empty priority, a multiplier of 11 digits and an expert-cache budget of
more than 4294967295 GB, refused on purpose and each asserted accepted by ds4. What ds4-bench
refuses between its knobs and of a cell naming no prompt, validate refuses by its own rule
(``cell_checks._check_ds4_bench_frontiers``).

Nothing is stood in. The test skips when ds4 is not built and HARNESS_DS4_NO_BUILD=1; otherwise
it builds it (``make ds4``, about a minute once). All cells of the four profiles take about 5 s.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.card import Cell, load_runtime_profile
from harness.profiles.schema import KnobSpec, RuntimeProfile
from harness.runtimes.boot import boot_spec
from harness.runtimes.ds4 import build
from tests.conftest import REPO
from tests.engines.validate_cells import validate_refusals

pytestmark = pytest.mark.slow

PROFILES = ("ds4", "ds4-cpu", "ds4-server", "ds4-server-cpu")
INT_MAX = 2**31 - 1  # parse_int / parse_int_arg: strtol, then v <= 0 || v > INT_MAX refused
UINT32_MAX = 2**32 - 1  # ds4_ssd.c: strtoul of digits only, 0 or past UINT32_MAX refused
GIB_MAX = (2**64 - 1) // 2**30  # ds4_parse_gib_arg: v > UINT64_MAX / DS4_GIB refused
PRIORITY_ENV = "DS4_METAL_STREAMING_EXPERT_HOTLIST_PRIORITY"
MISSING_MODEL = "/nonexistent/ds4/ds4flash.gguf"

# Which of ds4's parsers reads each knob.
KIND = {
    "ctx_start": "int", "ctx_max": "int", "ctx_alloc": "int", "step_incr": "int",
    "threads": "int", "preload_experts": "int", "ctx": "int",
    "gen_tokens": "count", "step_mul": "multiplier", "cache_experts": "cache",
    "hotlist_priority": "priority",
    "model": "path", "prompt_file": "path", "expert_profile": "path", "expert_hotlist_out": "path",
}  # fmt: skip
# A kind's values: representatives and the boundaries of what ds4 takes, inside and outside.
VALUES = {
    "int": ["1", "4096", str(INT_MAX), str(INT_MAX + 1), "0", "-1", "", "abc", "1.5", "12GB",
            "7 ", "9" * 20],
    "count": ["0", "1", "4096", str(INT_MAX), str(INT_MAX + 1), "-1", "", "abc", "1.5", "7 "],
    "multiplier": ["1", "1.5", "2", "9999999999.5", "0.5", "0", "-1", "", "abc", "inf", "nan",
                   "1e400", "9" * 400, "2x"],
    "cache": ["1", "4096", str(UINT32_MAX), str(UINT32_MAX + 1), "0", "-1", "", "abc", "1.5",
              " 7", "+7", "12GB", "1GB", f"{GIB_MAX}GB", f"{GIB_MAX + 1}GB", "0GB", "GB",
              "1.5GB", "12 GB", "12GiB"],
    "priority": ["1", "7", str(UINT32_MAX), str(UINT32_MAX + 1), "0", "-1", "abc", "Legacy",
                 " 7", "+7"],
    "path": ["/nonexistent/ds4/other", ""],
}  # fmt: skip

# Where the profiles are narrower than ds4, on purpose: values ds4 accepts and validate refuses.
# Each is asserted accepted by ds4 and refused by validate, so a change on either side is seen.
SPELLING = (
    "another spelling of a number ds4 reads (strtol/strtod/strtoul): the harness records and "
    "compares the knob's text across arms, so one number has one spelling"
)
NARROWER = {
    "int": {" 7": SPELLING, "+7": SPELLING, "007": SPELLING},
    "count": {" 7": SPELLING, "+7": SPELLING, "007": SPELLING},
    "multiplier": {
        **dict.fromkeys((" 2", "+2", "02", "2.", "1e1", "0x2"), SPELLING),
        "10000000000": "sweeps as 9999999999 does: any multiplier past 2147483647 goes from "
        "ctx_start straight to ctx_max (ds4_bench.c next_frontier)",
    },
    "cache": {
        **dict.fromkeys(("007", "12gb", "012GB"), SPELLING),
        f"{GIB_MAX}GB": "a budget past 4294967295 GB (4 EiB) is held to the record count's "
        "bound: ds4 takes budgets to 17179869183 GB (UINT64_MAX bytes)",
    },
    "priority": {
        "007": "ds4 applies it as fixed:7 and telemetry.applied expects fixed:{value}: only "
        "the canonical spelling can be checked against the line ds4 prints",
        "": "ds4 reads an empty value as unset (adaptive:1), which telemetry.applied would "
        "check as fixed:; a card says `adaptive`",
    },
    "path": {},
}
# Knobs every cell of a profile sets (not varied alone): the model, and a bench's prompt.
BASE: dict[str, dict[str, Any]] = {
    "ds4": {"knobs": {"model": MISSING_MODEL}, "files": {"prompt": "prompt.txt"}},
    "ds4-cpu": {"knobs": {"model": MISSING_MODEL}, "files": {"prompt": "prompt.txt"}},
    "ds4-server": {"knobs": {"model": MISSING_MODEL}},
    "ds4-server-cpu": {"knobs": {"model": MISSING_MODEL}},
}
# What a single value of a frontier knob is set beside, so that only its own value is judged
# (ds4's defaults are --ctx-start 2048 and --ctx-max 32768).
CONTEXT = {
    "ctx_max": {"ctx_start": "1"},
    "ctx_alloc": {"ctx_start": "1", "ctx_max": "1", "gen_tokens": "0"},
}
# The knobs ds4 relates (ds4_bench.c parse_options; the cache's preload is clamped to the cache,
# ds4.c metal_graph_streaming_expert_preload_count), as grids crossed in full.
FRONTIERS: list[dict[str, list[str | None]]] = [
    {"ctx_start": [None, "1", "2", "3"], "ctx_max": [None, "2", "3"],
     "ctx_alloc": [None, "3", "4", "5"], "gen_tokens": ["0", "1"]},
    {"ctx_start": ["1"], "ctx_max": [str(INT_MAX - 2), str(INT_MAX - 1)],
     "gen_tokens": ["0", "1", "2"], "ctx_alloc": [None, str(INT_MAX)]},
    {"step_mul": [None, "1", "1.5", "2"], "step_incr": [None, "1", "4096"],
     "ctx_start": ["1"], "ctx_max": ["4096"]},
]  # fmt: skip
CACHE: list[dict[str, list[str | None]]] = [
    {"cache_experts": [None, "1", "4096", "12GB"], "preload_experts": [None, "1", "4096"]},
]
PAIRS = {"ds4": FRONTIERS + CACHE, "ds4-cpu": FRONTIERS, "ds4-server": CACHE, "ds4-server-cpu": []}
# Whole cells: a bench prompt never given, and given twice (knob and file: ds4 keeps the last).
NO_PROMPT = {"files": {}}
TWO_PROMPTS = {"knobs": {"prompt_file": "/nonexistent/ds4/prompt.txt"}}
EXTRA: dict[str, list[dict[str, Any]]] = {
    "ds4": [NO_PROMPT, TWO_PROMPTS],
    "ds4-cpu": [NO_PROMPT, TWO_PROMPTS],
    "ds4-server": [],
    "ds4-server-cpu": [],
}
# A flag each binary must refuse: the judge can refuse.
PROBES = {
    "ds4": ["--ctx-start", "two"],
    "ds4-cpu": ["--ctx-start", "two"],
    "ds4-server": ["--ctx", "two"],
    "ds4-server-cpu": ["--ctx", "two"],
}

# How far ds4 got: past its arguments, to the model's open (CPU) or the backend (Metal).
PAST_PARSING = ("ds4: cannot open model '", "backend requested but it is unavailable in this build")

# ds4's hotlist-priority parser, called as ds4_engine_open calls it, printing the policy as the
# Metal seed line names it (ds4.c: legacy, fixed, else adaptive).
PRIORITY_DRIVER = r"""
#include <stdio.h>
#include "ds4_ssd.h"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        ds4_streaming_hotlist_priority_policy p;
        int ok = ds4_parse_streaming_hotlist_priority_policy(argv[i], &p);
        const char *mode = p.mode == DS4_STREAMING_HOTLIST_PRIORITY_LEGACY ? "legacy" :
                           p.mode == DS4_STREAMING_HOTLIST_PRIORITY_FIXED ? "fixed" : "adaptive";
        printf("%d %s:%u\n", ok, mode, p.priority);
    }
    return 0;
}
"""


def _tarball() -> Path:
    """The source tarball the binaries were built from (as scripts/build-ds4.sh finds it)."""
    if os.environ.get("HARNESS_DS4_TARBALL"):
        return Path(os.environ["HARNESS_DS4_TARBALL"])
    for folder in (
        REPO.parent / "shared" / "third_party" / "ds4",
        Path("/work/shared/third_party/ds4"),
    ):
        found = sorted(folder.glob("ds4-*-src.tar.gz"))
        if found:
            return found[0]
    pytest.skip("no ds4 source tarball under ../shared/third_party/ds4/ (HARNESS_DS4_TARBALL)")


def _priority_judge(folder: Path) -> Path:
    """ds4_ssd.c and ds4_ssd.h from the tarball, compiled with PRIORITY_DRIVER."""
    with tarfile.open(_tarball()) as tar:
        for name in ("ds4_ssd.c", "ds4_ssd.h"):
            member = tar.getmember(f"./{name}")
            handle = tar.extractfile(member)
            assert handle is not None
            (folder / name).write_bytes(handle.read())
    (folder / "driver.c").write_text(PRIORITY_DRIVER, encoding="utf-8")
    judge = folder / "priority-judge"
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "no C compiler: ds4 could not have been built either"
    done = subprocess.run(
        [compiler, "-O1", "-o", str(judge), "driver.c", "ds4_ssd.c"],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return judge


def _priorities(judge: Path, values: list[str]) -> dict[str, tuple[bool, str]]:
    """ds4's verdict on each priority value and the policy it applies (legacy:0, fixed:7…)."""
    done = subprocess.run([str(judge), *values], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == len(values), done.stdout
    return {
        v: (line.split()[0] == "1", line.split()[1]) for v, line in zip(values, lines, strict=True)
    }


def _values(knob: str, spec: KnobSpec) -> list[Any]:
    """Every value a card can give a knob: each choice, a switch on and off, its kind's values
    and the other spellings the profile refuses on purpose."""
    if spec.switch:
        return [True, False]
    kind = KIND[knob]
    return [*(spec.choices or []), *VALUES[kind], *NARROWER[kind]]


def _cells(name: str, profile: RuntimeProfile) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The card's cells (each knob value alone, the grids, the whole cells) and those whose
    value the profile refuses on purpose, with why."""
    settings: list[dict[str, Any]] = [{}]
    narrowed: dict[int, str] = {}
    for knob, spec in profile.knobs.items():
        for value in _values(knob, spec):
            reason = None if spec.switch else NARROWER[KIND[knob]].get(value)
            if reason:
                narrowed[len(settings)] = f"{knob}={value!r}: {reason}"
            settings.append({"knobs": {**CONTEXT.get(knob, {}), knob: value}})
    for grid in PAIRS[name]:
        for values in itertools.product(*grid.values()):
            knobs = {k: v for k, v in zip(grid, values, strict=True) if v is not None}
            settings.append({"knobs": knobs})
    settings += EXTRA[name]
    cells = {}
    for index, setting in enumerate(settings):
        cells[f"c{index}"] = {
            "knobs": {**BASE[name]["knobs"], **setting.get("knobs", {})},
            "files": dict(setting.get("files", BASE[name].get("files", {}))),
        }
    return cells, {f"c{index}": why for index, why in narrowed.items()}


def _run_binary(argv: list[str], env: dict[str, str], bin_dir: Path, work: Path) -> str | None:
    """ds4's verdict on one command line: None past its arguments, else what it printed."""
    cache = work / "cache"  # HARNESS_CACHE of the CPU profiles: the build, and no model
    full_env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(work),
        "HARNESS_CACHE": str(cache),
        "DS4_LOCK_FILE": str(work / f"ds4-{os.urandom(6).hex()}.lock"),  # not /tmp/ds4.lock
        **env,
    }
    done = subprocess.run(
        argv, env=full_env, capture_output=True, text=True, timeout=60, check=False
    )
    if any(marker in done.stderr for marker in PAST_PARSING):
        return None
    assert done.returncode in (1, 2), (argv, done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {done.returncode}"


def _boot(profile: RuntimeProfile, cell: dict[str, Any], work: Path) -> tuple[list[str], dict]:
    """The argv and env harness boots the cell with (its files uploaded under the run)."""
    uploaded = {key: f"{work}/run/files/{Path(rel).name}" for key, rel in cell["files"].items()}
    spec = boot_spec(profile, Cell.model_validate(cell), port=8000, run_dir=f"{work}/run",
                     python="python3", bind_host="127.0.0.1", cache_dir=f"{work}/cache",
                     uploaded=uploaded)  # fmt: skip
    return spec.argv, spec.env


Judged = tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, str | None], str | None]


@pytest.fixture(scope="module")
def ds4_bin() -> Path:
    """The seed-004 binaries; built when missing (about a minute, once)."""
    if not build.built():
        if os.environ.get("HARNESS_DS4_NO_BUILD") == "1":
            pytest.skip("ds4 is not built; run `make ds4`")
        build.ensure_built()
    return build.bin_dir().resolve()


@pytest.fixture(scope="module")
def priority_judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ds4's hotlist-priority parser, compiled from the source tarball."""
    return _priority_judge(tmp_path_factory.mktemp("ds4-priority"))


@pytest.fixture(scope="module")
def judged(
    ds4_bin: Path, priority_judge: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Judged]:
    """Per profile: its cells, those narrowed on purpose, ds4's verdict on each, and its
    verdict on the probe every binary must refuse."""
    work = tmp_path_factory.mktemp("ds4-parsers")
    (work / "cache" / "ds4").mkdir(parents=True)
    (work / "cache" / "ds4" / "bin").symlink_to(ds4_bin)
    out: dict[str, Judged] = {}
    for name in PROFILES:
        profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / f"{name}.yaml")
        cells, narrowed = _cells(name, profile)
        boots = [_boot(profile, cell, work) for cell in cells.values()]
        probe_argv = [*boots[0][0], *PROBES[name]]
        with ThreadPoolExecutor(4) as pool:
            *ran, probe = pool.map(
                lambda boot: _run_binary(boot[0], boot[1], ds4_bin, work),
                [*boots, (probe_argv, boots[0][1])],
            )
        priorities = _priorities(
            priority_judge, sorted({env[PRIORITY_ENV] for _, env in boots if PRIORITY_ENV in env})
        )
        verdicts: dict[str, str | None] = {}
        for cell, (_, env), verdict in zip(cells, boots, ran, strict=True):
            value = env.get(PRIORITY_ENV)
            if verdict is None and value is not None and not priorities[value][0]:
                verdict = f"ds4: invalid {PRIORITY_ENV}={value}"  # ds4_engine_open's words
            verdicts[cell] = verdict
        out[name] = (cells, narrowed, verdicts, probe)
    return out


def _validate_refusals(folder: Path, profile_name: str, cells: dict[str, Any]) -> dict[str, list]:
    """What `harness validate` refuses of each cell (its problem lines), one card for all."""
    shutil.copy(REPO / "campaigns" / "prompts" / "ds4-smoke.jsonl", folder / "p.jsonl")
    (folder / "prompt.txt").write_text("Hello world, this is a test.", encoding="utf-8")
    card = {
        "campaign": "ds4-parsers",
        "runtime": profile_name,
        "prompts": {"pools": ["p.jsonl"]},
        "workload": {"phases": [{"name": "a", "domains": ["greeting"], "requests": 1}]},
        "cells": {name: {k: v for k, v in cell.items() if v} for name, cell in cells.items()},
        "control": "c0",
        "design": {"order": "abba", "cycles": 1, "cache_states": ["warm"]},
    }
    return validate_refusals(card, folder)


@pytest.mark.parametrize("profile_name", PROFILES)
def test_each_profiles_binary_refuses_a_probe_and_accepts_the_base_cell(
    judged: dict[str, Judged], profile_name: str
) -> None:
    _, _, verdicts, probe = judged[profile_name]
    assert probe is not None and "invalid value for --" in probe and probe.endswith(": two")
    assert verdicts["c0"] is None


def test_ds4s_priority_parser_refuses_what_it_should_and_applies_what_the_profiles_expect(
    priority_judge: Path,
) -> None:
    values = ["legacy", "adaptive", "", "0", "7", str(UINT32_MAX), str(UINT32_MAX + 1), " 7"]
    judged = _priorities(priority_judge, values)
    assert [ok for ok, _ in judged.values()] == [True, True, True, False, True, True, False, False]
    for name in ("ds4", "ds4-server"):
        profile = load_runtime_profile(REPO / "campaigns" / "runtimes" / f"{name}.yaml")
        (applied,) = [a for a in profile.telemetry.applied if a.knob == "hotlist_priority"]
        spec = profile.knobs["hotlist_priority"]
        for value in ("legacy", "adaptive", "7", str(UINT32_MAX)):
            assert spec.check(value) is None
            assert judged[value] == (True, applied.expected(value)), value
        assert applied.expected(None) == judged[""][1]  # unset (or empty): ds4's default


@pytest.mark.parametrize("profile_name", PROFILES)
def test_validate_refuses_exactly_what_ds4_refuses(
    judged: dict[str, Judged], tmp_path: Path, profile_name: str
) -> None:
    cells, narrowed, verdicts, _ = judged[profile_name]
    refused = set(_validate_refusals(tmp_path, profile_name, cells))
    engine = {name for name, why in verdicts.items() if why is not None}
    assert 0 < len(engine) < len(cells)
    # Narrower on purpose: ds4 takes each of these values, validate refuses it.
    assert not set(narrowed) & engine, {n: narrowed[n] for n in set(narrowed) & engine}
    assert set(narrowed) <= refused, {n: narrowed[n] for n in set(narrowed) - refused}
    missed = engine - refused
    assert not missed, {n: (cells[n], verdicts[n]) for n in sorted(missed)}
    wider = refused - engine - set(narrowed)
    assert not wider, {n: cells[n] for n in sorted(wider)}
