"""``harness import``: other tools' results files as a campaign analysis, gates and report read.

The A/B/B/A round trip takes the run records of a campaign the harness ran
(``tests/data/campaigns/demo-shaped``), writes each block as a ``vllm bench serve --save-result
--save-detailed`` file in vLLM's keys, imports them, and checks the labels and ratios equal the
harness's own analysis of the same blocks.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.analyze.campaign import analyze_campaign
from harness.cli import main
from harness.formats.records import CampaignDir, read_json
from harness.gate.evaluate import evaluate_gates
from harness.importers.write import read_source
from harness.runtimes.llamacpp import build

DATA = Path(__file__).parent.parent / "data"
DEMO = DATA / "campaigns" / "demo-shaped"
FIXTURES = DATA / "importers"
_DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def _vllm_result(run_dir: Path, *, detailed: bool) -> dict[str, object]:
    """A run's scored requests in the keys ``vllm bench serve --save-result`` writes."""
    requests = pd.read_parquet(run_dir / "requests.parquet")
    chunks = pd.read_parquet(run_dir / "chunks.parquet")
    scored = requests[requests["ok"] & ~requests["warmup"] & (requests["phase"] != "quality")]
    ttfts, itls, lens, tpots = [], [], [], []
    for _, row in scored.iterrows():
        times = chunks[chunks["request"] == row["request"]].sort_values("chunk")["t_s"]
        gaps = np.diff(times.to_numpy(dtype=float)).tolist()
        ttfts.append(float(row["ttft_s"]))
        itls.append(gaps)
        lens.append(int(row["completion_tokens"]))
        n = int(row["completion_tokens"])
        tpots.append((row["e2el_s"] - row["ttft_s"]) / (n - 1) * 1e3)
    duration = float(requests["t_start_s"].max() + requests["e2el_s"].max())
    result: dict[str, object] = {
        "date": "20261201-120000",
        "backend": "openai",
        "model_id": "refbox",
        "num_prompts": len(scored),
        "max_concurrency": 1,
        "duration": duration,
        "completed": len(scored),
        "failed": 0,
        "total_output_tokens": sum(lens),
        "output_throughput": sum(lens) / duration,
        "mean_ttft_ms": float(np.mean(ttfts)) * 1e3,
        "median_ttft_ms": float(np.median(ttfts)) * 1e3,
        "p99_ttft_ms": float(np.percentile(ttfts, 99)) * 1e3,
        "mean_tpot_ms": float(np.mean(tpots)),
        "median_tpot_ms": float(np.median(tpots)),
        "p99_tpot_ms": float(np.percentile(tpots, 99)),
        "median_e2el_ms": float(np.median(scored["e2el_s"])) * 1e3,
    }
    if detailed:
        result.update(
            input_lens=[int(x) for x in scored["prompt_tokens"]],
            output_lens=lens,
            ttfts=ttfts,
            itls=itls,
            generated_texts=[str(t) for t in scored["output_text"]],
            errors=[""] * len(scored),
        )
    return result


def _export_demo(folder: Path, *, detailed: bool, source: Path = DEMO) -> list[Path]:
    """Every block of a campaign (the demo-shaped one) as ``<cell>-c<cycle>-s<slot>.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for run in CampaignDir(source).plan()["runs"]:
        path = folder / f"{run['cell']}-c{run['cycle']}-s{run['slot']}.json"
        data = _vllm_result(source / "runs" / run["run_id"], detailed=detailed)
        path.write_text(json.dumps(data), encoding="utf-8")
        files.append(path)
    return files


def _mapping(
    path: Path, gates: str = "[{kind: better, metric: decode_tok_s}]", **extra: str
) -> Path:
    lines = [
        "campaign: demo",
        "box: local",
        "control: stale",
        r"pattern: '(?P<cell>stale|seed)-c(?P<cycle>\d+)-s(?P<slot>\d)\.(json|csv)'",
        f"gates: {gates}",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def _labels(root: Path) -> dict[tuple[str, str], tuple[str, float]]:
    table = analyze_campaign(root).comparison_table()
    return {
        (str(r["cell"]), str(r["metric"])): (str(r["label"]), float(r["ratio"]))
        for r in table.to_dict("records")
    }


def test_an_abba_run_by_the_harness_imported_from_vllm_files_gives_the_same_labels(
    tmp_path: Path,
) -> None:
    demo = tmp_path / "demo"
    shutil.copytree(DEMO, demo)
    files = _export_demo(tmp_path / "vllm", detailed=True)
    out = tmp_path / "imported"
    code, text = _cli(
        "import", "vllm", *map(str, files), "--map", str(_mapping(tmp_path / "m.yaml")),
        "-o", str(out),
    )  # fmt: skip
    assert code == 0, text
    assert "imported 12 runs (3 cycles)" in text
    ours, theirs = _labels(demo), _labels(out)
    shared = [k for k in ours if k in theirs]
    assert {("seed", m) for m in ("decode_tok_s", "tpot_p50_ms", "tpot_p95_ms", "ttft_ms")} <= set(
        shared
    )
    for key in shared:
        assert theirs[key][0] == ours[key][0], key
        assert theirs[key][1] == pytest.approx(ours[key][1], rel=1e-9), key
    (theirs_gate,) = evaluate_gates(analyze_campaign(out)).gates
    (ours_gate,) = [
        g for g in evaluate_gates(analyze_campaign(demo)).gates if g.name == "better decode_tok_s"
    ]
    assert theirs_gate.passed == ours_gate.passed
    # Each record keeps its source's SHA-256, the boot identity and the file itself.
    run = CampaignDir(out).plan()["runs"][0]
    record = read_json(out / "runs" / run["run_id"] / "run.json")
    assert record["runtime"]["source_sha256"] == read_source("vllm", files[0]).sha256
    assert record["boot_id"].startswith("vllm:")
    assert (out / "sources" / files[0].name).is_file()
    # analyze, gate and report read it unchanged (the gate as the harness's own run decides it:
    # three cycles of the demo fixture cannot rule out carry-over, so it fails closed).
    assert _cli("gate", str(out), "--quiet")[0] == (0 if ours_gate.passed else 1)
    assert (out / "report.html").is_file()


def test_summary_only_files_say_what_they_could_not_compute(tmp_path: Path) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=False)
    out = tmp_path / "imported"
    code, text = _cli(
        "import", "vllm", *map(str, files), "--map", str(_mapping(tmp_path / "m.yaml")),
        "-o", str(out),
    )  # fmt: skip
    assert code == 0, text
    assert "12 summary-only" in text
    analysis = analyze_campaign(out)
    assert any("summary-only" in w and "median TPOT" in w for w in analysis.warnings)
    runs = analysis.runs
    assert runs["decode_tok_s"].notna().all() and runs["tpot_p95_ms"].isna().all()
    assert _cli("report", str(out))[0] == 0
    assert "summary-only" in (out / "report.html").read_text(encoding="utf-8")


def test_a_gate_on_a_field_the_file_lacks_is_exit_2_naming_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=False)
    mapping = _mapping(tmp_path / "m.yaml", gates="[{kind: better, metric: tpot_p95_ms}]")
    code, _ = _cli(
        "import", "vllm", *map(str, files), "--map", str(mapping), "-o", str(tmp_path / "o")
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "p95_tpot_ms: missing" in err and files[0].name in err and "Traceback" not in err


def test_a_file_of_another_format_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=True)
    for fmt in ("llama-bench", "ds4"):
        code, _ = _cli("import", fmt, *map(str, files), "--map", str(_mapping(tmp_path / "m.yaml")),
                       "-o", str(tmp_path / fmt))  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and files[0].name in err and "Traceback" not in err, err
    code, _ = _cli("import", "nope", *map(str, files), "--map", str(tmp_path / "m.yaml"), "-o", "x")
    assert code == 2 and "one of vllm" in capsys.readouterr().err


def test_mapping_errors_name_their_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _export_demo(tmp_path / "vllm", detailed=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "campaign: demo\ncontrol: stale\npattern: '(?P<cell>\\w+)-c(?P<cycle>\\d+)'\n"
        "gates: [{kind: exact_outputs}]\ncolour: red\n",
        encoding="utf-8",
    )
    code, _ = _cli("import", "vllm", *map(str, files), "--map", str(bad), "-o", str(tmp_path / "o"))
    err = capsys.readouterr().err
    assert code == 2
    assert f"{bad}:5: colour: unknown key" in err
    assert f"{bad}:3: pattern: needs the named groups (?P<slot>…)" in err
    # A valid mapping whose files are not in a mirrored order.
    ab = tmp_path / "ab"
    ab.mkdir()
    for i, cell in enumerate(["stale", "seed", "stale", "seed"]):
        shutil.copy(files[0], ab / f"{cell}-c0-s{i}.json")
    code, _ = _cli("import", "vllm", *map(str, sorted(ab.iterdir())), "--map",
                   str(_mapping(tmp_path / "m.yaml")), "-o", str(tmp_path / "o2"))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "the order is ABAB" in err
    # A file the pattern does not place.
    stray = tmp_path / "stray.json"
    shutil.copy(files[0], stray)
    code, _ = _cli("import", "vllm", *map(str, [*files, stray]), "--map",
                   str(_mapping(tmp_path / "m.yaml")), "-o", str(tmp_path / "o3"))  # fmt: skip
    assert code == 2 and "stray.json: its name does not match" in capsys.readouterr().err


def _ds4_rows(header: list[str], gen_tps: float, prefill_tps: float) -> list[dict[str, str]]:
    rows = []
    for ctx, prefill, gen in ((2048, 2048, 0), (8192, 6144, 128)):
        row = dict.fromkeys(header, "0")
        row.update(ctx_tokens=str(ctx), prefill_tokens=str(prefill), gen_tokens=str(gen),
                   prefill_tps=f"{prefill_tps * (1 if ctx == 2048 else 0.6):.2f}",
                   gen_tps=f"{gen_tps if gen else 0:.2f}")  # fmt: skip
        if "ttft_ms" in row:  # the prefill's wall time, as ds4-bench prints it
            row["ttft_ms"] = f"{1000 * prefill / float(row['prefill_tps']):.4f}"
        if "gen_tpot_p50_ms" in row and gen:  # 128 generated tokens: positive percentiles
            row["gen_tpot_p50_ms"] = f"{1000 / gen_tps:.4f}"
            row["gen_tpot_p95_ms"] = f"{1.2 * 1000 / gen_tps:.4f}"
        rows.append(row)
    return rows


@pytest.mark.parametrize("fixture", ["ds4-header-40.csv", "ds4-header-9.csv"])
def test_ds4_bench_csv_by_header_name(tmp_path: Path, fixture: str) -> None:
    header = (FIXTURES / fixture).read_text(encoding="utf-8").splitlines()[0].split(",")
    folder = tmp_path / "csv"
    folder.mkdir()
    rng = np.random.default_rng(4)
    files = []
    for cycle, order in enumerate(["ABBA", "BAAB", "ABBA"]):
        for slot, arm in enumerate(order):
            cell = "stale" if arm == "A" else "seed"
            speed = (20.0 if arm == "A" else 24.0) * float(rng.normal(1, 0.01))
            path = folder / f"{cell}-c{cycle}-s{slot}.csv"
            with path.open("w", newline="", encoding="utf-8") as handle:
                writer = csv.DictWriter(handle, fieldnames=header)
                writer.writeheader()
                writer.writerows(_ds4_rows(header, speed, 400.0))
            files.append(path)
    block = read_source("ds4", files[0])
    assert block.summary_only and block.fields["decode_tok_s"] == "gen_tps"
    written = list(csv.DictReader(io.StringIO(files[0].read_text(encoding="utf-8"))))
    assert block.metrics["decode_tok_s"] == float(written[1]["gen_tps"])  # the one gen row
    assert block.metrics["prefill_tok_s"] == pytest.approx(
        np.sqrt(float(written[0]["prefill_tps"]) * float(written[1]["prefill_tps"]))
    )
    out = tmp_path / "imported"
    mapping = _mapping(tmp_path / "m.yaml", select="{ctx_tokens: 8192}")
    code, text = _cli("import", "ds4", *map(str, files), "--map", str(mapping), "-o", str(out))
    assert code == 0, text
    labels = _labels(out)
    assert labels[("seed", "decode_tok_s")][0] == "better"
    assert labels[("seed", "decode_tok_s")][1] == pytest.approx(1.2, rel=0.03)
    # The 9-column header has no TPOT column: a gate on it names the field it needed.
    if fixture == "ds4-header-9.csv":
        mapping = _mapping(tmp_path / "m2.yaml", gates="[{kind: better, metric: tpot_p50_ms}]")
        code, _ = _cli(
            "import", "ds4", *map(str, files), "--map", str(mapping), "-o", str(tmp_path / "o2")
        )
        assert code == 2


def test_ds4_csv_missing_a_required_column_names_it(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("ctx_tokens,gen_tps\n2048,10\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"x.csv:1: prefill_tokens, prefill_tps, gen_tokens"):
        read_source("ds4", path)


@pytest.fixture(scope="module")
def llama_bench() -> Path:
    if not build.built():
        pytest.skip("llama.cpp is not built; run `make llama-server`")
    return build.bin_dir() / "llama-bench"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, llama_bench: Path) -> Path:
    from harness.runtimes.llamacpp.gguf_model import write_tiny_moe

    path = tmp_path_factory.mktemp("model") / "tiny-moe.gguf"
    write_tiny_moe(path, build.default_vocab(), seed=1)
    return path


@pytest.mark.slow
def test_llama_bench_json_from_the_real_binary(
    tmp_path: Path, llama_bench: Path, tiny_model: Path
) -> None:
    """Two thread counts in ABBA/BAAB, each block one llama-bench run, imported and analysed."""
    folder = tmp_path / "lb"
    folder.mkdir()
    files = []
    for cycle, order in enumerate(["ABBA", "BAAB"]):
        for slot, arm in enumerate(order):
            cell = "stale" if arm == "A" else "seed"
            threads = "1" if arm == "A" else "2"
            path = folder / f"{cell}-c{cycle}-s{slot}.json"
            fmt = "json" if cycle == 0 else "jsonl"
            done = subprocess.run(
                [str(llama_bench), "-m", str(tiny_model), "-p", "16", "-n", "8", "-r", "2",
                 "-t", threads, "-o", fmt],
                capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            path.write_text(done.stdout, encoding="utf-8")
            files.append(path)
    block = read_source("llama-bench", files[0])
    assert block.summary_only and block.identity["n_threads"] == 1
    assert block.metrics["decode_tok_s"] > 0 and block.metrics["prefill_tok_s"] > 0
    out = tmp_path / "imported"
    code, text = _cli("import", "llama-bench", *map(str, files), "--map",
                      str(_mapping(tmp_path / "m.yaml")), "-o", str(out))  # fmt: skip
    assert code == 0, text
    table = analyze_campaign(out).comparison_table()
    assert set(table["metric"]) == {"decode_tok_s", "prefill_tok_s"}
    assert table["ratio"].notna().all()
    record = read_json(out / "runs" / CampaignDir(out).plan()["runs"][0]["run_id"] / "run.json")
    assert record["runtime"]["version"] == block.identity["build_commit"]
    code, _ = _cli("gate", str(out), "--quiet")
    assert code in (0, 1)


@pytest.mark.slow
def test_a_campaign_run_now_round_trips_through_vllm_files(tmp_path: Path) -> None:
    """A short refbox ABBA/BAAB campaign run here, exported and imported: the same labels."""
    from harness.card import load_card
    from harness.execute.campaign import new_campaign_dir
    from harness.execute.run import CampaignRunner
    from harness.plan.build import build_plan

    tiny = DATA / "cards" / "e2e" / "tiny.yaml"
    text = tiny.read_text(encoding="utf-8").replace("../../pools/", f"{DATA}/pools/")
    text = text.replace("cycles: 1,", "cycles: 2,").replace(
        "  - {kind: counter, counter: lost_ring_records, max: 0}",
        "  - {kind: better, metric: decode_tok_s}",
    )
    card = tmp_path / "tiny.yaml"
    card.write_text(text, encoding="utf-8")
    loaded = load_card(card)
    plan = build_plan(loaded)
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    outcome = CampaignRunner(loaded, plan, campaign).execute()
    assert outcome.failed == [] and len(outcome.done) == 8
    files = _export_demo(tmp_path / "vllm", detailed=True, source=campaign.root)
    mapping = tmp_path / "m.yaml"
    # The harness sent each block's washout; the mapping says so, as a user would for a tool
    # whose runs began with one.
    washout = json.loads((campaign.root / "plan.json").read_text())["washout_requests"]
    assert washout > 0
    mapping.write_text(
        f"campaign: tiny\ncontrol: control\nwashout_requests: {washout}\n"
        "pattern: '(?P<cell>control|wide)-c(?P<cycle>\\d+)-s(?P<slot>\\d)\\.json'\n"
        "analysis: {window_s: 0.5, converged_span_s: 1, hold_s: 0}\n"
        "gates: [{kind: better, metric: decode_tok_s}]\n",
        encoding="utf-8",
    )
    out = tmp_path / "imported"
    code, text = _cli("import", "vllm", *map(str, files), "--map", str(mapping), "-o", str(out))
    assert code == 0, text
    ours, theirs = _labels(campaign.root), _labels(out)
    shared = [k for k in ours if k in theirs]
    assert ("wide", "decode_tok_s") in shared and ("wide", "tpot_p50_ms") in shared
    for key in shared:
        assert theirs[key][0] == ours[key][0], key
        assert theirs[key][1] == pytest.approx(ours[key][1], rel=1e-9), key
    ours_gate = [g for g in evaluate_gates(analyze_campaign(campaign.root)).gates
                 if g.kind == "better"]  # fmt: skip
    theirs_gate = evaluate_gates(analyze_campaign(out)).gates
    assert [g.passed for g in theirs_gate] == [g.passed for g in ours_gate]
