"""Every shipped profile that boots the reference runtime keeps its control surface the
harness's own (issue 57): booted for real as a campaign boots it, the /admin and SGLang recorder
routes refuse a caller without this boot's token and change or write nothing; with the token
they work, /admin/dump writes only inside the run's folder, and the read-back after a run names
a map or policy changed under it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.boxes.local import LocalBox
from harness.card import Cell, KnobValue, load_runtime_profile
from harness.card.resolve import PACKAGE_DATA
from harness.formats.maps import write_rowmap
from harness.profiles.box import BoxSpec
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import (
    RunningRuntime,
    boot,
    boot_spec,
    http_json,
    http_request,
    live_settings,
)
from harness.runtimes.recorder import finish_recording, start_recording

PROFILES = sorted(
    path.stem
    for path in (PACKAGE_DATA / "runtimes").glob("*.yaml")
    if "harness.refbox" in load_runtime_profile(path).boot.command
)
SMALL = {
    "REFBOX_LAYERS": "2",
    "REFBOX_EXPERTS": "8",
    "REFBOX_HOT_SLOTS": "4",
    "REFBOX_EXPERT_BYTES": "4096",
}
RECORDER = [f"/{a}_expert_distribution_record" for a in ("start", "stop", "dump")]
Booted = tuple[RunningRuntime, dict[str, KnobValue], Path]


def test_both_reference_profiles_are_found() -> None:
    assert PROFILES == ["refbox", "refbox-sglang"]


@pytest.fixture(params=PROFILES)
def booted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Booted]:
    """A reference runtime booted on the shipped profile as a run boots it (a frozen policy and
    a map), from a working directory of its own; with the cell's live settings and the other
    map a caller might swap in."""
    name: str = request.param
    profile: RuntimeProfile = load_runtime_profile(PACKAGE_DATA / "runtimes" / f"{name}.yaml")
    box = LocalBox("local", BoxSpec())
    run_dir, cwd = tmp_path / "run", tmp_path / "cwd"
    for folder in (run_dir, cwd, tmp_path / "cache"):
        folder.mkdir()
    ours, other = tmp_path / "ours.json", tmp_path / "other.json"
    write_rowmap(ours, [[0, 1, 2, 3], [0, 1, 2, 3]], experts=8)
    write_rowmap(other, [[4, 5, 6, 7], [4, 5, 6, 7]], experts=8)
    cell = Cell(env=dict(SMALL), knobs={"policy": "frozen"}, files={"rowmap": str(ours)})
    uploaded = {"rowmap": str(ours)}
    spec = boot_spec(
        profile,
        cell,
        port=box.free_port(),
        run_dir=str(run_dir),
        python=sys.executable,
        bind_host=box.bind_host,
        cache_dir=str(tmp_path / "cache"),
        uploaded=uploaded,
    )
    spec.cwd = str(cwd)  # the harness's working directory
    runtime = boot(box, profile, spec)
    try:
        yield runtime, live_settings(profile, cell, uploaded), other
    finally:
        assert runtime.stop()


def _call(
    runtime: RunningRuntime, method: str, path: str, body: object, auth: dict[str, str]
) -> int:
    data = json.dumps(body).encode() if method == "POST" else None
    return http_request(runtime.base_url + path, method, data, headers=auth)[0]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_without_the_boots_token_nothing_changes_and_nothing_is_written(
    booted: Booted,
) -> None:
    runtime, settings, other = booted
    profile = runtime.profile
    assert profile.admin_token_env and runtime.admin_headers, "no per-boot admin token"
    # The read-back covers the map and the policy a caller would change.
    assert profile.live is not None and profile.live.state is not None
    assert {"rowmap", "policy"} <= set(settings)
    assert runtime.read_back(settings) is None
    run_dir, cwd = Path(runtime.spec.run_dir), Path(runtime.spec.cwd or "")
    before = _files(run_dir)
    tries: list[tuple[str, str, object]] = [
        ("POST", "/admin/reset", {"rowmap": str(other)}),
        ("POST", "/admin/knobs", {"policy": "adaptive"}),
        ("POST", "/admin/dump", {"path": str(run_dir / "planted.json")}),
        ("POST", "/admin/dump", {"path": str(cwd / "planted.json")}),
        ("GET", "/admin/state", None),
    ]
    tries += [(method, path, None) for path in RECORDER for method in ("GET", "POST")]
    for auth in ({}, {"Authorization": "Bearer not-this-boots-token"}):
        for method, path, body in tries:
            status = _call(runtime, method, path, body, auth)
            assert status in (401, 403), f"{method} {path} without the token: HTTP {status}"
    assert runtime.read_back(settings) is None  # the map and policy it booted with
    planted = [p for p in _files(run_dir) if p not in before]
    assert not planted and not _files(cwd), (planted, _files(cwd))


def test_with_the_token_the_surface_works_dumps_stay_in_the_run_and_changes_read_back(
    booted: Booted, tmp_path: Path
) -> None:
    runtime, settings, other = booted
    auth = runtime.admin_headers
    run_dir, cwd = Path(runtime.spec.run_dir), Path(runtime.spec.cwd or "")
    assert _call(runtime, "POST", "/admin/dump", {"path": str(run_dir / "d.json")}, auth) == 200
    assert (run_dir / "d.json").is_file()
    # Not the working directory it was started from, nor anywhere else outside the run.
    assert _call(runtime, "POST", "/admin/dump", {"path": str(cwd / "d.json")}, auth) == 400
    assert not _files(cwd)
    recorder = runtime.profile.telemetry.expert_recorder
    if recorder is not None:
        # The harness's own recorder calls carry the token: a whole record round trip.
        recording = start_recording(runtime, recorder, str(run_dir))
        http_json(runtime.base_url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        counters = finish_recording(runtime, recording, tmp_path / "local")
        assert counters["route_selections"] > 0
    else:
        for path in RECORDER:  # past the guard: a refbox without a recorder says so
            assert _call(runtime, "POST", path, None, auth) == 400
    # A change by the token holder (as another process would have made it) is read back.
    assert _call(runtime, "POST", "/admin/reset", {"rowmap": str(other)}, auth) == 200
    changed = runtime.read_back(settings)
    assert changed is not None and "rowmap" in changed, changed
    assert _call(runtime, "POST", "/admin/reset", {"rowmap": settings["rowmap"]}, auth) == 200
    assert _call(runtime, "POST", "/admin/knobs", {"policy": "adaptive"}, auth) == 200
    changed = runtime.read_back(settings)
    assert changed is not None and "policy 'adaptive'" in changed, changed
