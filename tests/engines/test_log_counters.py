"""Counters from a runtime's log: ds4's streaming cache line (unit), llama-server's timing lines
(slow: a real llama-server booted, its log read before and after real requests)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from harness.boxes.local import LocalBox
from harness.card import Cell
from harness.card.resolve import load_runtime_profile
from harness.drive.client import DriveSpec, PhasePlan, WorkItem, run_drive
from harness.errors import RecordError
from harness.profiles.box import BoxSpec
from harness.profiles.telemetry import LogCounter
from harness.runtimes.applied_policy import live_specs
from harness.runtimes.boot import boot, boot_spec, http_json
from harness.runtimes.llamacpp import build
from harness.runtimes.llamacpp.gguf_model import write_tiny_moe
from harness.runtimes.log_counters import (
    log_counter_units,
    log_snapshot,
    missing_log_counters,
    start_snapshot,
)
from tests.conftest import REPO

RUNTIMES = REPO / "campaigns" / "runtimes"

# ds4's line as its own tests and tools parse it (DS4_METAL_STREAMING_EXPERT_TIMING_SUMMARY=1).
DS4_LINE = (
    "ds4:   streaming expert cache budget=1005 experts entries=800 expert=6.75 MiB "
    "target=6.62 GiB live=5.10 GiB, hits=100 misses=20 hit_rate=0.833 wraps=0 evictions=0 "
    "buffer_allocs=0 buffer_reuses=0"
)
DS4_TAIL = " evict_dontneed=0.50 GiB miss_willneed=0.25 GiB miss_pread=54.26 GiB"


@pytest.mark.parametrize("name", ["ds4", "ds4-server"])
def test_ds4_profiles_read_the_cache_line_last_one_wins(name: str) -> None:
    specs = load_runtime_profile(RUNTIMES / f"{name}.yaml").telemetry.log_counters
    later = DS4_LINE.replace("hits=100", "hits=900").replace("misses=20", "misses=80")
    log = f"ds4: metal_library ok\n{DS4_LINE}\nsome other line hits=5 misses=5\n{later}{DS4_TAIL}\n"
    snapshot = log_snapshot(log, specs)
    assert snapshot["hits"] == 900 and snapshot["misses"] == 80 and snapshot["evictions"] == 0
    gib_name = "miss_pread_bytes" if name == "ds4" else "bytes_read"
    assert snapshot[gib_name] == pytest.approx(54.26 * 2**30)
    assert log_counter_units(specs)[gib_name] == "bytes"
    # A build without the optional tail: that counter is missing, the others are there.
    plain = log_snapshot(DS4_LINE + "\n", specs)
    assert plain == {"hits": 100, "misses": 20, "evictions": 0}
    # So are the Metal profiler's records (engagement), which print only when it ran.
    unsaid = "no log line gave it by the end of the run"
    assert missing_log_counters(specs, start_snapshot(specs, None), plain) == {
        gib_name: unsaid,
        "expert_profile_records": unsaid,
        "expert_hotlist_records": unsaid,
    }


def test_a_pattern_that_never_matches_is_missing_never_zero() -> None:
    specs = load_runtime_profile(RUNTIMES / "ds4.yaml").telemetry.log_counters
    after = log_snapshot("ds4-bench: nothing about the cache\n", specs)
    assert after == {}
    missing = missing_log_counters(specs, start_snapshot(specs, None), after)
    assert set(missing) == {
        "hits", "misses", "evictions", "miss_pread_bytes",
        "expert_profile_records", "expert_hotlist_records",
    }  # fmt: skip


def test_last_counter_with_no_line_before_the_workload_is_missing() -> None:
    # A server's cumulative line not printed yet when the workload starts: the start is unknown.
    spec = LogCounter(pattern=r"hits=(?P<hits>\d+)", mode="last")
    before = start_snapshot([spec], "booting\n")
    assert "hits" not in before
    after = log_snapshot("booting\nhits=7\n", [spec])
    assert "before the scored workload" in missing_log_counters([spec], before, after)["hits"]
    # A summed counter with no line yet is 0: no event happened yet.
    summed = LogCounter(pattern=r"done (?P<n>\d+)", mode="sum")
    assert start_snapshot([summed], "booting\n") == {"n": 0.0}
    assert log_snapshot("done 2\nx\ndone 3\n", [summed]) == {"n": 5.0}


def test_units_and_a_group_that_is_no_number() -> None:
    spec = LogCounter(
        pattern=r"read (?P<read>\S+) (?:KiB|s) took (?P<took>\S+) s",
        units={"read": "KiB", "took": "s"},
    )
    assert log_snapshot("read 2 KiB took 0.5 s\n", [spec]) == {"read": 2048.0, "took": 500.0}
    with pytest.raises(RecordError, match=r"server.log:2: log counter read matched 'many'"):
        log_snapshot("x\nread many s took 1 s\n", [spec], where="server.log")


def test_a_pattern_without_named_groups_or_with_stray_units_is_refused() -> None:
    with pytest.raises(ValueError, match="named groups"):
        LogCounter(pattern=r"hits=\d+")
    with pytest.raises(ValueError, match="not groups of the pattern"):
        LogCounter(pattern=r"hits=(?P<hits>\d+)", units={"misses": "count"})


# ---- llama-server for real (slow) -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not build.built():
        if os.environ.get("HARNESS_LLAMA_NO_BUILD") == "1":
            pytest.skip("llama.cpp is not built; run `make llama-server`")
        build.ensure_built()
    path = tmp_path_factory.mktemp("model") / "tiny-moe.gguf"
    write_tiny_moe(path, build.default_vocab(), seed=1)
    return path


@pytest.mark.slow
def test_llama_server_timing_lines_count_the_tokens_of_the_requests_between(
    tiny_model: Path, tmp_path: Path
) -> None:
    profile = load_runtime_profile(RUNTIMES / "llama-cpp.yaml")
    # The lines printed while it serves (the expert cache's line comes at exit, after the stop).
    specs = live_specs(profile.telemetry.log_counters)
    box = LocalBox("local", BoxSpec())
    cell = Cell(knobs={"threads": 1, "model": str(tiny_model)})
    spec = boot_spec(
        profile, cell, port=box.free_port(), run_dir=str(tmp_path), python="python3",
        bind_host="127.0.0.1", cache_dir=str(tmp_path), uploaded={},
    )  # fmt: skip
    runtime = boot(box, profile, spec)
    try:
        url = runtime.base_url + "/v1/completions"
        body = {"prompt": "warm", "max_tokens": 4, "temperature": 0, "cache_prompt": False}
        assert http_json(url, body, timeout_s=60)[0] == 200  # before the window: not counted
        before = start_snapshot(specs, box.read_text(spec.log_path))
        completion = prompt = 0
        for text in ("The lighthouse keeper", "def fibonacci(n):"):
            body = {"prompt": text, "max_tokens": 9, "temperature": 0, "cache_prompt": False}
            status, answer = http_json(url, body, timeout_s=60)
            assert status == 200, answer
            completion += answer["usage"]["completion_tokens"]
            prompt += answer["usage"]["prompt_tokens"]
        after = log_snapshot(box.read_text(spec.log_path), specs)
        # The log-probabilities llama-server streams (its `logprobs` alias of n_probs, answered
        # in chat's `content` shape), as the harness's client reads them.
        drive = DriveSpec(base_url=runtime.base_url, flavour="completions", model="m",
                          extra_body={"cache_prompt": False}, logprobs=3)  # fmt: skip
        item = WorkItem("p", "prose", "main", 0, 8, prompt="The lighthouse keeper")
        (streamed,) = run_drive(drive, [PhasePlan("main", 0, (item,))])
    finally:
        assert runtime.stop()
    assert streamed.ok and len(streamed.logprobs) == streamed.completion_tokens == 8
    assert "".join(t["token"] for t in streamed.logprobs) == streamed.output_text
    for token in streamed.logprobs:
        top = token["top"]
        assert len(top) == 3 and sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
        assert token["logprob"] == pytest.approx(max(top.values()))  # greedy: the top one
    assert missing_log_counters(specs, before, after) == {}
    assert after["log_eval_tokens"] - before["log_eval_tokens"] == completion
    assert after["log_prompt_tokens"] - before["log_prompt_tokens"] == prompt
    assert after["log_eval_ms"] - before["log_eval_ms"] > 0
