"""vLLM as a runtime: the tiny model, switch and required knobs, count dumps, the idle check,
and (slow) the real engine booted, measured, gated and reported, its routing fitted and replayed.

The slow tests need the venv `make vllm` builds into ~/.cache/harness/vllm (a few minutes, once
per machine). They build it when missing, unless HARNESS_VLLM_NO_BUILD=1, in which case they
skip and say how to build. One campaign run (two boots) and one collection (one boot) serve
every slow test of this module but the client benchmark's (one boot of its own).

The campaign is the shipped card with its runs in sequence (control, then treatment: two boots,
not the four of A/B/B/A): a boot is most of a run's minute here, and what these tests check, the
gates, counters, routing and report, needs each cell once, not the mirrored order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.card import load_card
from harness.errors import BadInput, CardError
from harness.execute.guards import idle_value, wait_idle
from harness.formats.maps import CountDump, read_count_dump, read_rowmap
from harness.profiles.schema import Idle, KnobSpec
from harness.runtimes.boot import boot_spec
from harness.runtimes.routes import route_counters, write_route_delta
from harness.runtimes.vllm import build
from harness.runtimes.vllm.model import (
    TinyQwen3MoeShape,
    tokenizer_json,
    vocabulary,
    write_tiny_qwen3_moe,
)
from tests.conftest import REPO, run_cli, shipped_card_variant

CARD = REPO / "campaigns" / "vllm-moe.yaml"
SHIPPED_DESIGN = "design: {order: abba, cycles: 1, repeats: 1, cache_states: [warm], seed: 16}"
IN_SEQUENCE = "design: {order: sequential, cycles: 1, repeats: 1, cache_states: [warm], seed: 16}"
TOP_K, LAYERS = TinyQwen3MoeShape.top_k, TinyQwen3MoeShape.layers


# ---- the tiny model ---------------------------------------------------------------------------


def _safetensors_header(path: Path) -> dict[str, dict[str, object]]:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header: dict[str, dict[str, object]] = json.loads(raw[8 : 8 + size])
    end = max(int(v["data_offsets"][1]) for v in header.values())  # type: ignore[index]
    assert 8 + size + end == len(raw)  # the tensors fill the file exactly
    return header


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    digests = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        write_tiny_qwen3_moe(tmp_path / name, seed)
        digests.append(
            hashlib.sha256((tmp_path / name / "model.safetensors").read_bytes()).hexdigest()
        )
    assert digests[0] == digests[1] != digests[2]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()


def test_model_has_the_qwen3_moe_layout_vllm_loads(tmp_path: Path) -> None:
    summary = write_tiny_qwen3_moe(tmp_path, 1)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts"], config["num_experts_per_tok"]) == (8, 2)
    assert config["num_hidden_layers"] == 4 and config["hidden_size"] == 128
    header = _safetensors_header(tmp_path / "model.safetensors")
    assert header["model.layers.3.mlp.gate.weight"]["shape"] == [8, 128]
    assert header["model.layers.0.mlp.experts.7.down_proj.weight"]["shape"] == [128, 64]
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], 128]
    assert 900_000 < summary["n_params"] < 1_100_000


def test_tokenizer_pieces_are_printable_text() -> None:
    pieces = vocabulary()
    assert len(set(pieces)) == len(pieces)
    # No byte-level pieces: each token is text on its own, so vLLM streams token by token.
    assert not any(p.startswith("<0x") for p in pieces)
    assert all(p.isprintable() or p in "\n\t" for p in pieces)
    model = tokenizer_json()["model"]
    assert model["byte_fallback"] is False and model["vocab"]["<|endoftext|>"] == 1


def test_bad_shape_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"top_k 9 must be in 1\.\.8"):
        write_tiny_qwen3_moe(tmp_path, 1, TinyQwen3MoeShape(top_k=9))
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match="not a directory"):
        write_tiny_qwen3_moe(tmp_path / "file", 1)


def test_make_vllm_model_verb(tmp_path: Path) -> None:
    result = run_cli("make-vllm-model", "-o", str(tmp_path / "m"), "--seed", "2")
    assert result.code == 0, result.stderr
    assert "4 layers x 8 experts (top 2)" in result.stdout
    digest = hashlib.sha256((tmp_path / "m" / "model.safetensors").read_bytes()).hexdigest()
    assert digest in result.stdout


# ---- knobs: switches, required ones -----------------------------------------------------------


def _vllm_card(tmp_path: Path, cells: str, runtime: str = "vllm") -> Path:
    shutil.copy(REPO / "campaigns" / "prompts" / "shared-prefix.jsonl", tmp_path / "p.jsonl")
    path = tmp_path / "card.yaml"
    path.write_text(
        f"campaign: t\nruntime: {runtime}\nprompts: {{pools: [p.jsonl]}}\ncells:\n{cells}"
        "control: a\ndesign: {order: abba, cycles: 1, cache_states: [warm]}\n",
        encoding="utf-8",
    )
    return path


def test_switch_knobs_are_flags_without_values(tmp_path: Path) -> None:
    card = _vllm_card(
        tmp_path,
        "  a: {knobs: {enforce_eager: true, prefix_caching: false, max_num_seqs: 4}}\n"
        "  b: {knobs: {enforce_eager: false, prefix_caching: true}}\n",
    )
    loaded = load_card(card)
    argvs = {}
    for name in ("a", "b"):
        spec = boot_spec(
            loaded.runtime, loaded.card.cells[name], port=8000, run_dir="/r", python="python3",
            bind_host="127.0.0.1", cache_dir="/c", uploaded={},
        )  # fmt: skip
        argvs[name] = spec.argv
        assert spec.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert spec.env["HARNESS_VLLM_ROUTES"] == "/r/route-counts.json"
        assert spec.env["VLLM_CACHE_ROOT"] == "/c/vllm"  # compiled with the plugin, never mixed
    a, b = argvs["a"], argvs["b"]
    assert "--enforce-eager" in a and "--enforce-eager" not in b
    assert "--no-enable-prefix-caching" in a and "--enable-prefix-caching" in b
    assert a[a.index("--max-num-seqs") + 1] == "4"
    assert a[a.index("--distributed-executor-backend") + 1] == "uni"  # a default
    assert "1" not in a[a.index("--enforce-eager") :][:2][1:]  # no value after a switch


def test_bad_switch_value_and_bad_switch_spec(tmp_path: Path) -> None:
    card = _vllm_card(tmp_path, "  a: {knobs: {enforce_eager: maybe}}\n  b: {}\n")
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert "cells.a.knobs.enforce_eager: is a switch (--enforce-eager)" in "\n".join(
        caught.value.lines()
    )
    with pytest.raises(ValueError, match="a `switch` knob is a flag"):
        KnobSpec(env="X", arg="--x", switch=True)
    with pytest.raises(ValueError, match="`off_arg` belongs to a `switch` flag knob"):
        KnobSpec(arg="--x", off_arg="--no-x")
    with pytest.raises(ValueError, match="`off_arg` belongs to a `switch` flag knob"):
        KnobSpec(env="X", switch=True, off_arg="--no-x")


def test_cuda_lane_needs_its_image_and_validates_without_placeholders(tmp_path: Path) -> None:
    text = (REPO / "campaigns" / "runtimes" / "cuda-lane.yaml").read_text()
    assert "vllm-lane:latest" not in text and "your image" not in text
    card = _vllm_card(
        tmp_path,
        "  a: {knobs: {model_dir: /models/m, peer: '0'}}\n"
        "  b: {knobs: {image: 'lane:1', model_dir: /models/m, enforce_eager: true}}\n",
        runtime="cuda-lane",
    )
    with pytest.raises(CardError) as caught:
        load_card(card)
    assert "cells.a.knobs: runtime 'cuda-lane' needs knob 'image'" in "\n".join(
        caught.value.lines()
    )
    card.write_text(card.read_text().replace("{model_dir:", "{image: 'lane:1', model_dir:", 1))
    loaded = load_card(card)
    assert loaded.runtime.telemetry.count_dump is not None
    assert run_cli("validate", str(card)).code == 0
    cold = card.read_text().replace("cache_states: [warm]", "cache_states: [warm, cold]")
    card.write_text(cold)
    result = run_cli("validate", str(card))
    assert result.code == 2 and "declares no `cache_files`" in result.stdout + result.stderr


# ---- count dumps and the idle check -----------------------------------------------------------


def test_route_delta_is_the_runs_own_routing(tmp_path: Path) -> None:
    before = CountDump(np.array([[1, 2], [3, 0]], dtype=np.int64), 10.0)
    after = CountDump(np.array([[4, 2], [3, 3]], dtype=np.int64), 20.0)
    assert route_counters(after) == {"route_selections": 12.0}
    assert route_counters(None) == {}
    assert write_route_delta(tmp_path / "d.json", before, after)
    assert read_count_dump(tmp_path / "d.json").tolist() == [[3, 0], [0, 3]]
    # Counts going backwards mean the runtime restarted: no delta rather than a wrong one.
    assert not write_route_delta(tmp_path / "x.json", after, before)
    assert not write_route_delta(tmp_path / "x.json", None, after)
    assert not (tmp_path / "x.json").exists()


class _Metrics:
    """A real HTTP server whose /metrics serves what the test sets."""

    def __init__(self) -> None:
        self.text = ""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def metrics() -> Iterator[_Metrics]:
    server = _Metrics()
    yield server
    server.server.shutdown()
    server.server.server_close()


GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting"]


def test_idle_check_waits_for_zero_and_times_out(metrics: _Metrics) -> None:
    labels = '{engine="0",model_name="m"}'
    metrics.text = f"vllm:num_requests_running{labels} 0.0\nvllm:num_requests_waiting{labels} 0\n"
    check = wait_idle(metrics.url, "/metrics", Idle(metrics=GAUGES, for_s=0.6))
    assert check.passed, check.reason
    metrics.text = f"vllm:num_requests_running{labels} 2.0\nvllm:num_requests_waiting{labels} 1\n"
    busy = wait_idle(metrics.url, "/metrics", Idle(metrics=GAUGES, for_s=0, timeout_s=1))
    assert not busy.passed and "running=2, vllm:num_requests_waiting=1" in busy.reason
    metrics.text = "other 1\n"
    absent = wait_idle(metrics.url, "/metrics", Idle(metrics=GAUGES))
    assert not absent.passed and "serves no vllm:num_requests_running" in absent.reason
    assert idle_value({"a{x=1}": 1.0, "a{x=2}": 2.0, "ab": 5.0}, "a") == 3.0


def test_bench_serve_fixture_is_a_saved_result() -> None:
    data = json.loads((REPO / "tests" / "data" / "vllm" / "bench-serve-random-c1.json").read_text())
    assert data["backend"] == "vllm" and data["max_concurrency"] == 1
    assert data["completed"] == data["num_prompts"] and data["failed"] == 0
    assert {"median_ttft_ms", "median_tpot_ms", "p99_itl_ms"} <= set(data)


# ---- the real engine (slow) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_env() -> Path:
    """The venv and the tiny model; built here when missing (minutes, once)."""
    if not build.built():
        if os.environ.get("HARNESS_VLLM_NO_BUILD") == "1":
            pytest.skip("the vLLM venv is not built; run `make vllm`")
        build.ensure_built()
    build.ensure_model()
    return build.venv_dir()


@pytest.fixture(scope="module")
def campaign(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """campaigns/vllm-moe.yaml run once, its runs in sequence: (campaign directory, output)."""
    work = tmp_path_factory.mktemp("vllm-card")
    card = shipped_card_variant(CARD.name, work, {SHIPPED_DESIGN: IN_SEQUENCE})
    reports = tmp_path_factory.mktemp("reports")
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=1500)
    (root,) = (reports / "vllm-moe").iterdir()
    assert result.code == 0, result.stdout + result.stderr
    return root, result.stdout


def _delta(run: Path) -> dict[str, float]:
    delta: dict[str, float] = json.loads((run / "counters.json").read_text())["delta"]
    return delta


def _sum(delta: dict[str, float], name: str) -> float:
    return sum(v for k, v in delta.items() if k == name or k.startswith(name + "{"))


@pytest.mark.slow
def test_campaign_passes_with_exact_outputs_and_vllm_counters(campaign: tuple[Path, str]) -> None:
    root, output = campaign
    assert "verdict: PASS" in output
    verdict = json.loads((root / "verdict.json").read_text())
    kinds = {g["kind"] for g in verdict["gates"]}
    assert {"exact_outputs", "counter"} <= kinds and all(g["passed"] for g in verdict["gates"])
    runs = sorted((root / "runs").iterdir())
    assert [r.name.split("-")[1] for r in runs] == ["nocache", "cache"]
    journal = [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]
    idle = [e for e in journal if e["event"] == "idle_checked"]
    assert len(idle) == 2 and all(e["passed"] for e in idle)  # vLLM served nobody else
    for run in runs:
        record = json.loads((run / "run.json").read_text())
        assert record["status"] == "ok"
        requests = pd.read_parquet(run / "requests.parquet")
        scored = requests[~requests["warmup"]]
        # Tokens come from usage, and agree with vLLM's own count of what it generated.
        assert (scored["completion_tokens"] == 16).all()
        assert scored["completion_tokens"].sum() == _sum(
            _delta(run), "vllm:generation_tokens_total"
        )
    cache = [r for r in runs if "-cache-" in r.name]
    assert all(_sum(_delta(r), "vllm:prefix_cache_hits_total") > 0 for r in cache)
    # prefix_caching's engagement signature: vLLM looked its cache up (it counts no lookup with
    # caching off), so the cell is engaged and the verdict has no engagement failure.
    from harness.analyze.campaign import analyze_campaign

    engagement = analyze_campaign(root).engagement
    assert engagement is not None
    (row,) = engagement.rows
    assert (row.cell, row.knob, row.value, row.engaged) == ("cache", "prefix_caching", "true", True)
    assert all(_sum(_delta(r), "vllm:prefix_cache_queries_total") == 0 for r in runs[:1])
    env = json.loads((root / "boxes" / "local.json").read_text())
    assert "vllm 0.32.0+cpu" in env["runtime"]["version"]
    assert "RECORD sha256" in env["runtime"]["version"]


@pytest.mark.slow
def test_route_counts_sum_to_top_k_times_routed_tokens(campaign: tuple[Path, str]) -> None:
    root, _ = campaign
    for run in sorted((root / "runs").iterdir()):
        delta = _delta(run)
        # Routed tokens: prompt tokens not served from the prefix cache, plus every generated
        # token but each request's last (it is never fed back through the model).
        routed = (
            _sum(delta, "vllm:prompt_tokens_total")
            - _sum(delta, "vllm:prefix_cache_hits_total")
            + _sum(delta, "vllm:generation_tokens_total")
            - _sum(delta, "vllm:request_success_total")
        )
        counts = read_count_dump(run / "route-counts.json")
        assert counts.shape == (LAYERS, 8)
        assert counts.sum(axis=1).tolist() == [TOP_K * routed] * LAYERS, run.name
        assert delta["route_selections"] == LAYERS * TOP_K * routed


@pytest.mark.slow
def test_report_shows_vllm_counters_and_routing(campaign: tuple[Path, str]) -> None:
    root, _ = campaign
    html = (root / "report.html").read_text()
    assert "Runtime counters" in html and "vllm:prefix_cache_hits_total" in html
    assert "Routing</h3>" in html and "most used experts" in html
    summary = json.loads((root / "analysis" / "summary.json").read_text())
    routing = {c["cell"]: c for c in summary["runtime"]["routing"]}
    assert routing["nocache"]["balanced"] and routing["cache"]["balanced"]
    # A cached prompt token is never routed: the cache cell routes fewer selections.
    nocache = routing["nocache"]["layers"][0]["selections"]
    assert routing["cache"]["layers"][0]["selections"] < nocache


@pytest.mark.slow
def test_fit_map_and_simulate_on_vllms_routing(campaign: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = campaign
    run = next(r for r in sorted((root / "runs").iterdir()) if "-nocache-" in r.name)
    fitted = tmp_path / "fitted.json"
    result = run_cli("fit-map", str(run / "route-counts.json"), "--top", "4", "-o", str(fitted))
    assert result.code == 0, result.stderr
    rowmap = read_rowmap(fitted, experts=8)
    counts = read_count_dump(run / "route-counts.json")
    for layer, hot in enumerate(rowmap.hot):
        assert sorted(hot) == sorted(np.argsort(-counts[layer], kind="stable")[:4].tolist())
    # The run's per-step trace, replayed by the simulator through seed 000's policy.
    stale = tmp_path / "stale.json"
    stale.write_text(
        json.dumps(
            {"layers": {str(i): {"hot": [0, 1, 2, 3], "cold": [4, 5, 6, 7]} for i in range(4)}}
        )
    )
    shutil.copy(REPO / "campaigns" / "prompts" / "shared-prefix.jsonl", tmp_path / "p.jsonl")
    card = tmp_path / "sim.yaml"
    card.write_text(
        "campaign: vllm-routing\nruntime: refbox\nprompts: {pools: [p.jsonl]}\n"
        "workload: {phases: [{name: oncall, domains: [agent], requests: 6}]}\ncells:\n"
        "  stale: {files: {rowmap: stale.json}, knobs: {policy: frozen, hot_slots: 4}}\n"
        "  fitted: {files: {rowmap: fitted.json}, knobs: {policy: frozen, hot_slots: 4}}\n"
        "control: stale\ndesign: {order: abba, cycles: 1, cache_states: [warm]}\n",
        encoding="utf-8",
    )
    trace = run / "route-trace.jsonl"
    assert trace.is_file()
    out = tmp_path / "reports"
    result = run_cli("simulate", str(card), "--traces", str(trace), "--reports", str(out))
    assert result.code in (0, 1), result.stdout + result.stderr
    (sim,) = (out / "vllm-routing-sim").iterdir()
    summary = json.loads(run_cli("analyze", str(sim), "--json").stdout)
    hit = {k: v["hit_rate"] for k, v in summary["cells"].items()}
    assert 0 < hit["stale"] < hit["fitted"] <= 1  # a map fitted on this routing serves it better


@pytest.mark.slow
def test_collect_then_fit_map_from_the_real_engine(vllm_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "fit"
    result = run_cli(
        "collect", str(CARD), "--cell", "nocache", "--split", "fit", "-o", str(out),
        timeout_s=900,
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    counts = read_count_dump(out / "counts.json")
    per_layer = counts.sum(axis=1)
    assert len(set(per_layer.tolist())) == 1 and per_layer[0] % TOP_K == 0 and per_layer[0] > 0
    assert (out / "route-trace.jsonl").is_file()
    result = run_cli(
        "fit-map", str(out / "counts.json"), "--top", "4", "-o", str(tmp_path / "m.json")
    )
    assert result.code == 0, result.stderr
    assert len(read_rowmap(tmp_path / "m.json", experts=8).hot) == LAYERS


@pytest.mark.slow
def test_bench_vllm_client_quick_prints_its_figures(vllm_env: Path) -> None:
    from tests.test_benchmarks import assert_figures

    result = run_cli("bench", "vllm-client", "--quick", "--json", timeout_s=900)
    assert result.code == 0, result.stdout + result.stderr
    assert_figures("vllm-client", result.stdout)


BETTER_SPEED = "{kind: better, metric: decode_tok_s}"


@pytest.mark.slow
def test_expert_offload_on_the_cpu_build_is_not_engaged(vllm_env: Path, tmp_path: Path) -> None:
    """Issue 55: `cpu_offload_gb: 1` with `cpu_offload_params: experts` parses, and this CPU
    build logs `Offloader set to UVAOffloader` (configured), but every weight is already in host
    memory: the offloader moves nothing and never prints `Total CPU offloaded parameters`. The
    cell is *not engaged*, never *within noise*, in one mirrored cycle (four boots)."""
    cells = (
        "cells:\n"
        "  nocache: {knobs: {prefix_caching: false, enforce_eager: true}}\n"
        "  offload:\n"
        "    knobs: {prefix_caching: false, enforce_eager: true, cpu_offload_gb: 1,"
        " cpu_offload_params: experts}\n"
        "control: nocache\n"
    )
    shipped = CARD.read_text(encoding="utf-8")
    card = shipped_card_variant(
        CARD.name,
        tmp_path / "card",
        {
            "requests: 6": "requests: 2",
            "warmup_requests: 1": "warmup_requests: 1\n  logprobs: 3",
            shipped[shipped.index("cells:\n") : shipped.index("design:")]: cells,
            shipped[
                shipped.index("gates:\n") :
            ]: "gates:\n  - {kind: better, metric: decode_tok_s}\n",
        },
    )
    reports = tmp_path / "reports"
    result = run_cli("run", str(card), "--reports", str(reports), "--quiet", timeout_s=1200)
    assert result.code == 1, result.stdout + result.stderr  # the implicit engagement gate
    (root,) = (reports / "vllm-moe").iterdir()
    for folder in (root / "runs").iterdir():
        log = (folder / "server.log").read_text(encoding="utf-8")
        assert "Total CPU offloaded parameters" not in log  # what the signature counts
        assert ("Offloader set to UVAOffloader" in log) == ("-offload-" in folder.name)
        # workload.logprobs: vLLM's completions stream (`tokens`, `token_logprobs`,
        # `top_logprobs`), as the client read it: one entry a token, greedy picks the top one.
        requests = pd.read_parquet(folder / "requests.parquet")
        for row in requests.itertuples():
            tokens = json.loads(row.logprobs)
            assert len(tokens) == row.completion_tokens == 16
            assert "".join(t["token"] for t in tokens) == row.output_text
            for token in tokens:
                assert len(token["top"]) == 3
                assert token["logprob"] == pytest.approx(max(token["top"].values()))
        # Each canary carries its tokens' log-probabilities, compared with the control's too.
        canaries = json.loads((folder / "canaries.json").read_text(encoding="utf-8"))["canaries"]
        assert canaries and all(c["logprobs"] and None not in c["logprobs"] for c in canaries), (
            canaries
        )
    from harness.analyze.campaign import analyze_campaign

    analysis = analyze_campaign(root)
    labels = {c.cell: str(c.comparison.label) for c in analysis.comparisons}
    assert labels == {"offload": "not engaged"}, labels
    assert analysis.engagement is not None
    rows = {(r.cell, r.knob): r for r in analysis.engagement.rows}
    offload = rows[("offload", "cpu_offload_gb")]
    assert offload.signature == "uva_offloads > 0" and len(offload.failed) == offload.boots == 2
    # cpu_offload_params has no signature of its own: listed as not verified, not passed.
    assert "cpu_offload_params" in analysis.engagement.unverified["offload"]
    # The same weights and math: the canaries agree, text and log-probabilities, so the cell is
    # not corrupt.
    assert analysis.canaries is not None and not analysis.canaries.corrupt
    verdict = json.loads((root / "verdict.json").read_text())
    failing = [g for g in verdict["gates"] if not g["passed"]]
    assert [g["kind"] for g in failing] == ["better", "engagement"], failing
