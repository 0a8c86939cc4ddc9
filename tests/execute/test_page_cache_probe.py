"""The page-cache probes the shipped profiles declare, read by the real fincore (util-linux) on
real files: what the box keeps of a runtime's files across boots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness.boxes.local import LocalBox
from harness.card.resolve import load_runtime_profile
from harness.execute.box_state import BoxStateReader, read_probe
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile, StateProbe
from tests.conftest import REPO

RUNTIMES = REPO / "harness" / "profiles" / "data" / "runtimes"
pytestmark = pytest.mark.skipif(
    shutil.which("fincore") is None, reason="fincore (util-linux) not installed: make sysdeps"
)


def _probe(profile: RuntimeProfile, name: str) -> StateProbe:
    return next(p for p in profile.box_state if p.name == name)


def _evict(path: Path) -> None:
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_the_refbox_probe_reads_the_slow_tier_files_share_in_the_page_cache(
    tmp_path: Path,
) -> None:
    refbox = load_runtime_profile(RUNTIMES / "refbox.yaml")
    probe, box = _probe(refbox, "page_cache"), LocalBox("local", BoxSpec())
    cache = tmp_path / "cache dir"  # a space: the path is quoted
    cache.mkdir()
    assert read_probe(box, probe, {"cache_dir": str(cache)}) is None  # nothing to read yet
    slow = cache / "refbox-slow-0123456789abcdef.bin"
    slow.write_bytes(os.urandom(4 << 20))
    os.sync()
    assert read_probe(box, probe, {"cache_dir": str(cache)}) == pytest.approx(1.0, abs=0.01)
    _evict(slow)
    evicted = read_probe(box, probe, {"cache_dir": str(cache)})
    assert evicted is not None and evicted < 0.5
    with open(slow, "rb") as handle:  # a cold lookup reads a record back in
        handle.read(1 << 20)
    partly = read_probe(box, probe, {"cache_dir": str(cache)})
    assert partly is not None and evicted < partly <= 1.0
    # Every cell of the refbox is read (the probe needs no knob), through the run's reader.
    reader = BoxStateReader(box, refbox, {"policy": "adaptive"}, {"cache_dir": str(cache)})
    for point in ("start", "scored", "end"):
        reader.read(point)
    # The kernel's readahead may still bring pages in after the read returned: the share
    # only grows while nothing evicts, so the start lies between the two reads around it.
    after = read_probe(box, probe, {"cache_dir": str(cache)})
    assert after is not None
    runtime: dict[str, object] = {}
    reader.record(runtime, 3)
    # The record carries the probe's tolerance: the analysis reads the state as declared then.
    recorded = runtime["box_state"]
    assert isinstance(recorded, dict) and set(recorded) == {"page_cache"}
    assert recorded["page_cache"]["tolerance"] == 0.02
    assert partly - 0.01 <= recorded["page_cache"]["start"] <= after + 0.01


def test_the_llama_cpp_probe_reads_a_model_on_the_box_and_only_then(tmp_path: Path) -> None:
    llama = load_runtime_profile(RUNTIMES / "llama-cpp.yaml")
    probe, box = _probe(llama, "page_cache"), LocalBox("local", BoxSpec())
    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(2 << 20))
    os.sync()
    _evict(model)
    share = read_probe(box, probe, {"model": str(model)})
    assert share is not None and share < 0.5
    assert BoxStateReader(box, llama, {}).probes == []  # an uploaded model file: no knob, no probe


@pytest.mark.parametrize("profile", ["ds4", "ds4-server", "ds4-cpu", "ds4-server-cpu"])
def test_the_ds4_probes_read_the_ggufs_share_in_the_page_cache(
    profile: str, tmp_path: Path
) -> None:
    # The Metal profiles read through vmtouch (a Mac has no fincore), run here on the same file:
    # its Resident Pages line is the same on Linux and macOS.
    ds4 = load_runtime_profile(RUNTIMES / f"{profile}.yaml")
    probe, box = _probe(ds4, "page_cache"), LocalBox("local", BoxSpec())
    tool = "vmtouch" if "vmtouch" in (probe.command or "") else "fincore"
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed: make sysdeps")
    model = tmp_path / "ds4 flash.gguf"  # a space: the path is quoted
    model.write_bytes(os.urandom(4 << 20))
    os.sync()
    assert read_probe(box, probe, {"model": str(model)}) == pytest.approx(1.0, abs=0.01)
    _evict(model)
    evicted = read_probe(box, probe, {"model": str(model)})
    assert evicted is not None and evicted < 0.5
    with open(model, "rb") as handle:
        handle.read(2 << 20)
    half = read_probe(box, probe, {"model": str(model)})
    assert half is not None and evicted + 0.3 < half <= 1.0
    assert read_probe(box, probe, {"model": str(tmp_path / "absent.gguf")}) is None
    assert BoxStateReader(box, ds4, {}).probes == []  # no model named: nothing to read


def test_the_cuda_lanes_probe_reads_the_hottest_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in nvidia-smi (no GPU here) that prints what the real one prints for this query
    # on a two-GPU box, one of them without a sensor reading ([N/A]); then none on the PATH.
    lane = load_runtime_profile(RUNTIMES / "cuda-lane.yaml")
    probe, box = _probe(lane, "gpu_temp"), LocalBox("local", BoxSpec())
    assert probe.tolerance == 2 and probe.reads({})  # every cell: a GPU box has one
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "--query-gpu=temperature.gpu --format=csv,noheader,nounits '
        '" ] || exit 9\nprintf "41\\n67\\n[N/A]\\n"\n',
        encoding="utf-8",
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert read_probe(box, probe, {}) == 67.0
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert read_probe(box, probe, {}) is None


def test_a_probe_naming_neither_a_knob_nor_a_place_is_refused_at_load() -> None:
    # A misspelt {cache_dri} would read nothing at every block, and a washed_by: boot card
    # would quietly be decided unwashed: refused when the profile loads, naming the probe.
    raw = yaml.safe_load((RUNTIMES / "refbox.yaml").read_text(encoding="utf-8"))
    raw["box_state"] = [
        {"name": "page_cache", "command": "fincore {cache_dri}/x | awk '{ print }'"}
    ]
    with pytest.raises(ValidationError, match="names cache_dri, neither a knob nor a place"):
        RuntimeProfile.model_validate(raw)
