#!/usr/bin/env python3
"""Adversarial rerun of the trust rounds two (issue 44) and three (issue 57), as a black box.

Every reproduction of the two audit write-ups is rebuilt here from its description, against
the ``harness`` command line, the files of a campaign directory and the reference runtime it
boots, never from the project's tests (a check that shares the code's assumptions cannot find
it wrong). Cases marked "added" try a neighbouring path the write-ups did not name.

One small campaign (two cells, one A/B/B/A cycle, on the bundled reference runtime) is run
once; each tampering case works on its own copy of it. Every subprocess has a timeout: a hang
is a failure. Processes this script starts are stopped by their PID, never by name.

    .venv/bin/python scripts/adversarial-rerun.py            # every case
    .venv/bin/python scripts/adversarial-rerun.py --only r3_fifo_heads_store --keep
    .venv/bin/python scripts/adversarial-rerun.py --list

Exit 1 when any High or Medium case FAILED (or could not be built: ERROR), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / ".venv" / "bin" / "harness"
SEVERITIES = ("High", "Medium", "Low")
HEX64 = re.compile(r"journal head: ([0-9a-f]{64})")
# A traceback or the last-resort handler: bad data that reached no check of its own.
CRASH_MARKS = ("Traceback (most recent call last)", "internal error:")


# -- running things -----------------------------------------------------------------------------


@dataclass
class Res:
    """What a finished (or timed-out) command did."""

    cmd: list[str]
    rc: int | None  # None: killed at its timeout
    out: str
    err: str
    secs: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    @property
    def text(self) -> str:
        return self.out + "\n" + self.err

    def crashed(self) -> bool:
        """A traceback or "internal error" instead of a message of its own."""
        return any(mark in self.text for mark in CRASH_MARKS)

    def said(self, limit: int = 160) -> str:
        """The last meaningful line it printed, for a one-line why."""
        lines = [ln.strip() for ln in self.text.splitlines() if ln.strip()]
        return (lines[-1] if lines else "(nothing printed)")[:limit]

    def brief(self) -> str:
        rc = "TIMEOUT" if self.rc is None else str(self.rc)
        return f"rc={rc} ({self.secs:.1f}s): {self.said()}"


def _ppid_map() -> dict[int, int]:
    """pid -> parent pid for every process, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a runtime in its own group is still a child by ppid)."""
    parents = _ppid_map()
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [p for p, parent in parents.items() if parent == current]
        found.extend(kids)
        frontier.extend(kids)
    return found


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    """Signal each PID we started (or a child of one), one by one."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _limit_memory(gib: float) -> Callable[[], None]:
    def apply() -> None:
        size = int(gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    return apply


class Bg:
    """A command in the background, its output in files (no pipe to fill)."""

    def __init__(
        self, cmd: list[str], cwd: Path, env: dict[str, str], mem_gib: float | None = None
    ) -> None:
        self.cmd = cmd
        self.start = time.monotonic()
        self._out = tempfile.TemporaryFile(mode="w+", errors="replace")
        self._err = tempfile.TemporaryFile(mode="w+", errors="replace")
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            text=True,
            start_new_session=True,  # its own group: a timeout kills what it started too
            preexec_fn=_limit_memory(mem_gib) if mem_gib else None,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal it and, for SIGKILL, everything below it (by PID)."""
        below = descendants(self.pid) if sig == signal.SIGKILL else []
        kill_pids([self.pid], sig)
        kill_pids(below)

    def finish(self, timeout: float) -> Res:
        """Wait up to ``timeout`` s; kill it (and its children) when it is not done by then."""
        rc: int | None
        try:
            rc = self.proc.wait(timeout=max(0.1, timeout - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(timeout=30)
            rc = None
        kill_pids(descendants(self.pid))  # a runtime left behind by a killed harness
        self._out.seek(0)
        self._err.seek(0)
        out, err = self._out.read(), self._err.read()
        self._out.close()
        self._err.close()
        return Res(self.cmd, rc, out, err, time.monotonic() - self.start)


def run(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float = 120,
    mem_gib: float | None = None,
) -> Res:
    """Run ``cmd`` to its end or its timeout (a hang is a result, never a stuck script)."""
    return Bg(cmd, cwd, env, mem_gib).finish(timeout)


# -- what a case says ----------------------------------------------------------------------------


class Failed(Exception):
    """The harness did not hold: the message says why, in one line."""


class Skipped(Exception):
    """The case cannot be run on this machine (said, never counted as held)."""


def check(condition: bool, why: str) -> None:
    if not condition:
        raise Failed(why)


@dataclass
class Case:
    name: str
    round: str  # "two" (issue 44) or "three" (issue 57)
    severity: str
    added: bool
    title: str
    func: Callable[[Ctx], str | None]


CASES: list[Case] = []


def case(
    round_: str, severity: str, title: str, *, added: bool = False
) -> Callable[[Callable[[Ctx], str | None]], Callable[[Ctx], str | None]]:
    """Register a case: it returns a note when it held, raises Failed when it did not."""
    assert severity in SEVERITIES and round_ in ("two", "three")

    def register(func: Callable[[Ctx], str | None]) -> Callable[[Ctx], str | None]:
        CASES.append(Case(func.__name__, round_, severity, added, title, func))
        return func

    return register


@dataclass
class Outcome:
    case: Case
    status: str  # held, FAILED, ERROR (the case could not be built), skipped
    why: str
    secs: float


# -- files of a campaign directory, as an adversary handles them --------------------------------


def sha_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha_file(path: Path) -> str:
    return sha_bytes(path.read_bytes())


@dataclass
class Line:
    raw: bytes
    event: dict[str, Any]


def jread(root: Path) -> list[Line]:
    """The journal's event lines as written (a line that holds no event is dropped)."""
    lines = []
    for raw in (root / "journal.jsonl").read_bytes().split(b"\n"):
        with contextlib.suppress(ValueError):
            event = json.loads(raw)
            if isinstance(event, dict) and isinstance(event.get("event"), str):
                lines.append(Line(raw, event))
    return lines


def jwrite_raw(root: Path, raws: list[bytes]) -> None:
    (root / "journal.jsonl").write_bytes(b"".join(r + b"\n" for r in raws))


def jrechain(root: Path, events: list[dict[str, Any]], *, prev: bool = True) -> None:
    """Write ``events`` as the journal, each ``prev`` the digest of the line before (the chain
    the README describes, recomputed as anyone who can write the directory can)."""
    raws: list[bytes] = []
    for event in events:
        event = dict(event)
        event.pop("prev", None)
        if prev:
            event["prev"] = sha_bytes(raws[-1]) if raws else ""
        raws.append(json.dumps(event).encode())
    jwrite_raw(root, raws)


def jappend(root: Path, event: dict[str, Any]) -> None:
    """Append one event chained to the journal's last line."""
    lines = jread(root)
    record = {"schema_version": 1, "t": time.time(), **event}
    record["prev"] = sha_bytes(lines[-1].raw) if lines else ""
    with (root / "journal.jsonl").open("ab") as handle:
        handle.write(json.dumps(record).encode() + b"\n")


def run_files(run_dir: Path) -> dict[str, str]:
    """What a run_done seals: every regular file of the run folder (dot names are scratch)."""
    found = {}
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and not path.is_symlink():
            found[rel.as_posix()] = sha_file(path)
    return found


def reseal(root: Path, *, prev: bool = True) -> None:
    """Recompute every digest the journal holds from the files as they are now, then the
    chain: an edit made to look sealed."""
    events = [line.event for line in jread(root)]
    for event in events:
        kind, files = event["event"], event.get("files")
        if kind == "run_done" and isinstance(event.get("run_id"), str):
            event["files"] = run_files(root / "runs" / event["run_id"])
        elif isinstance(files, dict):
            event["files"] = {
                name: sha_file(root / name) for name in files if (root / name).is_file()
            }
    jrechain(root, events, prev=prev)


def last_line_digest(root: Path) -> str:
    return sha_bytes(jread(root)[-1].raw)


def heads_store(root: Path) -> Path:
    """reports/history/journal-heads.jsonl beside reports/<campaign>/<stamp>."""
    return root.parent.parent / "history" / "journal-heads.jsonl"


def run_ids(root: Path) -> list[str]:
    return [r["run_id"] for r in json.loads((root / "plan.json").read_text())["runs"]]


def run_json(root: Path, run_id: str) -> dict[str, Any]:
    return json.loads((root / "runs" / run_id / "run.json").read_text())


def scale_timings(run_dir: Path, factor: float) -> None:
    """Every request of a run ``factor`` times as long (a forged speed-up when < 1)."""
    import pandas as pd

    requests = pd.read_parquet(run_dir / "requests.parquet")
    for column in ("ttft_s", "e2el_s"):
        requests[column] = requests[column] * factor
    requests.to_parquet(run_dir / "requests.parquet", index=False)
    chunks = pd.read_parquet(run_dir / "chunks.parquet")
    chunks["t_s"] = chunks["t_s"] * factor
    chunks.to_parquet(run_dir / "chunks.parquet", index=False)


def newest_campaign(reports: Path, name: str) -> Path | None:
    folder = reports / name
    if not folder.is_dir():
        return None
    found = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return found[-1] if found else None


# -- the reference runtime, reached as any local process can ------------------------------------


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    ctype: str = "application/json",
    token: str | None = None,
    timeout: float = 5,
) -> int:
    """The HTTP status of one call (-1: no answer)."""
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", ctype)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return -1


def cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return []


def arg_after(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_health(base_url: str, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if http("GET", f"{base_url}/health", timeout=1) == 200:
            return True
        time.sleep(0.05)
    return False


@dataclass
class Refbox:
    """A reference runtime a harness under test booted, as seen from /proc."""

    pid: int
    url: str
    args: list[str]


# -- crafted files -----------------------------------------------------------------------------


def npy_bytes(descr: str, shape: tuple[int, ...], body: bytes) -> bytes:
    """A .npy file whose header says ``shape`` whatever the bytes behind it hold."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = 64 - (10 + len(header) + 1) % 64
    text = (header + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


class _Pickle:
    """Protocol-2 opcodes for what torch.save writes (dicts, lists, tensors), by hand, so a
    crafted tensor may claim any size and stride over any storage."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.storages: list[bytes] = []

    def emit(self, value: Any) -> None:
        if isinstance(value, str):
            raw = value.encode()
            self.out += b"X" + struct.pack("<I", len(raw)) + raw
        elif isinstance(value, bool):
            self.out += b"\x88" if value else b"\x89"
        elif isinstance(value, int):
            self.out += b"J" + struct.pack("<i", value)
        elif isinstance(value, tuple):
            self.out += b"("
            for item in value:
                self.emit(item)
            self.out += b"t"
        elif isinstance(value, list):
            self.out += b"]("
            for item in value:
                self.emit(item)
            self.out += b"e"
        elif isinstance(value, dict):
            self.out += b"}("
            for key, item in value.items():
                self.emit(key)
                self.emit(item)
            self.out += b"u"
        elif isinstance(value, Tensor):
            self.tensor(value)
        else:
            raise TypeError(type(value).__name__)

    def tensor(self, t: Tensor) -> None:
        key = str(len(self.storages))
        self.storages.append(t.data)
        self.out += b"ctorch._utils\n_rebuild_tensor_v2\n("
        self.out += b"("
        self.emit("storage")
        self.out += f"ctorch\n{t.storage}\n".encode()
        self.emit(key)
        self.emit("cpu")
        self.emit(t.numel)
        self.out += b"tQ"
        self.emit(0)
        self.emit(t.size)
        self.emit(t.stride)
        self.out += b"\x89ccollections\nOrderedDict\n)RtR"


@dataclass
class Tensor:
    storage: str  # LongStorage, DoubleStorage
    data: bytes
    numel: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def long_tensor(values: list[int], size: tuple[int, ...]) -> Tensor:
    stride = tuple(int(_prod(size[i + 1 :])) for i in range(len(size)))
    return Tensor("LongStorage", struct.pack(f"<{len(values)}q", *values), len(values), size, stride)


def double_tensor(values: list[float], size: tuple[int, ...]) -> Tensor:
    stride = tuple(int(_prod(size[i + 1 :])) for i in range(len(size)))
    data = struct.pack(f"<{len(values)}d", *values)
    return Tensor("DoubleStorage", data, len(values), size, stride)


def _prod(values: tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def write_pt(path: Path, obj: Any) -> None:
    """A torch zip: archive/data.pkl, archive/data/<key>, archive/version (stored)."""
    pickler = _Pickle()
    pickler.emit(obj)
    pickler.out += b"."
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", bytes(pickler.out))
        for key, data in enumerate(pickler.storages):
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", b"3\n")


# -- the campaign every tampering case copies ---------------------------------------------------

# Text from a card is data in every output: the campaign and a cell carry terminal escapes (CSI,
# OSC, BEL), bidirectional overrides, zero-width characters and a line separator.
HOSTILE = "adv \x1b[31mred\x1b]0;title\x07 \u202eevil\u202c zw\u200bsp\u200c ls\u2028end \x9b"
HOSTILE_CELL = "ctl \x1b[2J\u202ebidi\u200d\u2066iso\u2069\ufeff"
CONTROL_CHARS = {"\x1b": "ESC", "\x07": "BEL", "\x9b": "C1 CSI"}
BIDI = {chr(c): f"U+{c:04X}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
INVISIBLE = {
    "\u200b": "U+200B",
    "\u200c": "U+200C",
    "\u200d": "U+200D",
    "\ufeff": "U+FEFF",
    "\u2028": "U+2028",
    "\u2029": "U+2029",
}

POOL = {
    "en-prose": [
        "The lighthouse keeper counted ships each evening.",
        "Autumn came early to the valley and the river ran low.",
        "She opened the old ledger and found a faded map.",
        "By noon the market square was full of carts.",
    ],
    "python": [
        "def add(a, b):\n    return a + b",
        "for item in items:\n    print(item)",
        "class Stack:\n    def push(self, x): pass",
        "import os\nprint(os.getcwd())",
    ],
}


def write_pool(folder: Path) -> None:
    (folder / "pools").mkdir(parents=True, exist_ok=True)
    rows = []
    for domain, prompts in POOL.items():
        for i, prompt in enumerate(prompts):
            split = "fit" if i < 2 else "heldout"
            rows.append({"id": f"{domain}-{i}", "domain": domain, "split": split, "prompt": prompt})
    (folder / "pools" / "small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def card_text(
    campaign: str = "advtiny",
    runtime: str = "refbox",
    *,
    hostile: bool = True,
    better_gates: bool = True,
    extra_knob: str = "",
) -> str:
    """A two-cell, one-cycle card on the reference runtime (four runs of four requests)."""
    env = '{REFBOX_LAYERS: "2", REFBOX_EXPERTS: "8", REFBOX_HOT_SLOTS: "%s", ' + (
        'REFBOX_EXPERT_BYTES: "4096"}'
    )
    knobs = "{policy: adaptive, drain_every: 64" + extra_knob + "}"
    lines = [
        f"campaign: {campaign}",
        f"description: {json.dumps(HOSTILE)}" if hostile else "description: adversarial rerun",
        "box: local",
        f"runtime: {runtime}",
        "prompts:",
        "  pools: [pools/small.jsonl]",
        "  fit: {split: fit}",
        "  heldout: {split: heldout}",
        "workload:",
        "  max_tokens: 8",
        "  warmup_requests: 1",
        "  request_timeout_s: 20",
        "  phases:",
        "    - {name: prose, domains: [en-prose], requests: 2}",
        "    - {name: code, domains: [python], requests: 2, shift: true}",
        "cells:",
        "  control:",
        *([f"    description: {json.dumps(HOSTILE_CELL)}"] if hostile else []),
        "    env: " + env % "4",
        f"    knobs: {knobs}",
        "  wide:",
        "    env: " + env % "8",
        f"    knobs: {knobs}",
        "control: control",
        "design: {order: abba, cycles: 1, repeats: 1, cache_states: [warm], retries: 0}",
        "analysis: {window_s: 0.5, converged_span_s: 1, hold_s: 0}",
        "gates:",
        "  - {kind: exact_outputs, min_match: all}",
    ]
    if better_gates:
        lines += [
            "  - {kind: counter, counter: lost_ring_records, max: 0}",
            "  - {kind: better, metric: decode_tok_s}",
            "  - {kind: better, metric: hit_rate}",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Base:
    folder: Path  # holds card.yaml, pools/ and reports/
    reports: Path
    root: Path  # reports/advtiny/<stamp>
    head: str  # the journal head `harness run` printed
    rc: int  # the verdict's exit code
    res: Res


@dataclass
class Grown:
    """A copy grown to two cycles by `harness run --resume --cycles 2`, and what other
    commands said while it held the directory."""

    root: Path
    res: Res
    holder_seen: bool
    probes: dict[str, Res]
    still_running_after_probes: bool
    after: Res | None


@dataclass
class Live:
    """A campaign run while a local process attacked the runtime it booted."""

    root: Path | None
    res: Res
    boots: list[dict[str, Any]] = field(default_factory=list)


class Ctx:
    """The scratch folder, the environment every command gets, and what cases share."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.tmp = work / "tmp"  # TMPDIR of every harness: its scratch stays in here
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        self.env["TMPDIR"] = str(self.tmp)
        self.env.pop("HARNESS_BOOT_DIR", None)
        self._base: Base | None = None
        self._grown: Grown | None = None
        self._live: dict[str, Live] = {}
        self._imports: dict[str, tuple[Res, Res | None]] = {}
        self._partials: dict[str, Any] | None = None
        self.victims: list[Victim] = []

    # commands
    def harness(
        self, *args: str | Path, cwd: Path | None = None, timeout: float = 120, mem: float = 0
    ) -> Res:
        cmd = [str(HARNESS), *map(str, args)]
        return run(cmd, cwd or self.work, self.env, timeout, mem or None)

    def bg_harness(self, *args: str | Path, cwd: Path) -> Bg:
        return Bg([str(HARNESS), *map(str, args)], cwd, self.env)

    def folder(self, name: str) -> Path:
        path = self.work / "cases" / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    # the base campaign
    def base(self) -> Base:
        if self._base is None:
            folder = self.work / "base"
            folder.mkdir(parents=True, exist_ok=True)
            write_pool(folder)
            (folder / "card.yaml").write_text(card_text())
            res = self.harness(
                "run", "card.yaml", "--reports", "reports", "--quiet", cwd=folder, timeout=600
            )
            root = newest_campaign(folder / "reports", "advtiny")
            if res.rc not in (0, 1) or root is None:
                raise RuntimeError(f"the base campaign did not run: {res.brief()}")
            found = HEX64.findall(res.out)
            if not found or found[-1] != last_line_digest(root):
                raise RuntimeError("`harness run` printed no journal head naming the last line")
            self._base = Base(folder, folder / "reports", root, found[-1], res.rc, res)
        return self._base

    def copy(self, name: str) -> Path:
        """A copy of the base campaign's reports tree (the campaign and its results store)."""
        base = self.base()
        target = self.folder(name) / "reports"
        shutil.copytree(base.reports, target, symlinks=True)
        return target / base.root.relative_to(base.reports)

    def gate(self, root: Path, *flags: str, timeout: float = 120) -> Res:
        return self.harness("gate", root, *flags, timeout=timeout)

    def victim(self, mark: str | None) -> Victim:
        made = Victim(mark, self.env)
        self.victims.append(made)
        return made

    def stop_victims(self) -> None:
        for made in self.victims:
            made.stop()
        self.victims.clear()


class Victim:
    """A sleeping process group of our own, the would-be target of an orphan kill."""

    def __init__(self, mark: str | None, env: dict[str, str]) -> None:
        env = dict(env)
        env.pop("HARNESS_BOOT_DIR", None)
        if mark is not None:
            env["HARNESS_BOOT_DIR"] = mark
        self.proc = subprocess.Popen(["sleep", "900"], env=env, start_new_session=True)
        self.pgid = self.proc.pid
        time.sleep(0.05)
        self.identity = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(self.pgid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# -- shared, expensive steps (run once, read by several cases) ---------------------------------


def grown(ctx: Ctx) -> Grown:
    """`run --resume COPY --cycles 2` in the background; while it holds the directory (its
    `.lock` deleted first), gate, report, analyze and a second resume try it."""
    if ctx._grown is None:
        root = ctx.copy("grown")
        holder = ctx.bg_harness("run", "--resume", root, "--cycles", "2", "--quiet", cwd=root)
        seen = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and holder.running():
            with contextlib.suppress(OSError, ValueError):
                who = json.loads((root / ".lock").read_text())
                if who.get("pid") == holder.pid and jread(root)[-1].event["event"] != "sealed":
                    seen = True
                    break
            time.sleep(0.05)
        probes: dict[str, Res] = {}
        if seen:
            (root / ".lock").unlink(missing_ok=True)  # a lock that is only a file name is gone
            probes["gate"] = ctx.gate(root, timeout=60)
            probes["report"] = ctx.harness("report", root, "--no-figures", timeout=60)
            probes["analyze"] = ctx.harness("analyze", root, timeout=60)
            probes["resume"] = ctx.harness("run", "--resume", root, "--quiet", timeout=60)
        still = holder.running()
        res = holder.finish(600)
        after = ctx.gate(root) if res.rc in (0, 1) else None
        ctx._grown = Grown(root, res, seen, probes, still, after)
    return ctx._grown


def live_campaign(
    ctx: Ctx, name: str, text: str, attack: Callable[[Refbox], dict[str, Any]]
) -> Live:
    """Run a campaign of ``text``; each runtime it boots is attacked once, as soon as it
    answers, by ``attack`` (a local process with no token)."""
    if name not in ctx._live:
        folder = ctx.folder(f"live-{name}")
        write_pool(folder)
        (folder / "card.yaml").write_text(text)
        holder = ctx.bg_harness("run", "card.yaml", "--reports", "reports", "--quiet", cwd=folder)
        seen: set[int] = set()
        boots = []
        while holder.running() and time.monotonic() - holder.start < 600:
            for pid in descendants(holder.pid):
                args = cmdline(pid)
                if pid in seen or "harness.refbox" not in args or "serve" not in args:
                    continue
                seen.add(pid)
                host = arg_after(args, "--host") or "127.0.0.1"
                url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:"
                url += str(arg_after(args, "--port"))
                if wait_health(url, 10):
                    boots.append(attack(Refbox(pid, url, args)))
            time.sleep(0.05)
        res = holder.finish(600)
        campaign = re.search(r"^campaign: (\S+)", text, re.M)
        root = newest_campaign(folder / "reports", campaign.group(1) if campaign else "")
        ctx._live[name] = Live(root, res, boots)
    return ctx._live[name]


ADMIN_ROUTES = [
    ("POST", "/admin/reset", b"{}", "application/json"),
    ("POST", "/admin/knobs", b'{"drain_every": 5, "policy": "frozen"}', "application/json"),
    ("POST", "/admin/knobs", b'{"drain_every": 5}', "text/plain"),
    ("GET", "/admin/state", None, ""),
    ("GET", "/admin/knobs", None, ""),
]
RECORDER_ROUTES = [
    ("POST", f"/{a}_expert_distribution_record", b"", "text/plain") for a in ("start", "stop")
] + [("POST", "/dump_expert_distribution_record", b"", "text/plain")]


def admin_attack(outside: Path, recorder: bool) -> Callable[[Refbox], dict[str, Any]]:
    """Every admin (and recorder) route, without the boot's token; and a dump aimed outside."""

    def attack(box: Refbox) -> dict[str, Any]:
        statuses: dict[str, Any] = {}
        routes = ADMIN_ROUTES + (RECORDER_ROUTES if recorder else [])
        for method, path, body, ctype in routes:
            statuses[f"{method} {path} {ctype}".strip()] = http(method, box.url + path, body, ctype)
        dump = json.dumps({"path": str(outside / f"dump-{box.pid}.json")}).encode()
        statuses["POST /admin/dump outside"] = http("POST", box.url + "/admin/dump", dump)
        statuses["health"] = http("GET", box.url + "/health")
        statuses["dump-dir"] = arg_after(box.args, "--dump-dir")
        return statuses

    return attack


def judge_admin(live: Live, outside: Path, campaign_root_hint: str) -> str:
    """Held when every call without the token got 401/403, nothing was written outside, and
    the campaign still reached a verdict."""
    check(live.boots, f"no booted runtime could be reached ({live.res.brief()})")
    for boot in live.boots:
        for route, status in boot.items():
            if route in ("health", "dump-dir"):
                continue
            check(status in (401, 403), f"{route} without the token answered {status}")
        dump_dir = boot.get("dump-dir")
        check(dump_dir is not None, "the runtime was booted without --dump-dir")
        check(
            campaign_root_hint in str(dump_dir),
            f"--dump-dir {dump_dir} is not inside the campaign",
        )
    leaked = list(outside.iterdir())
    check(not leaked, f"a dump landed outside the run: {leaked[0]}")
    check(live.res.rc in (0, 1), f"the attacked campaign reached no verdict: {live.res.brief()}")
    return f"{len(live.boots)} boots attacked, all 401; campaign rc={live.res.rc}"


# -- imports -----------------------------------------------------------------------------------

IMPORT_EXT = {"vllm": "json", "sglang": "jsonl", "aiperf": "json", "ds4": "csv"}


def _block(fmt: str, cell: str, cycle: int, slot: int) -> dict[str, Any]:
    """One block's results: the candidate twice as fast, a little noise."""
    jitter = 0.05 * ((cycle * 4 + slot) % 5)
    tpot = (10.0 if cell == "cand" else 20.0) + jitter
    if fmt in ("vllm", "sglang"):
        e2el = "median_e2el_ms" if fmt == "vllm" else "median_e2e_latency_ms"
        return {
            "date": f"2026-12-0{cycle + 1} 0{slot}:00",
            "backend": fmt,
            "model_id": "tiny",
            "num_prompts": 100,
            "duration": 10.0 + jitter,
            "completed": 100,
            "failed": 0,
            "median_tpot_ms": tpot,
            "p99_tpot_ms": tpot * 1.3,
            "median_ttft_ms": 50.0 + jitter,
            e2el: 500.0 + jitter,
            "output_throughput": 1000.0 / tpot * 4,
        }
    if fmt == "aiperf":
        return {
            "request_latency": {"unit": "ms", "avg": 500.0, "p50": 500.0 + jitter},
            "time_to_first_token": {"unit": "ms", "avg": 50.0, "p50": 50.0 + jitter},
            "inter_token_latency": {"unit": "ms", "avg": tpot, "p50": tpot, "p95": tpot * 1.2},
            "output_token_throughput": {"unit": "tokens/sec", "avg": 1000.0 / tpot * 4},
            "request_count": {"unit": "requests", "avg": 100},
            "benchmark_duration": {"unit": "sec", "avg": 10.0},
        }
    return {  # ds4-bench CSV, one row
        "ctx_tokens": 8192,
        "prefill_tokens": 8192,
        "prefill_tps": 500.0 + jitter,
        "gen_tokens": 128,
        "gen_tps": 1000.0 / tpot,
    }


def _render(fmt: str, block: dict[str, Any]) -> str:
    if fmt == "ds4":
        return ",".join(block) + "\n" + ",".join(str(v) for v in block.values()) + "\n"
    return json.dumps(block) + "\n"


Mutate = Callable[[str, int, int, dict[str, Any]], None]


def import_fixture(
    folder: Path, fmt: str, mutate: Mutate | None = None, cycles: int = 3
) -> tuple[list[Path], Path]:
    """Result files of ``cycles`` mirrored cycles and their mapping (``better decode_tok_s``)."""
    folder.mkdir(parents=True, exist_ok=True)
    files, entries = [], []
    for cycle in range(cycles):
        order = ["ctl", "cand", "cand", "ctl"] if cycle % 2 == 0 else ["cand", "ctl", "ctl", "cand"]
        for slot, cell in enumerate(order):
            block = _block(fmt, cell, cycle, slot)
            if mutate is not None:
                mutate(cell, cycle, slot, block)
            name = f"{fmt}-c{cycle}-s{slot}.{IMPORT_EXT[fmt]}"
            (folder / name).write_text(_render(fmt, block))
            files.append(folder / name)
            entries.append(f"  {name}: {{cell: {cell}, cycle: {cycle}, slot: {slot}}}")
    mapping = folder / "map.yaml"
    mapping.write_text(
        "\n".join(
            [
                f"campaign: adv-{fmt}",
                "box: impbox",
                "control: ctl",
                "files:",
                *entries,
                "gates: [{kind: better, metric: decode_tok_s}]",
            ]
        )
        + "\n"
    )
    return files, mapping


def import_and_gate(
    ctx: Ctx, name: str, fmt: str, mutate: Mutate | None = None
) -> tuple[Res, Res | None, Path]:
    folder = ctx.folder(name)
    files, mapping = import_fixture(folder / "in", fmt, mutate)
    out = folder / "out"
    imported = ctx.harness("import", fmt, *files, "--map", mapping, "-o", out, timeout=120)
    gated = ctx.gate(out) if imported.rc == 0 else None
    return imported, gated, out


def import_control(ctx: Ctx, fmt: str) -> None:
    """The untouched fixture must import and PASS, or a refusal of a bad one proves nothing."""
    if fmt not in ctx._imports:
        imported, gated, _ = import_and_gate(ctx, f"import-control-{fmt}", fmt)
        ctx._imports[fmt] = (imported, gated)
    imported, gated = ctx._imports[fmt]
    if imported.rc != 0 or gated is None or gated.rc != 0:
        shown = imported if gated is None else gated
        raise RuntimeError(f"the untouched {fmt} fixture does not PASS: {shown.brief()}")


def judge_import(ctx: Ctx, name: str, fmt: str, mutate: Mutate) -> str:
    """Held when the damaged import is refused (exit 2, no traceback), or imported and the
    gate does not pass it."""
    import_control(ctx, fmt)
    imported, gated, _ = import_and_gate(ctx, name, fmt, mutate)
    check(not imported.timed_out, f"import hung: {imported.brief()}")
    check(not imported.crashed(), f"import crashed: {imported.brief()}")
    if imported.rc == 2:
        return f"refused: {imported.said(100)}"
    check(imported.rc == 0, f"import exit {imported.rc}, not 2: {imported.brief()}")
    assert gated is not None
    check(not gated.crashed(), f"gate crashed: {gated.brief()}")
    check(gated.rc not in (0, None), f"imported and gated PASS: {gated.brief()}")
    return f"imported, gate fails closed: rc={gated.rc}"
