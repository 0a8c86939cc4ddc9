"""End to end over SSH: a small A/B/B/A campaign on a loopback sshd, and the box preflight.

The box is a real sshd on 127.0.0.1 (tests/sshd.py) running this same interpreter, so the
reference runtime boots "remotely" through the whole SSH path: inline env, setsid/nohup, the
remote timeout guard, sftp downloads of the ring and log, and stopping by process group.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.boxes.ssh import SshBox
from harness.card import load_card, load_runtime_profile
from harness.execute.campaign import new_campaign_dir
from harness.execute.preflight import check_box
from harness.execute.run import CampaignRunner
from harness.formats.records import RUN_OK, CampaignDir, read_json, read_parquet
from harness.plan.build import Run, build_plan
from tests.conftest import DATA, REPO, run_cli
from tests.sshd import LoopbackSshd, sshd  # noqa: F401 - the session fixture

CARD_TEMPLATE = DATA / "cards" / "ssh" / "ab-loopback.yaml"
RECORD_FILES = (
    "run.json",
    "requests.parquet",
    "chunks.parquet",
    "ring.parquet",
    "counters.json",
    "server.log",
)


def write_card(server: LoopbackSshd, folder: Path) -> Path:
    """The loopback card with its placeholders filled, written into ``folder``."""
    values = {
        "@PORT@": str(server.port),
        "@USER@": server.user,
        "@KEY@": str(server.client_key),
        "@PYTHON@": sys.executable,
        "@WORKDIR@": str(folder / "box-workdir"),
        "@POOLS@": str(DATA / "pools"),
        "@KNOWN_HOSTS@": str(server.known_hosts),
    }
    text = CARD_TEMPLATE.read_text(encoding="utf-8")
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    path = folder / "card.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# Prints the TCP sockets a process listens on, as /proc/net/tcp{,6} write them (hex address).
_LISTENING_SNIPPET = """
import os, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:["):
        inodes.add(target[8:-1])
for table in ("tcp", "tcp6"):
    for line in open(f"/proc/net/{table}").read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            print(table, fields[1])
"""


def listening_sockets(box: SshBox, pid: int) -> list[tuple[str, str, int]]:
    """(table, address, port) of every TCP socket ``pid`` listens on, read on the box."""
    out = box.sh(f"{sys.executable} -c {shlex.quote(_LISTENING_SNIPPET)} {pid}").stdout
    found = []
    for line in out.splitlines():
        table, address = line.split()
        host_hex, port_hex = address.split(":")
        if table == "tcp":  # IPv4, little-endian
            host = ".".join(str(b) for b in reversed(bytes.fromhex(host_hex)))
        else:
            host = host_hex
        found.append((table, host, int(port_hex, 16)))
    return found


def last_boot_pgid(campaign: CampaignDir) -> int:
    """The process group of the latest boot the journal recorded."""
    boots = [e for e in campaign.journal.events() if e.get("event") == "boot"]
    return int(boots[-1]["pgid"])


def runtime_processes(box: SshBox, marker: str) -> list[str]:
    """Live (non-zombie) processes on the box whose command line contains ``marker``."""
    listing = box.sh("ps -ww -e -o pid= -o stat= -o args=").stdout
    lines = [line.strip() for line in listing.splitlines()]
    return [line for line in lines if marker in line and line.split()[1][0] != "Z"]


def _scored(folder: Path) -> pd.DataFrame:
    requests = read_parquet(folder / "requests.parquet")
    return requests[~requests["warmup"]]


@pytest.mark.slow
def test_ab_campaign_over_ssh(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    loaded = load_card(write_card(sshd, tmp_path))
    plan = build_plan(loaded)
    assert [run.cell for run in plan.runs] == ["stale", "wide", "wide", "stale"]
    campaign = new_campaign_dir(loaded, plan, tmp_path / "reports")
    checker = SshBox("checker", loaded.box, known_hosts=[sshd.known_hosts])
    lingering: dict[str, list[str]] = {}
    seen: dict[str, dict[str, Any]] = {}

    def progress(event: str, run: Run | None, info: dict[str, Any]) -> None:
        if run is None:
            return
        if event == "request" and run.run_id not in seen:
            # Mid-drive: the runtime listens on the box's loopback only, and the harness talks
            # to it through one tunnel whose remote end is that very port.
            tunnels = runner.box.tunnels.open_tunnels()
            seen[run.run_id] = {
                "listening": listening_sockets(checker, last_boot_pgid(campaign)),
                "tunnels": [(t.remote, t.connections, t.base_url) for t in tunnels],
            }
        if event == "attempt":
            # Called after the runtime was stopped: nothing of this run may still run on the box.
            lingering[run.run_id] = runtime_processes(checker, f"{runner.remote_root}/{run.run_id}")
            seen[run.run_id]["tunnels_after"] = len(runner.box.tunnels.open_tunnels())

    runner = CampaignRunner(loaded, plan, campaign, progress)
    try:
        outcome = runner.execute()
        assert outcome.failed == [] and not outcome.interrupted
        assert sorted(outcome.done) == sorted(run.run_id for run in plan.runs)
        assert lingering == {run.run_id: [] for run in plan.runs}
        for run_id, what in seen.items():
            [(table, host, port)] = what["listening"]
            assert (table, host) == ("tcp", "127.0.0.1"), what  # not 0.0.0.0, not IPv6
            [(remote, connections, base_url)] = what["tunnels"]
            assert remote == ("127.0.0.1", port) and connections >= 1, what
            assert base_url.startswith("http://127.0.0.1:") and not base_url.endswith(f":{port}")
            assert what["tunnels_after"] == 0, f"{run_id}: its tunnel outlived its runtime"
        assert sorted(seen) == sorted(run.run_id for run in plan.runs)

        for run in plan.runs:
            folder = campaign.run_dir(run.run_id)
            for name in RECORD_FILES:
                assert (folder / name).is_file(), f"{run.run_id}: {name} missing"
            record = read_json(folder / "run.json")
            assert record["status"] == RUN_OK, record["reason"]
            assert record["knobs"]["env.REFBOX_LAYERS"] == "2"
            # The box's load and reference step, read on the box over SSH before and after.
            load = record["runtime"]["box_load"]
            for when in ("before", "after"):
                assert load[when]["cpus"] >= 1 and load[when]["reference_ms"] > 0, load
            requests = read_parquet(folder / "requests.parquet")
            assert len(requests[~requests["warmup"]]) == 2 and requests["ok"].all()
            assert (requests["completion_tokens"] == 8).all()
            assert len(read_parquet(folder / "chunks.parquet")) > 0
            ring = read_parquet(folder / "ring.parquet")
            assert len(ring) > 0 and int(ring["tokens"].sum()) > 0
            counters = read_json(folder / "counters.json")
            assert counters["delta"]["new_swapout_pages"] >= 0
            assert "listening on" in (folder / "server.log").read_text(encoding="utf-8")
        environment = read_json(campaign.root / "boxes" / f"{loaded.box_name}.json")
        assert environment["kind"] == "ssh" and environment["runtime"]["binary_sha256"]
        assert environment["drive"] == "tunnel"
        rtt = environment["tunnel_rtt"]
        assert rtt["samples"] == 50, rtt
        for path in ("tunnel", "ssh_channel"):
            assert 0 < rtt[path]["min_ms"] <= rtt[path]["median_ms"] <= rtt[path]["p90_ms"] < 1000

        # Greedy decoding over SSH is as deterministic as locally: both blocks of a cell agree.
        texts = {
            run.run_id: list(_scored(campaign.run_dir(run.run_id))["output_sha256"])
            for run in plan.runs
        }
        by_cell: dict[str, list[list[str]]] = {}
        for run in plan.runs:
            by_cell.setdefault(run.cell, []).append(texts[run.run_id])
        assert all(blocks[0] == blocks[1] for blocks in by_cell.values())

        # Executing the finished campaign again (what --resume does) redoes nothing.
        journal_before = (campaign.root / "journal.jsonl").read_text(encoding="utf-8")
        again = CampaignRunner(loaded, plan, campaign)
        second = again.execute()
        assert sorted(second.done) == sorted(outcome.done) and second.failed == []
        new_events = (campaign.root / "journal.jsonl").read_text(encoding="utf-8")[
            len(journal_before) :
        ]
        assert "run_start" not in {json.loads(line)["event"] for line in new_events.splitlines()}
    finally:
        checker.close()


@pytest.mark.slow
def test_preflight_passes_on_the_loopback_box(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    loaded = load_card(write_card(sshd, tmp_path))
    profile = load_runtime_profile(
        REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml"
    )
    box = SshBox(loaded.box_name, loaded.box, known_hosts=[sshd.known_hosts])
    checks = check_box(loaded.box_name, loaded.box, profile, box=box)
    box.close()
    names = [check.name for check in checks]
    assert names == [
        "reachable",
        "platform",
        "remote timeout",
        "python",
        "harness on box",
        "runtime binary",
        "file transfer",
        "port forwarding",
        "free disk",
        "cache drop",
        "clock",
        "swap-out counter",
    ]
    assert "round-trips in" in {c.name: c for c in checks}["port forwarding"].detail
    failed = [check for check in checks if not check.ok]
    # Free disk depends on the machine running the tests; every other check must pass here.
    assert [check.name for check in failed if check.name != "free disk"] == [], failed
    assert all(check.fix for check in failed)


def test_preflight_stops_at_an_unknown_host_key(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    loaded = load_card(write_card(sshd, tmp_path))
    spec = loaded.box.model_copy(update={"known_hosts": None})  # the key is then unknown
    checks = check_box(loaded.box_name, spec, None)
    assert [(check.name, check.ok) for check in checks] == [("reachable", False)]
    assert "known_hosts" in checks[0].detail and checks[0].fix


def test_preflight_flags_a_missing_runtime_binary(sshd: LoopbackSshd, tmp_path: Path) -> None:  # noqa: F811
    loaded = load_card(write_card(sshd, tmp_path))
    profile = load_runtime_profile(
        REPO / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml"
    )
    command = ["/nonexistent/llama-server", *profile.boot.command[1:]]
    other = profile.model_copy(
        update={"name": "other", "boot": profile.boot.model_copy(update={"command": command})}
    )
    spec = loaded.box.model_copy(update={"python": "/nonexistent/python3"})
    box = SshBox(loaded.box_name, spec, known_hosts=[sshd.known_hosts])
    checks = {check.name: check for check in check_box(loaded.box_name, spec, other, box=box)}
    box.close()
    assert not checks["python"].ok and "/nonexistent/python3" in checks["python"].detail
    assert not checks["runtime binary"].ok and "llama-server" in checks["runtime binary"].detail
    assert checks["runtime binary"].fix and checks["python"].fix
    assert not checks["harness on box"].ok  # its boot command still runs `-m harness.refbox`


def test_a_frequency_file_the_boxs_model_would_refuse_stops_the_run_before_any_boot(
    sshd: LoopbackSshd,  # noqa: F811
    tmp_path: Path,
) -> None:
    # `validate` cannot read a model on another box; `run` reads its config.json over the
    # box's shell before anything is made or booted: the shipped frequency file (8 x 64, the
    # reference runtime's) against a 48-layer model is exit 2, naming the cell, both shapes and
    # the fix, and no campaign directory is left.
    for name in ("prompts", "maps"):
        (tmp_path / name).symlink_to(REPO / "campaigns" / name)
    model = tmp_path / "box-models" / "qwen3-moe"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps({"num_hidden_layers": 48, "num_experts": 128}), encoding="utf-8"
    )
    box = (
        f"box:\n  kind: ssh\n  host: 127.0.0.1\n  port: {sshd.port}\n  user: {sshd.user}\n"
        f"  key: {sshd.client_key}\n  python: {sys.executable}\n"
        f"  workdir: {tmp_path / 'box-workdir'}\n  known_hosts: {sshd.known_hosts}\n"
        "  platform: linux-cuda\n"
    )
    text = (
        (REPO / "campaigns" / "sglang-kt-placement.yaml")
        .read_text(encoding="utf-8")
        .replace("box: local\n", box)
        .replace("/models/Qwen3-30B-A3B\n", f"{model}\n")
    )
    card = tmp_path / "card.yaml"
    card.write_text(text, encoding="utf-8")
    assert load_card(card).card.cells  # validate passes: the model is not on this box
    reports = tmp_path / "reports"
    done = run_cli("run", str(card), "--reports", str(reports), "--quiet")
    assert done.code == 2, done.stdout + done.stderr
    assert "cells.frequency.files.init_expert_location" in done.stderr
    assert "8 layers and the model 48" in done.stderr and f"{model}/config.json" in done.stderr
    assert "Traceback" not in done.stderr
    assert not reports.exists() or not any(reports.rglob("journal.jsonl"))


def test_a_paged_experts_cell_the_boxs_model_would_refuse_stops_the_run_before_any_boot(
    sshd: LoopbackSshd,  # noqa: F811
    tmp_path: Path,
) -> None:
    # SGLang's Paged Experts refuses fewer resident experts than the router's top-k at boot.
    # `validate` cannot read the model on another box; `run` reads its config.json over the
    # box's shell first: 4 resident against a top-k of 8 is exit 2, naming the knob, the
    # model's file on that box and the fix, and nothing is left behind.
    for name in ("prompts", "maps"):
        (tmp_path / name).symlink_to(REPO / "campaigns" / name)
    model = tmp_path / "box-models" / "qwen3-moe"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps({"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}),
        encoding="utf-8",
    )
    box = (
        f"box:\n  kind: ssh\n  host: 127.0.0.1\n  port: {sshd.port}\n  user: {sshd.user}\n"
        f"  key: {sshd.client_key}\n  python: {sys.executable}\n"
        f"  workdir: {tmp_path / 'box-workdir'}\n  known_hosts: {sshd.known_hosts}\n"
        "  platform: linux-cuda\n"
    )
    text = (
        (REPO / "campaigns" / "sglang-kt-placement.yaml")
        .read_text(encoding="utf-8")
        .replace("box: local\n", box)
        .replace("runtime: sglang-kt", "runtime: sglang")
        .replace("    files: {init_expert_location: maps/kt-frequency-refbox.pt}\n", "")
    )
    lines = [line for line in text.splitlines() if not line.strip().startswith("kt_")]
    paged = '      enable_paged_experts: true\n      paged_experts_num_resident: "4"\n'
    text = "\n".join(lines).replace(
        "      model: /models/Qwen3-30B-A3B\n", f"      model: {model}\n" + paged, 1
    )
    card = tmp_path / "card.yaml"
    card.write_text(text.replace("/models/Qwen3-30B-A3B\n", f"{model}\n") + "\n", "utf-8")
    assert load_card(card).card.cells  # validate passes: the model is not on this box
    reports = tmp_path / "reports"
    done = run_cli("run", str(card), "--reports", str(reports), "--quiet")
    assert done.code == 2, done.stdout + done.stderr
    assert "cells.uniform.knobs.paged_experts_num_resident" in done.stderr, done.stderr
    assert "fewer than the model's router top-k 8" in done.stderr
    assert f"{model}/config.json" in done.stderr and "Traceback" not in done.stderr
    assert not reports.exists() or not any(reports.rglob("journal.jsonl"))
