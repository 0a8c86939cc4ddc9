"""The live-knob contract on a real reference runtime: one boot, changed through its admin
endpoint and through its control file, reset to the boot state, and refusals that say why."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from harness.boxes.local import LocalBox
from harness.card import Cell, load_runtime_profile
from harness.errors import RuntimeBootError
from harness.formats.maps import write_rowmap
from harness.profiles.box import BoxSpec
from harness.profiles.live import LiveAction, LiveContract, LiveFile
from harness.profiles.schema import RuntimeProfile
from harness.runtimes.boot import (
    RunningRuntime,
    boot,
    boot_spec,
    http_json,
    http_request,
    live_settings,
)
from tests.conftest import REPO

PROFILE = load_runtime_profile(REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml")
SMALL = {
    "REFBOX_LAYERS": "2",
    "REFBOX_EXPERTS": "8",
    "REFBOX_HOT_SLOTS": "4",
    "REFBOX_EXPERT_BYTES": "4096",
}
ACK = "refbox: control {seq} applied"
REJECT = "refbox: control {seq} rejected: (.*)"


def _file_profile(
    path: str = "{run_dir}/control.json",
    timeout_s: float = 10,
    signal: Literal["HUP", "USR1", "USR2"] | None = None,
) -> RuntimeProfile:
    """refbox's profile with the control-file form of the same contract."""

    def action(body: str) -> LiveAction:
        return LiveAction(
            file=LiveFile(
                path=path,
                body=body,
                ack_log_line=ACK,
                reject_log_line=REJECT,
                timeout_s=timeout_s,
                signal=signal,
            )
        )

    live = LiveContract(
        apply=action('{"seq": {seq}, "knobs": {knobs}}'),
        reset=action('{"seq": {seq}, "reset": true, "knobs": {knobs}}'),
        files={"rowmap": "rowmap"},
    )
    return PROFILE.model_copy(update={"live": live})


def _boot(profile: RuntimeProfile, folder: Path) -> RunningRuntime:
    """A reference runtime on ``profile``, booted in ``folder`` with the small cell."""
    box = LocalBox("local", BoxSpec())
    (folder / "cache").mkdir()
    cell = Cell(env=dict(SMALL), knobs={"policy": "adaptive", "drain_every": 64})
    spec = boot_spec(
        profile,
        cell,
        port=box.free_port(),
        run_dir=str(folder),
        python=sys.executable,
        bind_host=box.bind_host,
        cache_dir=str(folder / "cache"),
        uploaded={},
    )
    return boot(box, profile, spec)


@pytest.fixture(scope="module")
def refbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRuntime]:
    runtime = _boot(PROFILE, tmp_path_factory.mktemp("live"))
    try:
        yield runtime
    finally:
        assert runtime.stop()


def _knobs(runtime: RunningRuntime) -> dict[str, object]:
    status, text = http_request(
        runtime.base_url + "/admin/knobs", "GET", None, headers=runtime.admin_headers
    )
    assert status == 200, text
    return dict(json.loads(text))


def _tokens(runtime: RunningRuntime) -> int:
    payload = {"prompt": "hello", "max_tokens": 4, "stream": False}
    http_json(runtime.base_url + "/v1/completions", payload)
    status, counters = http_json(runtime.base_url + "/counters")
    assert status == 200
    return int(counters["tokens"])


def test_a_cells_live_settings_are_its_live_knobs_and_live_files() -> None:
    cell = Cell(env=dict(SMALL), knobs={"drain_every": 8, "hot_slots": 4}, live={"phase": 2})
    settings = live_settings(PROFILE, cell, {"rowmap": "/box/run/files/rowmap.json"})
    # hot_slots reaches refbox at boot only; drain_every and the map are live.
    assert settings == {"drain_every": 8, "phase": 2, "rowmap": "/box/run/files/rowmap.json"}


def test_http_reset_restores_the_boot_state_then_applies_the_next_cells_knobs(
    refbox: RunningRuntime, tmp_path: Path
) -> None:
    assert _tokens(refbox) > 0
    refbox.post_live({"drain_every": 8})
    assert _knobs(refbox)["drain_every"] == 8
    stale = tmp_path / "map.json"
    write_rowmap(stale, [[4, 5, 6, 7], [0, 2, 4, 6]], experts=8)
    refbox.reset_live({"swaps_per_layer": 3, "rowmap": str(stale)})
    knobs = _knobs(refbox)
    # drain_every went back to the boot's 64; the settings sent with the reset apply.
    assert knobs["drain_every"] == 64 and knobs["swaps_per_layer"] == 3
    _, counters = http_json(refbox.base_url + "/counters")
    assert counters["tokens"] == 0 and counters["requests"] == 0
    trace = Path(refbox.spec.run_dir, "route-trace.jsonl").read_text(encoding="utf-8")
    resets = [
        json.loads(line) for line in trace.splitlines() if json.loads(line)["kind"] == "reset"
    ]
    assert resets[-1]["hot"] == [[4, 5, 6, 7], [0, 2, 4, 6]]


def test_a_refused_http_change_says_why_with_the_log_tail(
    refbox: RunningRuntime, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeBootError) as caught:
        refbox.post_live({"drain_every": 0})
    message = str(caught.value)
    assert "rejected: HTTP 400" in message and "drain_every" in message
    assert "log tail:\n" in message and "refbox: listening on" in message
    smaller = tmp_path / "three-hot.json"
    write_rowmap(smaller, [[0, 1, 2], [0, 1, 2]], experts=8)
    with pytest.raises(RuntimeBootError, match="a live map must keep the boot's geometry"):
        refbox.reset_live({"rowmap": str(smaller)})


def test_the_control_file_applies_resets_and_refuses_with_the_runtimes_reason(
    refbox: RunningRuntime,
) -> None:
    runtime = dataclasses.replace(refbox, profile=_file_profile())
    runtime.post_live({"drain_every": 6})
    assert _knobs(refbox)["drain_every"] == 6
    assert _tokens(refbox) > 0
    runtime.reset_live({"hysteresis": 0.5})
    knobs = _knobs(refbox)
    assert knobs["drain_every"] == 64 and knobs["hysteresis"] == 0.5
    _, counters = http_json(refbox.base_url + "/counters")
    assert counters["tokens"] == 0
    with pytest.raises(RuntimeBootError) as caught:
        runtime.post_live({"drain_every": 0})
    message = str(caught.value)
    assert "rejected through" in message and "drain_every: must be an integer >= 1" in message
    assert "log tail:\n" in message


def test_an_unacknowledged_change_times_out_with_the_log_tail(refbox: RunningRuntime) -> None:
    # A file the runtime does not poll: nothing acknowledges the change.
    runtime = dataclasses.replace(
        refbox, profile=_file_profile("{run_dir}/elsewhere.json", timeout_s=0.3)
    )
    with pytest.raises(RuntimeBootError, match=r"not acknowledged within 0\.3 s.*log tail:\n"):
        runtime.post_live({"drain_every": 6})


def test_a_runtime_that_reads_its_control_file_on_a_signal_gets_it(tmp_path: Path) -> None:
    # refbox --control-signal HUP reads the file only when signalled: without the profile's
    # `signal` nothing acknowledges the change; with it, the change applies.
    command = [*PROFILE.boot.command, "--control-signal", "HUP"]
    profile = PROFILE.model_copy(
        update={"boot": PROFILE.boot.model_copy(update={"command": command})}
    )
    runtime = _boot(profile, tmp_path)
    try:
        unsignalled = dataclasses.replace(runtime, profile=_file_profile(timeout_s=0.5))
        with pytest.raises(RuntimeBootError, match="not acknowledged"):
            unsignalled.post_live({"drain_every": 6})
        signalled = dataclasses.replace(runtime, profile=_file_profile(signal="HUP"))
        signalled.post_live({"drain_every": 7})
        assert _knobs(runtime)["drain_every"] == 7
        assert runtime.box.group_alive(runtime.pgid)  # the signal reloaded, it did not stop
    finally:
        assert runtime.stop()


def test_the_harness_reads_back_what_the_runtime_ran_with_and_names_what_differs(
    refbox: RunningRuntime,
) -> None:
    # The admin token keeps other processes off the HTTP surface; a control file or a signal
    # reaches the runtime another way. After every run the harness reads back what the boot
    # ran with (live.state), and a run whose settings were changed under it fails.
    cell = Cell(env=dict(SMALL), knobs={"policy": "adaptive", "drain_every": 64})
    settings = live_settings(PROFILE, cell, {})
    assert refbox.admin_headers and refbox.read_back(settings) is None
    assert http_json(refbox.base_url + "/admin/knobs", {"drain_every": 5})[0] == 401
    control = Path(refbox.spec.run_dir) / "control.json"
    control.write_text(json.dumps({"seq": 99, "knobs": {"drain_every": 5}}))
    deadline = time.monotonic() + 10
    while "refbox: control 99 applied" not in refbox.box.read_text(refbox.spec.log_path):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    changed = refbox.read_back(settings)
    assert changed is not None and "drain_every 5 (the cell's 64)" in changed, changed
    refbox.post_live({"drain_every": 64})
    assert refbox.read_back(settings) is None
