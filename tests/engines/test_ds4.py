"""ds4, seed 004's runtime: the Flash-shaped model, the profile fixes, and (slow) the real binary.

The slow tests run the seed-004 build of ds4 (`make ds4`: the CPU backend, built offline from the
source tarball in ../shared/third_party/ds4/ into ~/.cache/harness/ds4, under a minute once) on
the random-weight DeepSeek-V4-Flash-shaped GGUF (`harness make-ds4-model`, 2.8 GiB, under a
minute once). They build both when missing, unless HARNESS_DS4_NO_BUILD=1 (then they skip and
say how). One build, one model and one run of each campaign serve every slow test of this module:
ds4-server through campaigns/ds4-cpu-smoke.yaml (its two cells in sequence: two boots, not the
four of A/B/B/A), ds4-bench through a three-run card here. Most of the time is ds4's own CPU
arithmetic (a token takes 5-10 s with random weights of the real shape; a run of the smoke card
about 40 s on this 2-core machine).

What the CPU build cannot do is Metal-only in ds4 (SSD streaming, the expert cache and its log
line, hotlists and the applied-policy line): those tests read the exact lines ds4 prints (their
format strings in ds4.c and ds4_metal.m), and say so.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from gguf import GGUFReader

from harness.analyze.logit_parity import read_logit_dumps
from harness.card import load_card
from harness.card.resolve import load_runtime_profile
from harness.drive.client import is_reasoning_chunk
from harness.profiles.schema import KnobSpec
from harness.runtimes.applied_policy import add_exit_counters, applied_problems
from harness.runtimes.boot import boot_spec
from harness.runtimes.ds4 import build
from harness.runtimes.ds4.flash_model import SPECIAL_TOKENS, FlashShape, byte_alphabet, vocabulary
from harness.runtimes.ds4.flash_model import tensor_layout as flash_tensor_layout
from harness.runtimes.ds4.gguf_writer import ARRAY, F32, STRING, U32, Region, Value, write_gguf
from tests.conftest import REPO, run_cli, shipped_card_variant

RUNTIMES = REPO / "harness" / "profiles" / "data" / "runtimes"
SMOKE = REPO / "campaigns" / "ds4-cpu-smoke.yaml"
SMOKE_DESIGN = "design: {order: abba, cycles: 1, repeats: 1, cache_states: [warm], seed: 28}"
IN_SEQUENCE = (
    "design: {order: sequential, cycles: 1, repeats: 1, cache_states: [warm], seed: 28, washout: 0}"
)

# ---- the model writer ------------------------------------------------------------------------


def _fill(byte: int):  # type: ignore[no-untyped-def]
    def fill(handle, nbytes):  # type: ignore[no-untyped-def]
        handle.write(bytes([byte]) * nbytes)

    return fill


def test_gguf_writer_aliases_tensors_of_one_region(tmp_path: Path) -> None:
    regions = {
        "w": Region("F32", (4, 2), _fill(1)),
        "v": Region("Q8_0", (64,), _fill(2)),
        "unused": Region("F16", (8,), _fill(3)),
    }
    tensors = [("a.weight", "w"), ("b.weight", "w"), ("c.weight", "v")]
    metadata = [
        ("general.architecture", Value(STRING, "test")),
        ("n", Value(U32, 7)),
        ("xs", Value(ARRAY, [1.5, 2.5], F32)),
        ("names", Value(ARRAY, ["x", "ÿ"], STRING)),
    ]
    path = tmp_path / "t.gguf"
    size = write_gguf(path, metadata, tensors, regions)
    assert size == path.stat().st_size and not (tmp_path / "t.gguf.tmp").exists()
    reader = GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    assert by_name["a.weight"].data_offset == by_name["b.weight"].data_offset
    assert by_name["c.weight"].data_offset != by_name["a.weight"].data_offset
    assert by_name["a.weight"].shape.tolist() == [4, 2]
    assert by_name["c.weight"].n_bytes == 68  # two Q8_0 blocks of 34 bytes
    assert reader.fields["n"].parts[-1].tolist() == [7]
    # The data section holds each used region once: 32 bytes of F32, 68 of Q8_0, aligned.
    assert size - by_name["a.weight"].data_offset == 32 + 68 + (-68 % 32)


def test_gguf_writer_never_writes_through_a_planted_name_and_leaves_nothing_on_failure(
    tmp_path: Path,
) -> None:
    # The writer went through `<path>.tmp`: a symlink planted there had a 2.8 GiB model written
    # wherever it pointed, and a full disk kept the half-written file. Now a fresh mkstemp
    # file in the target's folder is renamed into place, or removed on any failure.
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    path = tmp_path / "t.gguf"
    (tmp_path / "t.gguf.tmp").symlink_to(victim)
    regions = {"w": Region("F32", (4, 2), _fill(1))}
    write_gguf(path, [("general.architecture", Value(STRING, "test"))], [("a", "w")], regions)
    assert victim.read_text() == "keep me\n" and GGUFReader(path).tensors[0].name == "a"
    assert oct(path.stat().st_mode & 0o777) == "0o644"

    def broken(handle, nbytes):  # type: ignore[no-untyped-def]
        handle.write(b"\0" * (nbytes // 2))
        raise OSError(28, "No space left on device")

    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OSError, match="No space left"):
        write_gguf(tmp_path / "u.gguf", [], [("a", "w")], {"w": Region("F32", (4, 2), broken)})
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_flash_layout_is_ds4s_fixed_shape() -> None:
    shape = FlashShape()
    layout = flash_tensor_layout(shape)
    names = [n for n, _, _ in layout]
    assert len(names) == len(set(names))
    by_name = {n: (t, d) for n, t, d in layout}
    # Dense first two layers, then compressed attention alternating ratio 4 (with the indexer) and
    # 128 (ds4_expected_layer_compress_ratio for Flash).
    assert "blk.1.attn_compressor_kv.weight" not in by_name
    assert by_name["blk.2.attn_compressor_ape.weight"] == ("F16", (1024, 4))
    assert by_name["blk.3.attn_compressor_ape.weight"] == ("F16", (512, 128))
    assert "blk.2.indexer.proj.weight" in by_name and "blk.3.indexer.proj.weight" not in by_name
    assert by_name["blk.42.ffn_gate_exps.weight"] == ("IQ2_XXS", (4096, 2048, 256))
    assert by_name["blk.42.ffn_down_exps.weight"] == ("Q2_K", (2048, 4096, 256))
    assert by_name["blk.2.ffn_gate_tid2eid.weight"] == ("I32", (6, 129280))
    assert "blk.3.ffn_gate_tid2eid.weight" not in by_name  # hash routing: first 3 layers only
    assert by_name["output.weight"] == ("Q8_0", (4096, 129280))
    assert sum(1 for n in names if n.endswith("ffn_up_exps.weight")) == 43


def test_tokenizer_has_the_byte_alphabet_merges_and_ds4s_specials() -> None:
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256 and alphabet[ord("A")] == "A" and alphabet[32] == "Ġ"
    tokens, merges, types = vocabulary(FlashShape.n_vocab)
    assert len(tokens) == len(set(tokens)) == len(types) == 129280
    assert tokens[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert set(alphabet) <= set(tokens)
    pieces = set(tokens)
    assert all(m.replace(" ", "") in pieces for m in merges) and "Ġ t" in merges
    assert types[:7] == [3] * 7 and set(types[7:]) == {1}


def test_make_ds4_model_refuses_a_directory(tmp_path: Path) -> None:
    result = run_cli("make-ds4-model", "-o", str(tmp_path))
    assert result.code == 2 and "is a directory" in result.stderr
    assert "Traceback" not in result.stderr


# ---- the profiles: what ds4 reads and prints -------------------------------------------------


def _card(tmp_path: Path, runtime: str, cells: str, gates: str = "") -> Path:
    shutil.copy(REPO / "campaigns" / "prompts" / "ds4-smoke.jsonl", tmp_path / "p.jsonl")
    path = tmp_path / "card.yaml"
    path.write_text(
        f"campaign: t\nruntime: {runtime}\nprompts: {{pools: [p.jsonl]}}\n"
        "workload: {phases: [{name: a, domains: [greeting], requests: 1}]}\n"
        f"cells:\n{cells}control: a\ndesign: {{order: abba, cycles: 1, cache_states: [warm]}}\n"
        + (f"gates:\n{gates}" if gates else ""),
        encoding="utf-8",
    )
    return path


def test_presence_tested_variables_are_unset_when_off(tmp_path: Path) -> None:
    # ds4 tests DS4_METAL_MEMORY_REPORT and …_TIMING_SUMMARY with getenv() != NULL: "0" is on.
    card = _card(
        tmp_path,
        "ds4-server",
        "  a: {knobs: {memory_report: false, timing_summary: false, hotlist_priority: legacy}}\n"
        "  b: {knobs: {memory_report: true}}\n",
    )
    loaded = load_card(card)
    envs = {}
    for name in ("a", "b"):
        envs[name] = boot_spec(
            loaded.runtime, loaded.card.cells[name], port=8000, run_dir="/r", python="python3",
            bind_host="127.0.0.1", cache_dir="/c", uploaded={},
        ).env  # fmt: skip
    assert "DS4_METAL_MEMORY_REPORT" not in envs["a"]
    assert "DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY" not in envs["a"]
    assert envs["b"]["DS4_METAL_MEMORY_REPORT"] == "1"
    assert envs["b"]["DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY"] == "1"  # its default: on
    assert envs["a"]["DS4_METAL_STREAMING_EXPERT_HOTLIST_PRIORITY"] == "legacy"
    # The variable that makes ds4 print its applied-policy line (ds4.c: only when it is set).
    assert envs["a"]["DS4_METAL_STREAMING_EXPERT_HOTLIST_PROFILE"] == "1"


def test_preload_zero_and_impossible_counters_are_card_errors(tmp_path: Path) -> None:
    card = _card(tmp_path, "ds4-server", "  a: {knobs: {preload_experts: 0}}\n  b: {}\n")
    result = run_cli("validate", str(card))
    assert result.code == 2 and "cells.a.knobs.preload_experts" in result.stderr
    # A counter the CPU build cannot produce is a validation error, not a "missing" at the end.
    card = _card(
        tmp_path,
        "ds4-server-cpu",
        "  a: {}\n  b: {knobs: {ctx: '128'}}\n",
        "  - {kind: counter, counter: bytes_read, max: 0}\n",
    )
    result = run_cli("validate", str(card))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "gates.0.counter: bytes_read cannot exist in runtime 'ds4-server-cpu'" in result.stderr
    assert "no SSD expert streaming" in result.stderr


def test_what_ds4_bench_refuses_between_its_knobs_is_a_card_error(tmp_path: Path) -> None:
    # ds4_bench.c's parse_options exits 2 on each (tests/engines/test_ds4_parsers.py runs it):
    # a first frontier past the last (its default ctx_max is 32768), a context past INT_MAX, an
    # allocation short of ctx_max + gen_tokens (this profile generates 2 by default), no prompt;
    # and a count past its strtol's INT_MAX.
    (tmp_path / "long.txt").write_text("hello\n", encoding="utf-8")
    cells = (
        "  a: {files: {prompt: long.txt}}\n"
        "  b: {files: {prompt: long.txt}, knobs: {ctx_start: '40000'}}\n"
        "  c: {files: {prompt: long.txt}, knobs: {ctx_max: '2147483600', gen_tokens: '64'}}\n"
        "  d: {files: {prompt: long.txt}, knobs: {ctx_max: '4096', ctx_alloc: '4098'}}\n"
        "  e: {knobs: {ctx_max: '4096', ctx_alloc: '4099'}}\n"
        "  f: {files: {prompt: long.txt}, knobs: {step_incr: '2147483648'}}\n"
    )
    result = run_cli("validate", str(_card(tmp_path, "ds4-cpu", cells)))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "cells.b.knobs.ctx_start: ds4-bench refuses ctx_start 40000 above ctx_max 32768" in (
        result.stderr
    )
    assert "cells.c.knobs.ctx_max: ds4-bench refuses ctx_max 2147483600 with gen_tokens 64" in (
        result.stderr
    )
    assert "cells.d.knobs.ctx_alloc: ds4-bench refuses ctx_alloc 4098" in result.stderr
    assert "cells.e.knobs.prompt_file: ds4-bench needs a prompt" in result.stderr
    assert "cells.f.knobs.step_incr: must be frontier increment, 1 to 2147483647" in result.stderr
    assert "cells.a." not in result.stderr and "cells.e.knobs.ctx_alloc" not in result.stderr


def test_a_knobs_bounds_hold_its_number_to_the_engines_integer_parse() -> None:
    spec = KnobSpec(arg="--ctx", pattern="[1-9][0-9]*(GB)?", bounds=(1, 2**31 - 1))
    assert spec.check("2147483647") is None and spec.check("12GB") is None
    assert spec.check("2147483648") is not None and spec.check("0") is not None
    for bad in ({"bounds": (1, 2)}, {"pattern": "[0-9]+", "bounds": (5, 1)}):
        with pytest.raises(ValueError, match="`bounds` \\[least, most\\] narrows a `pattern`"):
            KnobSpec(arg="--ctx", **bad)  # type: ignore[arg-type]


def test_a_thinking_stream_is_told_apart() -> None:
    # Chunks as ds4-server streamed them here for a chat request with thinking on (the default):
    # the thoughts of the random model decoded to an empty string, yet the key says what it was.
    thinking = json.loads(
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"ds4","choices":'
        '[{"index":0,"delta":{"reasoning_content":""},"finish_reason":null}]}'
    )
    answer = json.loads(
        '{"id":"chatcmpl-2","object":"chat.completion.chunk","model":"ds4","choices":'
        '[{"index":0,"delta":{"content":"\\u0012-"},"finish_reason":null}]}'
    )
    assert is_reasoning_chunk(thinking) and not is_reasoning_chunk(answer)
    assert not is_reasoning_chunk({"choices": [], "usage": {"completion_tokens": 2}})
    for name in ("ds4-server", "ds4-server-cpu"):  # both turn thinking off in every request
        api = load_runtime_profile(RUNTIMES / f"{name}.yaml").api
        assert api.extra_body == {"thinking": {"type": "disabled"}} and api.flavour == "chat"


def test_seed_004_control_is_the_built_in_hotlist() -> None:
    loaded = load_card(REPO / "campaigns" / "ds4-bench-hotlist.yaml")
    for cell in loaded.card.cells.values():
        assert not cell.files  # DS4_METAL_STREAMING_EXPERT_HOTLIST unset: ds4's compiled list
    assert loaded.card.cells["legacy"].knobs["hotlist_priority"] == "legacy"
    assert loaded.card.control == "legacy"


# The seed line as ds4.c prints it (Metal only: metal_graph_streaming_expert_hotlist_seed,
# "ds4: Metal streaming expert hotlist seed source=%s preload=%u loaded=%u layers=%u experts=%u
# priority=%s:%u time=%.3f ms"), for a build that applied the knob and one that ignored it.
SEED_LINE = (
    "ds4: Metal streaming expert hotlist seed source={source} preload=3097 loaded=3097 "
    "layers=43 experts=3097 priority={priority} time=1.250 ms"
)


@pytest.mark.parametrize("profile", ["ds4", "ds4-server"])
def test_applied_policy_line_must_agree_with_the_knobs(profile: str) -> None:
    checks = load_runtime_profile(RUNTIMES / f"{profile}.yaml").telemetry.applied
    builtin = SEED_LINE.format(source="built-in-flash", priority="legacy:0")
    assert applied_problems(checks, {"hotlist_priority": "legacy"}, "x\n" + builtin) == []
    ignored = SEED_LINE.format(source="built-in-flash", priority="adaptive:1")
    (problem,) = applied_problems(checks, {"hotlist_priority": "legacy"}, ignored, where="s.log")
    assert "hotlist_priority=legacy expects 'legacy:0'" in problem
    assert "applied 'adaptive:1' (s.log:1)" in problem
    fixed = SEED_LINE.format(source="built-in-flash", priority="fixed:7")
    assert applied_problems(checks, {"hotlist_priority": "7"}, fixed) == []
    assert applied_problems(checks, {}, ignored) == []  # unset: ds4's default, adaptive:1
    # A file hotlist: the source is the uploaded path; a file where none was set is wrong.
    on_file = SEED_LINE.format(source="/r/files/hotlist.txt", priority="adaptive:1")
    knobs = {"hotlist_priority": "adaptive", "files.hotlist": "/r/files/hotlist.txt"}
    assert applied_problems(checks, knobs, on_file) == []
    (problem,) = applied_problems(checks, {"hotlist_priority": "adaptive"}, on_file)
    assert "files.hotlist unset expects 'built-in-flash'" in problem
    # No line at all (no seeding, or a build that does not report): the run cannot be trusted.
    problems = applied_problems(checks, {"hotlist_priority": "legacy"}, "ds4: ready\n")
    assert len(problems) == 2 and all("printed no line" in p for p in problems)


# The streaming-cache line as ds4_metal.m prints it (Metal only; in ba2a729 from diagnostic paths,
# in later builds once at process cleanup).
CACHE_LINE = (
    "ds4:   streaming expert cache budget=3097 experts entries=3097 expert=6.75 MiB "
    "target=20.41 GiB live=20.41 GiB, hits=900 misses=100 hit_rate=0.900 wraps=0 evictions=40 "
    "buffer_allocs=1 buffer_reuses=2 evict_dontneed=0.00 GiB miss_willneed=0.00 GiB "
    "miss_pread=0.50 GiB pread_ms=12.000"
)


def test_exit_counters_are_read_after_the_stop() -> None:
    specs = load_runtime_profile(RUNTIMES / "ds4-server.yaml").telemetry.log_counters
    assert [s.at for s in specs] == ["exit"] * 3  # the cache line, the profiler's two
    payload = {
        "before": {"new": 1.0},
        "after": {"new": 2.0},
        "delta": {"new": 1.0},
        "missing": {"hits": "no log line gave it by the end of the run"},
    }
    read = add_exit_counters(payload, specs, "ds4: shutdown\n" + CACHE_LINE + "\n", where="s.log")
    assert read["delta"]["hits"] == 900 and read["delta"]["evictions"] == 40
    assert read["delta"]["bytes_read"] == 0.5 * 1024**3 and read["before"]["misses"] == 0
    assert set(read["missing"]) == {"expert_profile_records", "expert_hotlist_records"}
    assert read["delta"]["new"] == 1.0
    none = add_exit_counters(payload, specs, "ds4: shutdown\n", where="s.log")
    assert "after the stop" in none["missing"]["hits"] and "hits" not in none["delta"]


# ---- the real binaries (slow) ----------------------------------------------------------------


@pytest.fixture(scope="session")
def ds4_ready() -> Path:
    """The built binaries and the model; built here when missing (about 2 minutes, once)."""
    if not build.built() or not build.model_path().is_file():
        if os.environ.get("HARNESS_DS4_NO_BUILD") == "1":
            pytest.skip("ds4 is not built; run `make ds4`")
        build.ensure_built()
        build.ensure_model()
    return build.bin_dir()


@pytest.fixture(scope="session")
def smoke(ds4_ready: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """campaigns/ds4-cpu-smoke.yaml run once, its two cells in sequence rather than A/B/B/A
    and without a washout request (each request is ~30 s of ds4's arithmetic; the mirrored
    order and the washout add nothing these tests check): (campaign directory, output)."""
    work = tmp_path_factory.mktemp("ds4-card")
    # Without the competing-process guard (tests/execute/test_guards.py holds it): on a shared
    # test machine another test's runtime may run, which would rightly refuse the cohort.
    in_sequence = IN_SEQUENCE + "\nguards: {competing: false}"
    card = shipped_card_variant(SMOKE.name, work, {SMOKE_DESIGN: in_sequence})
    reports = tmp_path_factory.mktemp("ds4-reports")
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=900)
    (root,) = (reports / "ds4-cpu-smoke").iterdir()
    assert result.code == 0, result.stdout + result.stderr
    return root, result.stdout


@pytest.mark.slow
def test_ds4_server_smoke_campaign_passes_with_exact_outputs(smoke: tuple[Path, str]) -> None:
    root, output = smoke
    assert "verdict: PASS" in output
    verdict = json.loads((root / "verdict.json").read_text())
    (gate,) = verdict["gates"]
    assert gate["kind"] == "exact_outputs" and gate["passed"]
    runs = sorted((root / "runs").iterdir())
    assert [r.name.split("-")[1] for r in runs] == ["ctx64", "ctx128"]
    texts = set()
    for run in runs:
        record = json.loads((run / "run.json").read_text())
        assert record["status"] == "ok", record["reason"]
        requests = pd.read_parquet(run / "requests.parquet")
        (row,) = requests.itertuples()
        # Content counted (thinking off: no reasoning_content-only stream) and usage read.
        assert row.ok and row.output_text and row.completion_tokens == 2
        assert row.prompt_tokens == 5  # "Hi" in ds4's chat template
        texts.add(row.output_text)
        log = (run / "server.log").read_text(errors="replace")
        assert "ds4-server: listening on http://" in log  # the readiness line
        assert "shutdown requested, draining requests" in log  # SIGTERM drained
        assert "THINKING" not in log  # ds4-server logs a thinking request as such
    assert len(texts) == 1
    journal = [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "boot_stopped" for e in journal) == 2
    env = json.loads((root / "boxes" / "local.json").read_text())
    assert "git:     ba2a729" in env["runtime"]["version"]
    assert "backend: cpu" in env["runtime"]["version"]


BENCH_CARD = """
campaign: ds4-bench-real
box: local
runtime: ds4-cpu
prompts:
  pools: [p.jsonl]
workload:
  warmup_requests: 0
  phases:
    - {name: frontiers, domains: [greeting], requests: 1}
cells:
  ctrl:
    files: {prompt: prompt.txt}
    knobs: {model: MODEL, ctx_start: 2, ctx_max: 3, step_incr: 1, ctx_alloc: 8, gen_tokens: 1}
  same:
    files: {prompt: prompt.txt}
    knobs: {model: MODEL, ctx_start: 2, ctx_max: 3, step_incr: 1, ctx_alloc: 8, gen_tokens: 1}
  wider:
    description: the first frontier only, prefill only, another --ctx-alloc
    files: {prompt: prompt.txt}
    knobs: {model: MODEL, ctx_start: 2, ctx_max: 2, ctx_alloc: 9, gen_tokens: 0}
control: ctrl
design: {order: sequential, cycles: 1, cache_states: [warm]}
guards: {enabled: false}
gates:
  - {kind: exact_outputs, min_match: all}
"""


@pytest.fixture(scope="session")
def bench(ds4_ready: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The three-run ds4-bench card above, run once: (campaign directory, output)."""
    work = tmp_path_factory.mktemp("ds4-bench")
    shutil.copy(REPO / "campaigns" / "prompts" / "ds4-smoke.jsonl", work / "p.jsonl")
    (work / "prompt.txt").write_text("Hello world, this is a test.", encoding="utf-8")
    model = build.model_path()
    (work / "card.yaml").write_text(
        BENCH_CARD.replace("MODEL", json.dumps(str(model))), encoding="utf-8"
    )
    # The GGUF out of the page cache: the first run's probe then sees ds4's own reads bring
    # it back (ds4.c maps the model; the Metal build's expert streaming preads it).
    with open(model, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    reports = work / "reports"
    result = run_cli("run", str(work / "card.yaml"), "--reports", str(reports), timeout_s=900)
    (root,) = (reports / "ds4-bench-real").iterdir()
    return root, result.stdout + result.stderr


@pytest.mark.slow
def test_ds4_bench_frontiers_csv_logits_and_parity(bench: tuple[Path, str]) -> None:
    root, output = bench
    runs = {r.name.split("-")[1]: r for r in sorted((root / "runs").iterdir())}
    assert sorted(runs) == ["ctrl", "same", "wider"], output
    page_cache = {}
    for name, run in runs.items():
        record = json.loads((run / "run.json").read_text())
        assert record["status"] == "ok", record["reason"]
        page_cache[name] = record["runtime"]["box_state"]["page_cache"]
    # The page-cache probe (fincore) read around every run; the first run started on a GGUF
    # out of the cache, and ds4's own reads of it are what it saw move in.
    first = page_cache["ctrl"]
    assert first["tolerance"] == 0.02 and first["start"] == first["scored"]
    assert first["start"] < 0.5 and first["end"] > first["start"] + 0.02, page_cache
    assert page_cache["wider"]["start"] >= first["end"] - 0.02  # nothing evicted it since
    frame = pd.read_parquet(runs["ctrl"] / "bench.parquet")
    assert frame["tier"].tolist() == ["2", "3"]  # two frontiers (ctx_tokens), one row each
    assert (frame["decode_tok_s"] > 0).all() and (frame["ttft_ms"] > 0).all()
    assert "expert_loads" not in frame and "bytes_read" not in frame  # CPU zeros: not measured
    header = (runs["ctrl"] / "result.csv").read_text().splitlines()[0].split(",")
    assert len(header) == 39 and "gen_pread_gib" in header
    ctrl = read_logit_dumps(runs["ctrl"] / "logits")
    same = read_logit_dumps(runs["same"] / "logits")
    wider = read_logit_dumps(runs["wider"] / "logits")
    assert sorted(ctrl.hashes) == ["frontier_000002", "frontier_000003"]
    assert ctrl.hashes == same.hashes  # parity across two runs of one arm
    assert ctrl.embedded["ctx"] == {"8"} and wider.embedded["ctx"] == {"9"}
    assert ctrl.embedded["source"] == {"ds4-bench"} and ctrl.embedded["backend"] == {"cpu"}
    # Identical logits at frontier 2, another ctx: the hash differs and the analysis says why.
    first = json.loads((runs["ctrl"] / "logits" / "frontier_000002.logits.json").read_text())
    other = json.loads((runs["wider"] / "logits" / "frontier_000002.logits.json").read_text())
    assert first["logits"] == other["logits"] and first["ctx"] != other["ctx"]
    assert ctrl.hashes["frontier_000002"] != wider.hashes["frontier_000002"]
    summary = json.loads((root / "analysis" / "summary.json").read_text())
    (warning,) = [w for w in summary["warnings"] if "embed different strings" in w]
    assert "ctx (ctrl: 8, same: 8, wider: 9)" in warning
    verdict = json.loads((root / "verdict.json").read_text())
    (gate,) = verdict["gates"]
    cells = gate["evidence"]["cells"]
    assert cells["same"]["matched"] == 2 and cells["wider"]["matched"] == 0


@pytest.mark.slow
def test_ds4_bench_csv_imports(bench: tuple[Path, str], tmp_path: Path) -> None:
    # The real CSVs of the two identical arms, laid out as one A/B/B/A cycle by file name.
    root, _ = bench
    runs = {r.name.split("-")[1]: r for r in sorted((root / "runs").iterdir())}
    folder = tmp_path / "csv"
    folder.mkdir()
    for cell, slots in (("ctrl", (0, 3)), ("same", (1, 2))):
        for slot in slots:
            shutil.copy(runs[cell] / "result.csv", folder / f"{cell}-c0-s{slot}.csv")
    mapping = tmp_path / "map.yaml"
    mapping.write_text(
        "campaign: ds4-imported\nbox: local\ncontrol: ctrl\n"
        r"pattern: '(?P<cell>ctrl|same)-c(?P<cycle>\d+)-s(?P<slot>\d)\.csv'"
        "\n"
        "select: {ctx_tokens: 3}\ngates: [{kind: better, metric: decode_tok_s}]\n",
        encoding="utf-8",
    )
    files = sorted(str(p) for p in folder.iterdir())
    out = tmp_path / "imported"
    result = run_cli("import", "ds4", *files, "--map", str(mapping), "-o", str(out))
    assert result.code == 0, result.stdout + result.stderr
    written = pd.read_csv(runs["ctrl"] / "result.csv")
    speed = float(written.loc[written["ctx_tokens"] == 3, "gen_tps"].iloc[0])
    (record,) = [json.loads(p.read_text()) for p in out.glob("runs/0000-*/imported.json")]
    assert record["format"] == "ds4" and record["identity"]["columns"] == 39
    assert record["identity"]["ctx_tokens"] == ["3"]
    assert record["metrics"]["decode_tok_s"] == speed and record["fields"]["ttft_ms"] == "ttft_ms"
    assert "hit_rate" not in record["metrics"]  # the CPU build prints 0: no geomean, not kept


# ---- the runner's side of the Metal-only lines (slow) ----------------------------------------

# The reference runtime stands in for ds4-server on Metal, which cannot run here: a shell wrapper
# prints ds4's applied-policy line at boot (as a build that ignores the priority knob would: it
# always says adaptive) and ds4's cache line when the runner's SIGTERM stops it, as later builds
# print it at cleanup. The lines are ds4's format strings (SEED_LINE, CACHE_LINE above).
WRAPPER = (
    'echo "$SEED" >&2; "$0" -m harness.refbox serve "$@" & pid=$!; '
    "trap 'kill -TERM $pid; wait $pid; echo \"$CACHE\" >&2; exit 0' TERM; wait $pid"
)

METAL_STAND_IN = f"""
campaign: ds4-metal-lines
box: local
runtime:
  name: ds4-metal-stand-in
  boot:
    command: [sh, -c, {json.dumps(WRAPPER)}, "{{python}}", --host, "{{bind_host}}",
              --port, "{{port}}"]
    env:
      SEED: {json.dumps(SEED_LINE.format(source="built-in-flash", priority="adaptive:1"))}
      CACHE: {json.dumps(CACHE_LINE)}
  ready: {{http: {{path: /health, status: 200}}, timeout_s: 60, interval_s: 0.05}}
  api: {{flavour: completions, streaming: true, model: refbox}}
  stop: {{signal: TERM, grace_s: 15}}
  telemetry:
    log_counters:
      - pattern: 'streaming expert cache budget=.*\\bhits=(?P<hits>\\d+) misses=(?P<misses>\\d+) '
        at: exit
    applied:
      - knob: hotlist_priority
        pattern: 'hotlist seed source=\\S+ .*\\bpriority=(?P<applied>[a-z]+:\\d+)'
        expect: {{legacy: "legacy:0", adaptive: "adaptive:1"}}
  knobs:
    hotlist_priority:
      env: DS4_METAL_STREAMING_EXPERT_HOTLIST_PRIORITY
      choices: [legacy, adaptive]
prompts:
  pools: [prompts/mixed.jsonl]
workload:
  max_tokens: 4
  warmup_requests: 0
  phases:
    - {{name: a, domains: [en-prose], requests: 1}}
cells:
  legacy: {{knobs: {{hotlist_priority: legacy}}}}
  adaptive: {{knobs: {{hotlist_priority: adaptive}}}}
control: legacy
design: {{order: sequential, cycles: 1, cache_states: [warm]}}
guards: {{enabled: false}}
"""


@pytest.mark.slow
def test_runner_reads_exit_counters_and_fails_a_run_that_applied_another_policy(
    tmp_path: Path,
) -> None:
    shutil.copytree(REPO / "campaigns" / "prompts", tmp_path / "prompts")
    card = tmp_path / "card.yaml"
    card.write_text(METAL_STAND_IN, encoding="utf-8")
    result = run_cli("run", str(card), "--reports", str(tmp_path / "r"), "--quiet", timeout_s=300)
    assert "runs: 1 done, 1 failed" in result.stdout, result.stdout + result.stderr
    runs = sorted((tmp_path / "r").glob("*/*/runs/*"))
    assert [r.name.split("-")[1] for r in runs] == ["legacy", "adaptive"]
    for run in runs:
        record = json.loads((run / "run.json").read_text())
        counters = json.loads((run / "counters.json").read_text())
        if "-legacy-" in run.name:
            assert record["status"] == "failed"
            assert "hotlist_priority=legacy expects 'legacy:0'" in record["reason"]
            assert "applied 'adaptive:1'" in record["reason"]
        else:
            assert record["status"] == "ok", record["reason"]
        # Printed at the SIGTERM, after the workload: read after the stop, from 0 at the boot.
        assert counters["delta"]["hits"] == 900 and counters["delta"]["misses"] == 100
        assert counters["before"]["hits"] == 0 and counters["missing"] == {}
