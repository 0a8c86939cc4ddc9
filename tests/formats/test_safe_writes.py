"""Writes never follow a planted link (issue 57): every writer, and a scan that keeps it so.

A link planted where the harness used to put its temp file (``.<name>.tmp``, ``<name>.tmp``)
or at the record's own name must leave the link's target as it was and the record a regular
file holding what was written.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd
import pytest

from harness.card import load_card
from harness.card.frozen import MANIFEST, freeze_inputs
from harness.errors import EXIT_GATE_FAILED, EXIT_OK, RecordError
from harness.formats.expert_distribution import write_logical_count
from harness.formats.maps import write_count_dump
from harness.formats.records import Journal, write_json_atomic, write_parquet
from harness.formats.ring import RingGeometry, RingWriter
from harness.formats.route_trace import slice_after_last_reset, write_run_part
from harness.formats.safe_write import (
    atomic_binary_writer,
    atomic_path,
    atomic_writer,
    copy_file_atomic,
    write_bytes_atomic,
    write_text_atomic,
)
from harness.formats.torchfile import write_torch_file
from harness.runtimes.ds4.gguf_writer import STRING, Region, Value, write_gguf
from harness.runtimes.llamacpp.traces import write_jsonl
from harness.runtimes.vllm.model import write_safetensors
from harness.runtimes.vllm.plugin import _Recorder
from tests.conftest import DATA, REPO, run_cli

VICTIM_TEXT = "not the harness's to write\n"


def _victim(tmp_path: Path) -> Path:
    """A file outside every folder the harness writes, that a planted link points at."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    victim = outside / f"victim-{len(list(outside.iterdir()))}"
    victim.write_text(VICTIM_TEXT)
    return victim


def _plant_temp_links(target: Path, victim: Path) -> None:
    """Links at every name the harness's writers used for their temp file beside ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for name in (f".{target.name}.tmp", f"{target.name}.tmp", f"{target.name}.tmp.{os.getpid()}"):
        (target.parent / name).symlink_to(victim)


def _assert_untouched(victim: Path) -> None:
    assert victim.read_text() == VICTIM_TEXT, f"{victim} was written through a planted link"


def _assert_record(target: Path) -> None:
    assert target.is_file() and not target.is_symlink(), f"{target} is not a regular file"


def _no_temp_left(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]
    assert not left, f"temp files left behind: {left}"


def _dump(path: Path) -> None:
    write_count_dump(path, np.arange(6, dtype=np.int64).reshape(2, 3), 1.5)


def _zeros(handle: BinaryIO, count: int) -> None:
    handle.write(b"\0" * count)


def _gguf(path: Path) -> None:
    region = Region("F32", (2, 2), _zeros)
    write_gguf(path, [("general.architecture", Value(STRING, "test"))], [("a", "w")], {"w": region})


def _streamed_text(path: Path) -> None:
    with atomic_writer(path) as handle:
        handle.write("streamed\n")


def _streamed_bytes(path: Path) -> None:
    with atomic_binary_writer(path) as handle:
        handle.write(b"streamed\n")


def _vllm_route_dump(path: Path) -> None:
    # The route plugin as vLLM runs it: a layer known, counted, the dump flushed (its flush
    # thread sleeps an hour, so only this flush writes).
    recorder = _Recorder(str(path), None, 3600.0)
    recorder.add_layer(0, 4)
    recorder.observe(0, [[1, 2]], prefill=False)
    recorder.flush()


def _by_name(path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(b"by name\n")


# Every writer the harness has, called as its callers call it: (name of the file, write it).
WRITERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "text": ("verdict.junit.xml", lambda p: write_text_atomic(p, "<xml/>\n")),
    "bytes": ("sweep.png", lambda p: write_bytes_atomic(p, b"\x89PNG")),
    "json": ("verdict.json", lambda p: write_json_atomic(p, {"verdict": "pass"})),
    "parquet": ("requests.parquet", lambda p: write_parquet(pd.DataFrame({"a": [1, 2]}), p)),
    "streamed text": ("record.md", _streamed_text),
    "streamed bytes": ("report.html", _streamed_bytes),
    "by name": ("model.gguf", _by_name),
    "llama.cpp trace": ("trace.jsonl", lambda p: write_jsonl([{"step": 0}], p)),
    "safetensors": (
        "model.safetensors",
        lambda p: write_safetensors(p, [("w", np.ones(2, np.float32))]),
    ),
    "count dump": ("counts.json", _dump),
    "torch file": ("dump.pt", lambda p: write_torch_file(p, {"x": np.arange(3)})),
    "logical count": ("logical.json", lambda p: write_logical_count(p, np.ones((2, 3)))),
    "ds4 gguf": ("tiny.gguf", _gguf),
    "vLLM route dump": ("routes.json", _vllm_route_dump),
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_link_planted_at_the_old_temp_names_is_never_written_through(
    tmp_path: Path, kind: str
) -> None:
    name, write = WRITERS[kind]
    target = tmp_path / "campaign" / name
    victim = _victim(tmp_path)
    _plant_temp_links(target, victim)
    write(target)
    _assert_untouched(victim)
    _assert_record(target)
    assert target.stat().st_size > 0
    _no_temp_left(target.parent)


@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_link_at_the_record_itself_is_replaced_not_followed(tmp_path: Path, kind: str) -> None:
    name, write = WRITERS[kind]
    target = tmp_path / "campaign" / name
    target.parent.mkdir()
    victim = _victim(tmp_path)
    target.symlink_to(victim)
    write(target)
    _assert_untouched(victim)
    _assert_record(target)


def test_the_vllm_route_trace_is_never_opened_through_a_link(tmp_path: Path) -> None:
    # The plugin appends its trace inside vLLM's process, by the name the harness gave it.
    victim = _victim(tmp_path)
    trace = tmp_path / "run" / "routes.jsonl"
    trace.parent.mkdir()
    trace.symlink_to(victim)
    with pytest.raises(OSError):
        _Recorder(None, str(trace), 3600.0)
    _assert_untouched(victim)


def test_what_is_written_is_what_was_asked_for_and_readable_by_a_runtime(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    _plant_temp_links(target, _victim(tmp_path))
    write_text_atomic(target, "ünïcode\n")
    assert target.read_text(encoding="utf-8") == "ünïcode\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # a runtime in a container reads it


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "verdict.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_writer(target) as handle:
        handle.write("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdict.json"]


def test_a_copy_keeps_content_and_mode_and_never_writes_through_a_link(tmp_path: Path) -> None:
    source = tmp_path / "script.sh"
    source.write_text("#!/bin/sh\n")
    source.chmod(0o755)
    target = tmp_path / "box" / "script.sh"
    victim = _victim(tmp_path)
    _plant_temp_links(target, victim)
    copy_file_atomic(source, target)
    _assert_untouched(victim)
    _assert_record(target)
    assert target.read_text() == "#!/bin/sh\n" and target.stat().st_mode & 0o777 == 0o755


def test_a_route_trace_cut_in_place_never_writes_through_a_link(tmp_path: Path) -> None:
    lines = [
        {"kind": "header", "version": 1},
        {"kind": "step", "step": 0},
        {"kind": "reset", "step": 1, "knobs": {}, "hot": []},
        {"kind": "step", "step": 2},
    ]
    trace = tmp_path / "run" / "route-trace.jsonl"
    trace.parent.mkdir()
    trace.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines))
    copy = tmp_path / "other" / "route-trace.jsonl"
    victim = _victim(tmp_path)
    _plant_temp_links(trace, victim)
    _plant_temp_links(copy, victim)
    assert write_run_part(trace, copy) == 1
    assert slice_after_last_reset(trace) == 1
    _assert_untouched(victim)
    for path in (trace, copy):
        _assert_record(path)
        kept = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["kind"] for r in kept] == ["header", "step"] and kept[0]["after_reset_step"] == 1


def test_frozen_inputs_never_write_through_a_link(tmp_path: Path) -> None:
    card = load_card(REPO / "campaigns" / "demo.yaml")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    freeze_inputs(card, scratch)
    copies = [e["copy"] for e in json.loads((scratch / MANIFEST).read_text())["files"]]
    root = tmp_path / "campaign"
    victim = _victim(tmp_path)
    for copy in [*filter(None, copies), MANIFEST]:
        _plant_temp_links(root / copy, victim)
    freeze_inputs(card, root)
    _assert_untouched(victim)
    for copy in filter(None, copies):
        _assert_record(root / copy)
        assert (root / copy).read_bytes() == (scratch / copy).read_bytes()


def test_files_written_in_place_refuse_a_link_there(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    journal = tmp_path / "journal.jsonl"
    journal.symlink_to(victim)
    with pytest.raises(RecordError, match=r"journal\.jsonl: is a symbolic link"):
        Journal(journal).append("note")
    ring = tmp_path / "ring.bin"
    ring.symlink_to(victim)
    with pytest.raises(RecordError, match=r"ring\.bin: is a symbolic link"):
        RingWriter(str(ring), 4, RingGeometry(1, 4, 1, 1))
    _assert_untouched(victim)


def test_gate_writes_its_records_past_planted_links(tmp_path: Path) -> None:
    # Under reports/<campaign>/ so that gate also writes the report's copy beside the folder.
    reports = tmp_path / "reports"
    root = reports / "demo" / "20260101-000000"
    shutil.copytree(DATA / "campaigns" / "demo-shaped", root)
    victim = _victim(tmp_path)
    written = ("verdict.json", "verdict.junit.xml", "record.md", "report.html")
    for name in written:
        _plant_temp_links(root / name, victim)
    _plant_temp_links(reports / "demo-20260101-000000.html", victim)
    (root / "verdict.json").unlink()
    (root / "verdict.json").symlink_to(victim)
    done = run_cli("gate", str(root), "--quiet", "--allow-unsealed")
    assert done.code in (EXIT_OK, EXIT_GATE_FAILED), done.stderr
    _assert_untouched(victim)
    for name in written:
        _assert_record(root / name)
    assert json.loads((root / "verdict.json").read_text())["schema_version"] >= 1
    _assert_record(reports / "demo-20260101-000000.html")


# --- The scan: nothing in harness/ writes a file but harness/formats/safe_write.py -------------

WRITER_MODULE = "harness/formats/safe_write.py"
# Calls that write a file by its name, following a link there.
_PATH_WRITERS = {"write_text", "write_bytes", "to_parquet", "tofile", "save", "savez"}
_PATH_WRITERS |= {"savez_compressed", "copy", "copy2", "copyfile", "copytree"}
# Temp files of their own: every temp file beside a record is the one writer's.
_PATH_WRITERS |= {"mkstemp", "NamedTemporaryFile"}
_SAFE_HANDLES = {"atomic_writer", "atomic_binary_writer", "atomic_path"}
# Receivers whose .open / .save / .copy is no file write (tarfile reads here, frame.copy()…).
_NOT_FILES = {"tarfile", "zipfile", "CohortBook", "dataclasses", "self"}

# What may still write a file by itself, each with why. A path names a file or a folder.
ALLOWED: dict[tuple[str, str], str] = {
    ("harness/benchmarks/", "*"): (
        "benchmarks build their scratch campaigns, cards and logs inside a temp folder they "
        "have just made (TemporaryDirectory / mkdtemp): no one else's link can be there"
    ),
    ("harness/runtimes/vllm/plugin.py", "*"): (
        "runs inside vLLM's venv, which has no harness to import (see its docstring)"
    ),
    ("harness/refbox/tiers.py", "*"): (
        "the runtime's expert files, through mkstemp (a random name opened O_EXCL, so no "
        "planted link is followed) and os.replace; moving the slow tier onto atomic_binary_"
        "writer made a 1 MiB disk fill inside the refbox (test_campaign_trust), not yet found why"
    ),
    ("harness/sim/sweep/workers.py", "*"): (
        "arrays shared with the sweep's worker processes, in a TemporaryDirectory it made"
    ),
    ("harness/stats/sequential_t.py", "mkstemp"): (
        "the decision math imports nothing of ours but errors (.importlinter), so its level "
        "cache writes through mkstemp's random exclusive name and os.replace itself"
    ),
    ("harness/drive/remote.py", "write_bytes"): "into a TemporaryDirectory it has just made",
    ("harness/execute/preflight.py", "write_text"): "into a TemporaryDirectory it has just made",
    ("harness/runtimes/boot.py", "write_text"): "into a TemporaryDirectory it has just made",
    ("harness/execute/slurm/submit.py", "*"): (
        "copies into the job folder it has just removed and made again (mkdir fails on a link)"
    ),
}


def _write_mode(call: ast.Call, mode_index: int) -> str | None:
    """The mode of an open() call when it may write ("?" when not a constant); else None."""
    mode = call.args[mode_index] if len(call.args) > mode_index else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    if mode is None:
        return None
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return "?"
    return mode.value if set(mode.value) & set("wax+") else None


def _receiver(func: ast.Attribute) -> str:
    value = func.value
    return value.id if isinstance(value, ast.Name) else ""


def _safe_handles(tree: ast.AST) -> set[str]:
    """Names bound by ``with atomic_…(path) as NAME`` (a handle or temp path of the writer) or
    to an ``io.BytesIO()``: writing to them writes no file by name."""
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) in ("io.BytesIO", "BytesIO")
        ):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id in _SAFE_HANDLES
                    and isinstance(item.optional_vars, ast.Name)
                ):
                    names.add(item.optional_vars.id)
    return names


def _no_follow_names(tree: ast.Module) -> set[str]:
    """Module constants of open flags that hold ``O_NOFOLLOW``."""
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign) and "O_NOFOLLOW" in ast.unparse(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _writes(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, kind) of every call in ``tree`` that writes a file on its own."""
    safe = _safe_handles(tree)
    no_follow = {"O_NOFOLLOW", *_no_follow_names(tree)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        kind = None
        if isinstance(func, ast.Name) and func.id == "open" and _write_mode(node, 1):
            first = node.args[0] if node.args else None
            kind = None if isinstance(first, ast.Name) and first.id in safe else "open"
        elif isinstance(func, ast.Attribute):
            receiver = _receiver(func)
            if func.attr == "open" and receiver == "os":
                flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
                follows = not any(name in flags for name in no_follow)
                kind = "os.open" if "O_CREAT" in flags and follows else None
            elif func.attr == "open" and receiver not in _NOT_FILES and _write_mode(node, 0):
                kind = "open"
            elif func.attr in _PATH_WRITERS and receiver not in _NOT_FILES:
                first = node.args[0] if node.args else None
                by_name = not (isinstance(first, ast.Name) and first.id in safe)
                # frame.copy() and array.copy() take no destination: no file.
                if by_name and (func.attr != "copy" or receiver == "shutil"):
                    kind = func.attr
        if kind:
            found.append((node.lineno, kind))
    return found


def _allowed(path: str, kind: str) -> bool:
    return any(
        (path == where or (where.endswith("/") and path.startswith(where)))
        and allowed in ("*", kind)
        for where, allowed in ALLOWED
    )


def test_nothing_but_the_one_writer_writes_a_file() -> None:
    problems = []
    for source in sorted((REPO / "harness").rglob("*.py")):
        path = source.relative_to(REPO).as_posix()
        if path == WRITER_MODULE:
            continue
        for line, kind in _writes(ast.parse(source.read_text(encoding="utf-8"))):
            if not _allowed(path, kind):
                problems.append(f"{path}:{line}: {kind}")
    assert not problems, (
        "files written around harness.formats.safe_write (a planted link would be followed); "
        "use write_text_atomic / write_bytes_atomic / atomic_writer / atomic_binary_writer / "
        "atomic_path / copy_file_atomic / open_in_place, or add a justified ALLOWED entry:\n"
        + "\n".join(problems)
    )


def test_the_scan_sees_each_way_of_writing_a_file() -> None:
    code = """
open(p, "w"); open(p, mode="ab"); path.open("w", encoding="utf-8"); path.write_text("x")
path.write_bytes(b""); os.open(p, os.O_WRONLY | os.O_CREAT); tempfile.mkstemp()
shutil.copyfile(a, b); frame.to_parquet(p); np.save(p, a); open(p, m)
open(p); path.open(); os.open(p, os.O_CREAT | os.O_NOFOLLOW); frame.copy()
FLAGS = os.O_NOFOLLOW
os.open(p, os.O_CREAT | FLAGS)
with atomic_binary_writer(p) as handle:
    frame.to_parquet(handle)
buffer = io.BytesIO()
np.save(buffer, a)
"""
    kinds = [kind for _, kind in _writes(ast.parse(code))]
    assert kinds.count("open") == 4 and "os.open" in kinds and len(kinds) == 11, kinds


def test_every_allowed_entry_is_still_needed() -> None:
    seen = set()
    for source in sorted((REPO / "harness").rglob("*.py")):
        path = source.relative_to(REPO).as_posix()
        for _, kind in _writes(ast.parse(source.read_text(encoding="utf-8"))):
            seen |= {
                (where, allowed)
                for where, allowed in ALLOWED
                if (path == where or (where.endswith("/") and path.startswith(where)))
                and allowed in ("*", kind)
            }
    assert set(ALLOWED) <= seen, f"stale ALLOWED entries: {set(ALLOWED) - seen}"
