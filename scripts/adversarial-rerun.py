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
import traceback
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
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


def started_under(folder: Path) -> list[int]:
    """Processes whose command line names a path under ``folder``: the runtimes a harness we
    started booted there (a box starts them detached, `setsid nohup`, so they are no
    descendants of it)."""
    mine, found = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(entry.parent.name)
            args = entry.read_bytes().decode(errors="replace").split("\0")
            if pid != mine and any(a.startswith(str(folder) + "/") for a in args):
                found.append(pid)
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
        # Closed in finish(): they outlive this call, as the process does.
        self._out = tempfile.TemporaryFile(mode="w+", errors="replace")  # noqa: SIM115
        self._err = tempfile.TemporaryFile(mode="w+", errors="replace")  # noqa: SIM115
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


def verdict_of(root: Path) -> dict[str, Any]:
    """verdict.json ({} when there is none: then no stale verdict is left either)."""
    path = root / "verdict.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def last_line_digest(root: Path) -> str:
    return sha_bytes(jread(root)[-1].raw)


def heads_store(root: Path) -> Path:
    """reports/history/journal-heads.jsonl beside reports/<campaign>/<stamp>."""
    return root.parent.parent / "history" / "journal-heads.jsonl"


def run_ids(root: Path) -> list[str]:
    return [r["run_id"] for r in json.loads((root / "plan.json").read_text())["runs"]]


def run_json(root: Path, run_id: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((root / "runs" / run_id / "run.json").read_text())
    return record


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


def served_tokens(base_url: str) -> int:
    """The runtime's token counter (GET /counters: not an admin route), 0 when unread."""
    with (
        contextlib.suppress(OSError, ValueError, urllib.error.URLError),
        urllib.request.urlopen(base_url + "/counters", timeout=2) as response,
    ):
        data = json.loads(response.read())
        value = data.get("tokens", 0) if isinstance(data, dict) else 0
        return int(value) if isinstance(value, int | float) else 0
    return 0


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
    data = struct.pack(f"<{len(values)}q", *values)
    return Tensor("LongStorage", data, len(values), size, stride)


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
# The characters that open an embedding, override or isolate (a lone pop reorders nothing).
BIDI = {chr(c): f"U+{c:04X}" for c in (0x202A, 0x202B, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068)}
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
    design: str = "",
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
        "design: {order: abba, cycles: 1, repeats: 1, cache_states: [warm], retries: 0"
        + design
        + "}",
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
        self._campaigns: dict[str, Base] = {}
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
            self._base = self.campaign_once("base", card_text())
        return self._base

    def campaign_once(self, name: str, text: str) -> Base:
        """Run the campaign of card ``text`` to its verdict in work/<name>."""
        if name not in self._campaigns:
            folder = self.work / name
            folder.mkdir(parents=True, exist_ok=True)
            write_pool(folder)
            (folder / "card.yaml").write_text(text)
            res = self.harness(
                "run", "card.yaml", "--reports", "reports", "--quiet", cwd=folder, timeout=600
            )
            campaign = text.split("\n", 1)[0].removeprefix("campaign: ")
            root = newest_campaign(folder / "reports", campaign)
            if res.rc not in (0, 1) or root is None:
                raise RuntimeError(f"the {name} campaign did not run: {res.brief()}")
            found = HEX64.findall(res.out)
            if not found or found[-1] != last_line_digest(root):
                raise RuntimeError("`harness run` printed no journal head naming the last line")
            self._campaigns[name] = Base(folder, folder / "reports", root, found[-1], res.rc, res)
        return self._campaigns[name]

    def copy(self, name: str, of: Base | None = None) -> Path:
        """A copy of a campaign's reports tree (the campaign and its results store)."""
        base = of or self.base()
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
                if who.get("pid") == holder.pid:
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
            for pid in started_under(folder):
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
        routes = [*ADMIN_ROUTES, *(RECORDER_ROUTES if recorder else [])]
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
    check(bool(live.boots), f"no booted runtime could be reached ({live.res.brief()})")
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
    check(not leaked, f"a dump landed outside the run: {leaked[:1]}")
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


# == round two (issue 44) ========================================================================


def _strip_seal(root: Path) -> None:
    """The directory made to look "made before sealing": no seal, no files, no chain; the
    results store's heads deleted too (whoever writes the directory can write reports/)."""
    events = []
    for line in jread(root):
        event = {k: v for k, v in line.event.items() if k not in ("seal", "files", "prev")}
        events.append(event)
    jrechain(root, events, prev=False)
    heads_store(root).unlink(missing_ok=True)


def _forge_speedup(root: Path) -> None:
    """Every run of the candidate cell 7.8 times faster."""
    for run_id in run_ids(root):
        if run_json(root, run_id).get("cell") == "wide":
            scale_timings(root / "runs" / run_id, 1 / 7.8)


@case("two", "High", "seal and files deleted from the journal: refused without --allow-unsealed")
def r2_seal_stripped_refused(ctx: Ctx) -> str | None:
    root = ctx.copy("r2_seal_stripped_refused")
    _forge_speedup(root)
    _strip_seal(root)
    res = ctx.gate(root)
    check(res.rc == 3, f"a seal-stripped, forged directory gated {res.brief()}")
    check("--allow-unsealed" in res.text, f"the refusal names no way on: {res.said()}")
    verdict = verdict_of(root)
    check(not verdict.get("passed"), "verdict.json still says passed")
    return res.said(90)


@case("two", "High", "seal stripped and --allow-unsealed: every output says unverified")
def r2_seal_stripped_allowed_says_unverified(ctx: Ctx) -> str | None:
    root = ctx.copy("r2_seal_stripped_allowed")
    _forge_speedup(root)
    _strip_seal(root)
    res = ctx.gate(root, "--allow-unsealed")
    check(res.rc is not None and res.rc != 2, f"gate --allow-unsealed: {res.brief()}")
    check("unverified" in res.text.lower(), "the terminal output does not say unverified")
    verdict = json.loads((root / "verdict.json").read_text())
    check(verdict.get("verified") is False, f"verdict.json verified={verdict.get('verified')}")
    check(bool(verdict.get("unverified")), "verdict.json gives no unverified reason")
    junit = (root / "verdict.junit.xml").read_text()
    check("<skipped" in junit or "unverified" in junit, "JUnit does not mark it unverified")
    for name in ("record.md", "report.html"):
        text = (root / name).read_text(errors="replace").lower()
        check("unverified" in text, f"{name} does not say unverified")
    return f"rc={res.rc}; verdict.json, JUnit, record.md, report.html and terminal say unverified"


def _plant_boot(root_or_out: Path, journal: str, victim: Victim, mark: str, chained: bool) -> None:
    """A boot_starting naming ``mark`` and a boot copying the victim's group and start time."""
    run_id = f"9999-planted-{victim.pgid}"
    lines: list[dict[str, Any]] = [
        {"event": "boot_starting", "run_id": run_id, "box": "local", "mark": mark},
        {
            "event": "boot",
            "run_id": run_id,
            "pgid": victim.pgid,
            "identity": victim.identity,
            "box": "local",
        },
    ]
    path = root_or_out / journal
    if chained:
        for line in lines:
            jappend(root_or_out, line)
    else:
        with path.open("ab") as handle:
            for line in lines:
                handle.write(json.dumps({"schema_version": 1, "t": time.time(), **line}).encode())
                handle.write(b"\n")


@case("two", "High", "planted boot line (not chained) + run --resume: nothing killed")
def r2_planted_boot_resume_unchained(ctx: Ctx) -> str | None:
    root = ctx.copy("r2_planted_unchained")
    # The victim even carries this campaign's own mark: only verifying the journal before any
    # kill keeps a line off the chain from killing it.
    mark = str(root / "box" / "9999-planted")
    victim = ctx.victim(mark)
    _plant_boot(root, "journal.jsonl", victim, mark, chained=False)
    res = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=300)
    time.sleep(0.5)
    check(victim.alive(), f"the victim group {victim.pgid} was killed ({res.brief()})")
    check(res.rc == 3, f"a journal with a line off its chain resumed: {res.brief()}")
    return f"victim alive; {res.said(90)}"


@case("two", "High", "planted boot lines (chained) + run --resume: no foreign group killed")
def r2_planted_boot_resume_chained(ctx: Ctx) -> str | None:
    root = ctx.copy("r2_planted_chained")
    # One victim marked as another campaign's runtime, one unmarked whose line claims a mark
    # inside this campaign: neither is provably ours.
    foreign = ctx.victim(str(ctx.work / "other-campaign" / "box" / "0000-x"))
    bare = ctx.victim(None)
    _plant_boot(root, "journal.jsonl", foreign, foreign_mark(ctx), chained=True)
    _plant_boot(root, "journal.jsonl", bare, str(root / "box" / "9999-planted"), chained=True)
    res = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=300)
    time.sleep(0.5)
    check(foreign.alive(), f"the foreign-marked group was killed ({res.brief()})")
    check(bare.alive(), f"the unmarked group was killed ({res.brief()})")
    check(not res.crashed() and res.rc is not None, f"resume: {res.brief()}")
    killed = [e for e in (ln.event for ln in jread(root)) if e["event"] == "orphan_killed"]
    check(not killed, f"orphan_killed journalled: {killed[:1]}")
    return f"both victims alive; resume rc={res.rc}"


def foreign_mark(ctx: Ctx) -> str:
    return str(ctx.work / "other-campaign" / "box" / "0000-x")


def _collect(ctx: Ctx, folder: Path, out: Path, timeout: float = 300) -> Res:
    write_pool(folder)
    (folder / "card.yaml").write_text(card_text("advcollect", hostile=False, better_gates=False))
    return ctx.harness(
        "collect", "card.yaml", "--split", "fit", "-o", out, cwd=folder, timeout=timeout
    )


@case("two", "High", "planted collect.journal.jsonl line (mark anywhere): collect kills nothing")
def r2_planted_boot_collect(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_planted_collect")
    out = folder / "out"
    out.mkdir()
    mark = str(ctx.work / "someone-else" / "run")
    victim = ctx.victim(mark)
    _plant_boot(out, "collect.journal.jsonl", victim, mark, chained=False)
    res = _collect(ctx, folder, out)
    time.sleep(0.5)
    check(victim.alive(), f"collect killed the victim group ({res.brief()})")
    check(res.rc == 0, f"collect did not complete: {res.brief()}")
    return "victim alive; collect rc=0"


def _refbox_attack(ctx: Ctx) -> Live:
    outside = ctx.work / "outside-refbox"
    outside.mkdir(exist_ok=True)
    return live_campaign(
        ctx, "refbox", card_text("advlive", hostile=False), admin_attack(outside, False)
    )


@case("two", "High", "admin reset/knobs during a run, from a local process without the token")
def r2_admin_without_token(ctx: Ctx) -> str | None:
    live = _refbox_attack(ctx)
    return judge_admin(live, ctx.work / "outside-refbox", str(ctx.work / "cases"))


class OwnRefbox:
    """A reference runtime started here with a token we chose (the server's own rules)."""

    def __init__(self, ctx: Ctx, name: str) -> None:
        self.folder = ctx.folder(name)
        self.dump_dir = self.folder / "dumps"
        self.dump_dir.mkdir()
        self.token = "adv-" + os.urandom(8).hex()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.bg = Bg(
            [
                *(str(HARNESS), "refbox", "serve", "--host", "127.0.0.1", "--port", str(port)),
                *("--layers", "2", "--experts", "8", "--hot-slots", "4", "--expert-bytes", "4096"),
                *("--cold-dir", str(self.folder), "--dump-dir", str(self.dump_dir)),
                *("--admin-token", self.token),
            ],
            self.folder,
            ctx.env,
        )
        if not wait_health(self.url, 60):
            self.close()
            raise RuntimeError("the reference runtime did not come up")

    def close(self) -> None:
        self.bg.kill(signal.SIGTERM)
        self.bg.finish(30)


@case("two", "Medium", "admin change posted as text/plain (what a web page can send)")
def r2_admin_text_plain(ctx: Ctx) -> str | None:
    server = OwnRefbox(ctx, "r2_admin_text_plain")
    try:
        body = b'{"drain_every": 5}'
        plain = http("POST", server.url + "/admin/knobs", body, "text/plain", server.token)
        form = http(
            "POST", server.url + "/admin/knobs", body, "application/x-www-form-urlencoded",
            server.token,
        )  # fmt: skip
        anonymous = http("POST", server.url + "/admin/knobs", body, "text/plain")
        good = http("POST", server.url + "/admin/knobs", body, "application/json", server.token)
    finally:
        server.close()
    check(good == 200, f"the positive control (JSON with the token) answered {good}")
    check(plain == 415, f"text/plain with the token answered {plain}")
    check(form == 415, f"a form post with the token answered {form}")
    check(anonymous in (401, 403, 415), f"text/plain without the token answered {anonymous}")
    live = _refbox_attack(ctx)
    for boot in live.boots:
        status = boot.get("POST /admin/knobs text/plain")
        check(status in (401, 403, 415), f"text/plain during a campaign answered {status}")
    return "415 with the token, 401 without"


@case("two", "High", "/admin/dump asked to write outside the run folder")
def r2_admin_dump_any_path(ctx: Ctx) -> str | None:
    server = OwnRefbox(ctx, "r2_admin_dump")
    outside = server.folder / "outside"
    outside.mkdir()
    link = server.dump_dir / "link"
    link.symlink_to(outside, target_is_directory=True)
    tries = {
        "absolute": str(outside / "a.json"),
        "dotdot": str(server.dump_dir / ".." / "outside" / "b.json"),
        "via link": str(link / "c.json"),
        "prefix": str(server.dump_dir) + "2/d.json",
    }
    try:
        answers = {
            k: http("POST", server.url + "/admin/dump", json.dumps({"path": p}).encode(),
                    token=server.token)
            for k, p in tries.items()
        }  # fmt: skip
        inside = json.dumps({"path": str(server.dump_dir / "ok.json")}).encode()
        good = http("POST", server.url + "/admin/dump", inside, token=server.token)
    finally:
        server.close()
    check(good == 200 and (server.dump_dir / "ok.json").is_file(), f"control dump: {good}")
    written = [p.name for p in outside.iterdir()]
    written += [p for p in ("d.json",) if Path(str(server.dump_dir) + "2", p).exists()]
    check(not written, f"dumps landed outside --dump-dir: {written} ({answers})")
    check(all(400 <= v < 500 for v in answers.values()), f"answers: {answers}")
    _refbox_attack(ctx)  # the same dump, during a campaign, without the token
    check(not list((ctx.work / "outside-refbox").iterdir()), "a live dump landed outside")
    return f"refused {sorted(answers.values())}; nothing outside"


def _negative(field_: str, value: Any, cells: tuple[str, ...] = ("cand",)) -> Mutate:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        if cell in cells and cycle == 1:
            block[field_] = value

    return mutate


@case("two", "High", "vLLM summary with a negative median TPOT")
def r2_import_negative_vllm(ctx: Ctx) -> str | None:
    return judge_import(ctx, "r2_neg_vllm", "vllm", _negative("median_tpot_ms", -10.0))


@case("two", "High", "SGLang summary with a negative output throughput and TPOT")
def r2_import_negative_sglang(ctx: Ctx) -> str | None:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        if cell == "cand" and cycle == 1:
            block["median_tpot_ms"] = -10.0
            block["output_throughput"] = -400.0

    return judge_import(ctx, "r2_neg_sglang", "sglang", mutate)


@case("two", "High", "ds4-bench CSV with a negative gen_tps")
def r2_import_negative_ds4(ctx: Ctx) -> str | None:
    return judge_import(ctx, "r2_neg_ds4", "ds4", _negative("gen_tps", -50.0))


@case("two", "High", "a block whose gated metric is unusable fails closed, not dropped")
def r2_import_unusable_block(ctx: Ctx) -> str | None:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        if cell == "ctl" and cycle == 1 and slot == 1:
            del block["median_tpot_ms"]  # decode_tok_s comes from it, summary-only

    return judge_import(ctx, "r2_unusable_block", "vllm", mutate)


@case("two", "High", "AIPerf: every request errored (error_request_count)")
def r2_import_aiperf_errors(ctx: Ctx) -> str | None:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        if cell == "cand":
            block["error_request_count"] = {"unit": "requests", "avg": 200}
            block["request_count"] = {"unit": "requests", "avg": 0}

    return judge_import(ctx, "r2_aiperf_errors", "aiperf", mutate)


@case("two", "High", "AIPerf: was_cancelled true")
def r2_import_aiperf_cancelled(ctx: Ctx) -> str | None:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        if cell == "cand" and cycle == 0:
            block["was_cancelled"] = True

    return judge_import(ctx, "r2_aiperf_cancelled", "aiperf", mutate)


@case("two", "High", "vLLM: `failed` requests ignored")
def r2_import_vllm_failed(ctx: Ctx) -> str | None:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        if cell == "cand":
            block["failed"] = 200
            block["completed"] = 0 if cycle == 0 else 100

    return judge_import(ctx, "r2_vllm_failed", "vllm", mutate)


@case("two", "High", "import -o through a symlink to a user's folder")
def r2_import_out_symlink(ctx: Ctx) -> str | None:
    import_control(ctx, "vllm")
    folder = ctx.folder("r2_import_out_symlink")
    files, mapping = import_fixture(folder / "in", "vllm")
    user = folder / "user"
    user.mkdir()
    # No plan.json: the folder is not a campaign, only not empty.
    keep = {"journal.jsonl": b"my notes\n", "notes.txt": b"mine\n", "card.yaml": b"x: 1\n"}
    for name, data in keep.items():
        (user / name).write_bytes(data)
    link = folder / "link"
    link.symlink_to(user, target_is_directory=True)
    direct = ctx.harness("import", "vllm", *files, "--map", mapping, "-o", user)
    linked = ctx.harness("import", "vllm", *files, "--map", mapping, "-o", link)
    file_link = folder / "file-link"
    file_link.symlink_to(user / "notes.txt")
    to_file = ctx.harness("import", "vllm", *files, "--map", mapping, "-o", file_link)
    now = {p.name: p.read_bytes() for p in user.iterdir()}
    check(now == keep, f"the user's folder changed: {sorted(now)}")
    for label, res in (("direct", direct), ("via link", linked), ("link to a file", to_file)):
        check(res.rc in (2, 3) and not res.crashed(), f"-o {label}: {res.brief()}")
    return f"refused: {linked.said(90)}"


def _window_one(ctx: Ctx, name: str) -> tuple[Path, str]:
    """The state a kill between a run's run.json and its run_done leaves: the journal ends
    before the last run_done, nothing later written, the store's later heads never kept."""
    root = ctx.copy(name)
    lines = jread(root)
    cut = max(i for i, ln in enumerate(lines) if ln.event["event"] == "run_done")
    run_id = str(lines[cut].event["run_id"])
    jwrite_raw(root, [ln.raw for ln in lines[:cut]])
    keep = {"card.yaml", "card.path", "plan.json", "quality.json", "journal.jsonl", ".lock"}
    keep |= {"inputs", "boxes", "runs", "box"}  # box/: the runs' scratch, there at a kill too
    for entry in root.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    store = heads_store(root)
    kept = [
        ln
        for ln in store.read_text().splitlines()
        if ln.strip() and json.loads(ln).get("events", 0) <= cut
    ]
    store.write_text("".join(k + "\n" for k in kept))
    for extra in store.parent.glob("*.parquet"):
        extra.unlink()
    check(run_json(root, run_id).get("status") == "ok", "setup: the cut run's run.json is not ok")
    return root, run_id


@case("two", "Medium", "killed between run.json and run_done: resume redoes it, gate accepts")
def r2_crash_window_run_done(ctx: Ctx) -> str | None:
    root, run_id = _window_one(ctx, "r2_window_one")
    before = ctx.gate(root)
    check(before.rc == 3 and "resume" in before.text, f"gate before resume: {before.brief()}")
    resumed = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=300)
    check(resumed.rc in (0, 1), f"resume: {resumed.brief()}")
    starts = [ln for ln in jread(root) if ln.event.get("run_id") == run_id]
    redone = sum(1 for ln in starts if ln.event["event"] == "run_start")
    check(redone >= 2, f"{run_id} was counted done, not redone")
    after = ctx.gate(root)
    check(after.rc in (0, 1), f"gate after the resume: {after.brief()}")
    again = ctx.gate(root)
    check(again.rc == after.rc, f"a second gate disagrees: {again.brief()}")
    return f"redone; gate rc={after.rc}"


def _kill_at_partial(ctx: Ctx, folder: Path, campaign: str) -> tuple[str, Path | None]:
    """Start `harness run` and SIGKILL it the moment its hidden .partial folder appears."""
    holder = ctx.bg_harness("run", "card.yaml", "--reports", "reports", "--quiet", cwd=folder)
    where = folder / "reports" / campaign
    partial = None
    while holder.running() and time.monotonic() - holder.start < 120:
        found = list(where.glob(".*.partial")) if where.is_dir() else []
        if found:
            partial = found[0]
            holder.kill()
            break
        time.sleep(0.002)
    res = holder.finish(60)
    return ("killed" if partial else f"never saw a .partial ({res.brief()})"), partial


def _start_then_stop(ctx: Ctx, folder: Path, campaign: str, seconds: float = 120) -> Res:
    """A new campaign start in the same reports folder, stopped (SIGTERM) once it has placed
    its directory: what the start did first (clean up) is what is looked at."""
    existing = {p.name for p in (folder / "reports" / campaign).iterdir()}
    holder = ctx.bg_harness("run", "card.yaml", "--reports", "reports", "--quiet", cwd=folder)
    while holder.running() and time.monotonic() - holder.start < seconds:
        now = {p.name for p in (folder / "reports" / campaign).iterdir()}
        if any(not n.startswith(".") for n in now - existing):
            time.sleep(0.3)
            break
        time.sleep(0.05)
    if holder.running():
        holder.kill(signal.SIGTERM)
    return holder.finish(90)


@case("two", "Medium", "killed before campaign_start: nothing a resume would run and gate refuse")
def r2_crash_window_campaign_start(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_window_two")
    write_pool(folder)
    (folder / "card.yaml").write_text(card_text("advkill", hostile=False))
    said, partial = _kill_at_partial(ctx, folder, "advkill")
    if partial is None:
        raise RuntimeError(said)
    where = folder / "reports" / "advkill"
    visible = [p for p in where.iterdir() if not p.name.startswith(".")]
    for found in visible:
        journal = found / "journal.jsonl"
        events = [ln.event["event"] for ln in jread(found)] if journal.is_file() else []
        check(bool(events) and events[0] == "campaign_start", f"{found.name}: no campaign_start")
    if visible:  # the kill landed after the rename: it must resume to a verdict
        res = ctx.harness("run", "--resume", visible[0], "--quiet", cwd=folder, timeout=300)
        check(res.rc in (0, 1), f"resume of the killed start: {res.brief()}")
        return f"killed after the rename; resumed rc={res.rc}"
    check(partial.exists(), "setup: the killed start left no .partial")
    _start_then_stop(ctx, folder, "advkill")
    check(not partial.exists(), f"the killed start's {partial.name} is still there")
    return f"only {partial.name} was left; the next start removed it"


def _grown_plan_state(ctx: Ctx, name: str) -> Path:
    """A copy in the state a kill between journalling an extension and renaming its plan
    leaves: the grown plan staged as .plan.json.next, campaign_extended journalled."""
    g = grown(ctx)
    if g.res.rc not in (0, 1):
        raise RuntimeError(f"the two-cycle resume did not finish: {g.res.brief()}")
    extended = [ln.event for ln in jread(g.root) if ln.event["event"] == "campaign_extended"]
    if not extended:
        raise RuntimeError("the two-cycle resume journalled no campaign_extended")
    root = ctx.copy(name)
    staged = root / ".plan.json.next"
    shutil.copyfile(g.root / "plan.json", staged)
    fields = {k: v for k, v in extended[-1].items() if k not in ("t", "prev", "schema_version")}
    fields["files"] = {"plan.json": sha_file(staged)}
    jappend(root, fields)
    return root


@case("two", "Medium", "killed between journalling an extension and renaming its plan")
def r2_crash_window_extension(ctx: Ctx) -> str | None:
    root = _grown_plan_state(ctx, "r2_window_extension")
    staged = sha_file(root / ".plan.json.next")
    gated = ctx.gate(root)
    check(gated.rc == 3, f"gate of the cut-off extension: {gated.brief()}")
    check("run --resume" in gated.text, f"gate gives no way on: {gated.said()}")
    resumed = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=400)
    check(resumed.rc in (0, 1), f"resume: {resumed.brief()}")
    check(sha_file(root / "plan.json") == staged, "plan.json is not the journalled grown plan")
    after = ctx.gate(root)
    check(after.rc in (0, 1), f"gate after the resume: {after.brief()}")
    return f"gate named the resume; resume finished it (rc={resumed.rc})"


def _resealed(ctx: Ctx, name: str, edit: Callable[[Path], None]) -> dict[str, Res]:
    """``edit`` applied to three copies, each re-sealed and re-chained; gated against the
    store's heads, against --journal-head HEAD with the store deleted, and with neither."""
    head = ctx.base().head
    out = {}
    for mode in ("store", "head", "neither"):
        root = ctx.copy(f"{name}-{mode}")
        edit(root)
        reseal(root)
        if mode != "store":
            heads_store(root).unlink()
        flags = ("--journal-head", head) if mode == "head" else ()
        out[mode] = ctx.gate(root, *flags)
    return out


def _judge_resealed(res: dict[str, Res], modes: tuple[str, ...]) -> str:
    for mode in modes:
        check(res[mode].rc == 3, f"re-sealed, gated with {mode}: {res[mode].brief()}")
        check(not res[mode].crashed(), f"{mode}: {res[mode].brief()}")
    return "; ".join(f"{m}: rc={r.rc}" for m, r in res.items())


@case("two", "High", "forged timings (÷7.8), re-sealed and re-chained: caught against kept heads")
def r2_resealed_timings(ctx: Ctx) -> str | None:
    res = _resealed(ctx, "r2_resealed_timings", _forge_speedup)
    note = _judge_resealed(res, ("store", "head"))
    neither = res["neither"]
    check("verified" not in neither.out or "itself only" in neither.out, "says verified")
    return note + " (neither: the threat model's remainder)"


def _rows_times_five(root: Path) -> None:
    """A candidate run's scored rows five times over, under new request ids."""
    import pandas as pd

    for run_id in run_ids(root):
        if run_json(root, run_id).get("cell") != "wide":
            continue
        run_dir = root / "runs" / run_id
        requests = pd.read_parquet(run_dir / "requests.parquet")
        chunks = pd.read_parquet(run_dir / "chunks.parquet")
        top = int(requests["request"].max()) + 1
        scored = requests[~requests["warmup"]]
        extra_r, extra_c = [requests], [chunks]
        for k in range(1, 5):
            moved = scored.copy()
            moved["request"] = moved["request"] + k * top
            extra_r.append(moved)
            more = chunks[chunks["request"].isin(scored["request"])].copy()
            more["request"] = more["request"] + k * top
            extra_c.append(more)
        pd.concat(extra_r).to_parquet(run_dir / "requests.parquet", index=False)
        pd.concat(extra_c).to_parquet(run_dir / "chunks.parquet", index=False)


@case("two", "High", "scored rows x5 under new ids, re-sealed: caught against kept heads")
def r2_resealed_rows_x5(ctx: Ctx) -> str | None:
    return _judge_resealed(_resealed(ctx, "r2_resealed_rows", _rows_times_five), ("store", "head"))


def _cut_gates(root: Path, manifest_too: bool = True) -> None:
    """The card's `better` gates cut (card.yaml is the frozen card); with ``manifest_too`` the
    frozen inputs' manifest made to agree, as a thorough adversary would."""
    card = root / "card.yaml"
    card.write_text("".join(ln for ln in card.read_text().splitlines(True) if "better" not in ln))
    if manifest_too:
        _rehash_manifest(root)


def _rehash_manifest(root: Path) -> None:
    """inputs/manifest.json's sha256 and bytes recomputed from each copy it lists."""
    path = root / "inputs" / "manifest.json"
    data = json.loads(path.read_text())
    for entry in data.get("files", []):
        copy = entry.get("copy")
        if isinstance(copy, str) and (root / copy).is_file():
            entry["sha256"] = sha_file(root / copy)
            entry["bytes"] = (root / copy).stat().st_size
    path.write_text(json.dumps(data, indent=2))


@case("two", "High", "the card's gates cut, re-sealed: caught with no head kept at all")
def r2_resealed_gates_cut(ctx: Ctx) -> str | None:
    res = _resealed(ctx, "r2_resealed_gates", _cut_gates)
    note = _judge_resealed(res, ("store", "head"))
    # With no head and no store, a manifest left as it was still gives the edit away (the card
    # is held to its frozen hash); one rewritten too is the threat model's stated remainder.
    partial = _resealed(ctx, "r2_resealed_gates-partial", lambda r: _cut_gates(r, False))
    left = partial["neither"]
    check(left.rc == 3, f"manifest left as it was, no head, no store: {left.brief()}")
    rest = res["neither"].rc
    return (
        note + f"; manifest left, neither: rc 3; manifest rewritten, neither: rc {rest} (remainder)"
    )


def _cycles_99(root: Path) -> None:
    plan = json.loads((root / "plan.json").read_text())
    plan["cycles"] = 99
    (root / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")


@case("two", "High", "plan.json cycles: 99, re-sealed: caught with no head kept at all")
def r2_resealed_cycles_99(ctx: Ctx) -> str | None:
    res = _resealed(ctx, "r2_resealed_cycles", _cycles_99)
    return _judge_resealed(res, ("store", "head", "neither"))


@case("two", "Medium", "a sequential look event rewritten (alpha_spent)")
def r2_look_rewritten(ctx: Ctx) -> str | None:
    seq = ctx.campaign_once(
        "sequential",
        card_text("advseq", hostile=False, design=", sequential: true, max_cycles: 1"),
    )
    if not any(ln.event["event"] == "look" for ln in jread(seq.root)):
        raise RuntimeError("the sequential campaign journalled no look")

    def edit(root: Path, rechain: bool) -> None:
        lines = jread(root)
        index = next(i for i, ln in enumerate(lines) if ln.event["event"] == "look")
        event = {**lines[index].event, "alpha_spent": 0.05, "nominal_alpha": 0.05}
        if rechain:
            events = [ln.event for ln in lines]
            events[index] = event
            jrechain(root, events)
        else:
            raws = [ln.raw for ln in lines]
            raws[index] = json.dumps(event).encode()
            jwrite_raw(root, raws)

    answers: dict[str, Res] = {}
    for mode in ("in place", "re-chained, store kept", "re-chained, --journal-head"):
        root = ctx.copy("r2_look-" + mode.split(",")[0].replace(" ", "_") + str(len(answers)), seq)
        edit(root, rechain=mode != "in place")
        flags: tuple[str, ...] = ()
        if mode.endswith("head"):
            heads_store(root).unlink()
            flags = ("--journal-head", seq.head)
        answers[mode] = ctx.gate(root, *flags)
    for mode, res in answers.items():
        check(res.rc == 3 and not res.crashed(), f"look {mode}: {res.brief()}")
    return "rc 3 " + ", ".join(answers)


@case("two", "Medium", "a sealed event naming a path outside the directory (hash oracle)")
def r2_sealed_outside_path(ctx: Ctx) -> str | None:
    secret = ctx.work / "secret.txt"
    secret.write_text("the secret\n")
    answers: dict[str, Res] = {}
    roots: dict[str, Path] = {}
    tries = {
        "absolute, right digest": (str(secret), sha_file(secret)),
        "absolute, wrong digest": (str(secret), "0" * 64),
        "dotdot": ("../../../../secret.txt", sha_file(secret)),
        "link out": ("leak", sha_file(secret)),
    }
    for label, (name, digest) in tries.items():
        root = ctx.copy("r2_oracle-" + label.replace(" ", "_").replace(",", ""))
        if name == "leak":
            (root / "leak").symlink_to(secret)
        jappend(root, {"event": "sealed", "files": {name: digest}})
        answers[label] = ctx.gate(root)
        roots[label] = root
    for label, res in answers.items():
        check(res.rc == 3 and not res.crashed(), f"{label}: {res.brief()}")
    right, wrong = (
        answers[k].err.replace(str(roots[k]), "ROOT")
        for k in ("absolute, right digest", "absolute, wrong digest")
    )
    check(right == wrong, "the answer differs with the digest: the verifier is an oracle")
    return answers["absolute, right digest"].said(100)


@case("two", "Medium", "`.lock` deleted while a harness holds the directory: gate refused")
def r2_lock_deleted(ctx: Ctx) -> str | None:
    g = grown(ctx)
    if not g.holder_seen:
        raise RuntimeError(f"never saw the holder take the lock: {g.res.brief()}")
    check(g.still_running_after_probes, "setup: the holder ended before the probes did")
    gated = g.probes["gate"]
    check(gated.rc == 3 and "another harness" in gated.text, f"gate: {gated.brief()}")
    resumed = g.probes["resume"]
    check(resumed.rc == 3 and "another harness" in resumed.text, f"resume: {resumed.brief()}")
    check(g.res.rc in (0, 1), f"the holder itself: {g.res.brief()}")
    check(g.after is not None and g.after.rc in (0, 1), "the grown campaign does not gate")
    assert g.after is not None
    check("twice" not in g.after.text, f"after: {g.after.said()}")
    return "gate and a second resume refused while held; the holder's campaign gates"


@case("two", "Medium", "`harness report` while another harness holds the directory")
def r2_report_locked(ctx: Ctx) -> str | None:
    g = grown(ctx)
    if not g.holder_seen:
        raise RuntimeError(f"never saw the holder take the lock: {g.res.brief()}")
    check(g.still_running_after_probes, "setup: the holder ended before the probes did")
    res = g.probes["report"]
    check(res.rc == 3 and "another harness" in res.text, f"report: {res.brief()}")
    return res.said(100)


@case("three", "Medium", "`harness analyze` while another harness holds the directory", added=True)
def added_analyze_locked(ctx: Ctx) -> str | None:
    g = grown(ctx)
    if not g.holder_seen:
        raise RuntimeError(f"never saw the holder take the lock: {g.res.brief()}")
    check(g.still_running_after_probes, "setup: the holder ended before the probes did")
    res = g.probes["analyze"]
    check(res.rc == 3 and "another harness" in res.text, f"analyze: {res.brief()}")
    return res.said(100)


@case("two", "Medium", "a failed verification rewrites verdict.json/JUnit as failing")
def r2_failed_verification_rewrites_verdict(ctx: Ctx) -> str | None:
    # An import that PASSes, then one of its records edited: the old verdict was a PASS.
    import_control(ctx, "vllm")
    _, gated, out = import_and_gate(ctx, "r2_failed_verification", "vllm")
    check(gated is not None and gated.rc == 0, "setup: the import did not PASS")
    before = json.loads((out / "verdict.json").read_text())
    check(before.get("passed") is True, "setup: verdict.json is not a PASS")
    victim = sorted(p for p in (out / "runs").rglob("*") if p.is_file())[0]
    victim.write_bytes(victim.read_bytes() + b" ")
    res = ctx.gate(out)
    check(res.rc == 3, f"gate of the edited import: {res.brief()}")
    after = json.loads((out / "verdict.json").read_text())
    check(after.get("passed") is False, f"verdict.json still passed={after.get('passed')}")
    junit = (out / "verdict.junit.xml").read_text()
    check("<failure" in junit or "<error" in junit, "JUnit holds no failure")
    return f"rc 3; verdict.json passed=false; {res.said(70)}"


@case("two", "Medium", "`run --resume` verifies before it boots anything")
def r2_resume_verifies_first(ctx: Ctx) -> str | None:
    root, cut = _window_one(ctx, "r2_resume_verifies_first")
    other = next(r for r in run_ids(root) if r != cut)
    counters = root / "runs" / other / "counters.json"
    counters.write_text(counters.read_text().replace("{", "{ ", 1))
    journal = (root / "journal.jsonl").read_bytes()
    res = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=120)
    check(res.rc == 3, f"resume of an edited directory: {res.brief()}")
    check("counters.json" in res.text, f"the file is not named: {res.said()}")
    check((root / "journal.jsonl").read_bytes() == journal, "the journal changed (it booted)")
    return f"rc 3 in {res.secs:.1f}s, journal untouched"


MISTYPED: dict[str, dict[str, Any]] = {
    "run_done run_id 7": {"event": "run_done", "run_id": 7, "files": {}},
    "boot pgid 'abc'": {"event": "boot", "run_id": "x", "pgid": "abc", "identity": 5},
    "campaign_extended to 'abc'": {"event": "campaign_extended", "to": "abc", "files": []},
    "look of strings": {"event": "look", "look": "x", "alpha_spent": "y", "cycles": "z"},
    "sealed files a string": {"event": "sealed", "files": "verdict.json"},
    "sealed digest a number": {"event": "sealed", "files": {"verdict.json": 5}},
    "run_start attempt a list": {"event": "run_start", "run_id": [1], "attempt": [2]},
    "campaign_end done a dict": {"event": "campaign_end", "done": {}, "failed": None},
}


def _mistyped(ctx: Ctx, name: str, command: str) -> str:
    results: list[str] = []
    for label, event in MISTYPED.items():
        root = ctx.copy(f"{name}-{len(results)}")
        jappend(root, event)
        if command == "gate":
            res = ctx.gate(root)
        else:
            res = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=300)
        check(not res.timed_out, f"{label}: hung")
        check(not res.crashed(), f"{label}: {res.brief()}")
        base_rc = ctx.base().rc
        check(res.rc in (2, 3, base_rc), f"{label}: rc={res.rc}: {res.said()}")
        results.append(f"{label}={res.rc}")
    return ", ".join(results)


@case("two", "Medium", "mistyped journal events (chained) gated: no traceback, no exit 1")
def r2_mistyped_events_gate(ctx: Ctx) -> str | None:
    return _mistyped(ctx, "r2_mistyped_gate", "gate")


@case("two", "Medium", "mistyped journal events (chained) resumed: no traceback", added=True)
def added_mistyped_events_resume(ctx: Ctx) -> str | None:
    return _mistyped(ctx, "added_mistyped_resume", "resume")


def _vllm_detailed(lens: list[Any]) -> dict[str, Any]:
    n = len(lens)
    return {
        "duration": 10.0,
        "completed": n,
        "failed": 0,
        "median_tpot_ms": 20.0,
        "ttfts": [0.05] * n,
        "itls": [[0.02, 0.02]] * n,
        "output_lens": lens,
        "input_lens": [10] * n,
        "generated_texts": ["ok"] * n,
        "errors": [""] * n,
    }


@case("two", "Medium", "vLLM detailed result with output_lens 1e308")
def r2_vllm_output_lens_huge(ctx: Ctx) -> str | None:
    def mutate(cell: str, cycle: int, slot: int, block: dict[str, Any]) -> None:
        block.update(_vllm_detailed([3, 3, 3]))
        if cell == "cand" and cycle == 2:
            block["output_lens"] = [1e308, 3, 3]

    folder = ctx.folder("r2_output_lens")
    files, mapping = import_fixture(folder / "in", "vllm", mutate)
    res = ctx.harness("import", "vllm", *files, "--map", mapping, "-o", folder / "out", mem=4)
    check(res.rc == 2 and not res.crashed(), f"import: {res.brief()}")
    return res.said(100)


def _fit_map(ctx: Ctx, name: str, source: Path, *extra: str) -> Res:
    out = source.parent / f"{name}-map.json"
    return ctx.harness("fit-map", source, "--top", "1", "-o", out, *extra, timeout=60, mem=4)


@case("two", "Medium", "a routing .npy whose header declares 16 TiB")
def r2_npy_header_16tib(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_npy_16tib")
    path = folder / "trace.npy"
    path.write_bytes(npy_bytes("<i4", (2**40, 2, 2), b"\0" * 64))
    res = _fit_map(ctx, "r2", path)
    check(res.rc == 2 and not res.crashed(), f"fit-map: {res.brief()}")
    check("trace.npy" in res.text, f"the file is not named: {res.said()}")
    return res.said(100)


@case("two", "Medium", "route ids of 2^63 in a routing .npy")
def r2_route_ids_2_63(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_route_ids")
    path = folder / "trace.npy"
    values = [2**63] + [1] * 15
    path.write_bytes(npy_bytes("<u8", (4, 2, 2), struct.pack("<16Q", *values)))
    res = _fit_map(ctx, "r2", path)
    check(res.rc == 2 and not res.crashed(), f"fit-map: {res.brief()}")
    return res.said(100)


@case("two", "Medium", "routes with no --experts: memory sized by the largest id")
def r2_routes_sized_by_largest_id(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_route_width")
    path = folder / "trace.npy"
    values = [2**31 - 1] + [1] * 15
    path.write_bytes(npy_bytes("<i4", (4, 2, 2), struct.pack("<16i", *values)))
    res = _fit_map(ctx, "r2", path)
    check(res.rc == 2 and not res.crashed(), f"fit-map: {res.brief()}")
    check(res.secs < 30, f"took {res.secs:.0f}s")
    return res.said(100)


@case("two", "Medium", "a history store file without `value`")
def r2_history_without_value(ctx: Ctx) -> str | None:
    import pandas as pd

    root = ctx.copy("r2_history_value")
    reports = root.parent.parent
    stores = sorted((reports / "history").glob("*.parquet"))
    if not stores:
        raise RuntimeError("the base campaign left no history parquet")
    frame = pd.read_parquet(stores[0])
    frame.drop(columns=["value"]).to_parquet(stores[0], index=False)
    res = ctx.harness("history", "--reports", reports, timeout=60)
    check(res.rc in (2, 3) and not res.crashed(), f"history: {res.brief()}")
    check(stores[0].name in res.text, f"the file is not named: {res.said()}")
    return res.said(100)


def _redos(ctx: Ctx, name: str, pattern: str, value: str) -> Res:
    """Validate a card whose runtime's knob has ``pattern`` and whose cell sets ``value``."""
    folder = ctx.folder(name)
    write_pool(folder)
    (folder / "runtimes").mkdir()
    profile = (ROOT / "harness" / "profiles" / "data" / "runtimes" / "refbox.yaml").read_text()
    profile = profile.replace("name: refbox\n", "name: evil\n", 1)
    quoted = pattern.replace("'", "''")
    profile += f"  evil:\n    env: REFBOX_EVIL\n    pattern: '{quoted}'\n    help: x\n"
    (folder / "runtimes" / "evil.yaml").write_text(profile)
    text = card_text("advredos", "evil", hostile=False, extra_knob=f", evil: '{value}'")
    (folder / "card.yaml").write_text(text)
    return ctx.harness("validate", "card.yaml", cwd=folder, timeout=20)


def _judge_redos(ctx: Ctx, name: str, pattern: str, value: str) -> str:
    control = _redos(ctx, name + "-control", "[0-9]+", value)
    if control.rc != 0:
        raise RuntimeError(f"the card with a harmless pattern does not validate: {control.brief()}")
    res = _redos(ctx, name, pattern, value)
    check(not res.timed_out, f"validate hung on {pattern!r} (killed at 20 s)")
    check(res.rc == 2 and not res.crashed(), f"{pattern!r}: {res.brief()}")
    return f"refused in {res.secs:.1f}s"


@case("two", "Medium", "ReDoS: `(1|1)*2` as a knob pattern")
def r2_redos_choice(ctx: Ctx) -> str | None:
    return _judge_redos(ctx, "r2_redos", "(1|1)*2", "1" * 40)


@case("two", "Low", "a .pt count file holding NaN or negative counts")
def r2_pt_nan_negative(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_pt_counts")
    answers = {}
    for label, tensor in (
        ("nan", double_tensor([float("nan"), 3.0, 2.0, 1.0], (1, 4))),
        ("negative", long_tensor([-5, 3, 2, 1], (1, 4))),
        ("negative 3-d", long_tensor([-(2**40), 3, 2, 1, 1, 1, 1, 1], (2, 1, 4))),
    ):
        path = folder / f"{label.replace(' ', '-')}.pt"
        write_pt(path, {"logical_count": tensor})
        answers[label] = _fit_map(ctx, label, path)
    for label, res in answers.items():
        check(res.rc == 2 and not res.crashed(), f"{label}: {res.brief()}")
    return answers["nan"].said(100)


@case("two", "Low", "a .pt whose expanded tensors would fill memory")
def r2_pt_total_allocation(ctx: Ctx) -> str | None:
    folder = ctx.folder("r2_pt_budget")
    path = folder / "expanded.pt"
    # 64 views of 2^24 int64 each over one element: 8 GiB if each were materialised.
    one = Tensor("LongStorage", struct.pack("<q", 7), 1, (2**24,), (0,))
    junk = [Tensor(one.storage, one.data, 1, one.size, one.stride) for _ in range(64)]
    write_pt(path, {"logical_count": long_tensor([5, 3, 2, 1], (1, 4)), "junk": junk})
    res = _fit_map(ctx, "r2", path)
    check(not res.timed_out, "fit-map hung")
    check(res.rc == 2 and not res.crashed(), f"fit-map: {res.brief()}")
    return res.said(100)


def _outputs(ctx: Ctx) -> dict[str, str]:
    """The base campaign's outputs (gated again on a copy for the terminal table)."""
    root = ctx.copy("outputs")
    gated = ctx.gate(root)
    report = ctx.harness("report", root, timeout=120)
    return {
        "gate terminal": gated.out,
        "report terminal": report.out,
        "record.md": (root / "record.md").read_text(errors="replace"),
        "report.html": (root / "report.html").read_text(errors="replace"),
        "verdict.junit.xml": (root / "verdict.junit.xml").read_text(errors="replace"),
    }


def _find(texts: dict[str, str], bad: dict[str, str]) -> list[str]:
    found = []
    for where, text in texts.items():
        for char, label in bad.items():
            if char in text:
                found.append(f"{label} in {where}")
    return found


@case("two", "Low", "ESC/OSC/BEL/C1 and bidi overrides from the card in every output")
def r2_control_chars_in_outputs(ctx: Ctx) -> str | None:
    texts = _outputs(ctx)
    check("adv" in texts["record.md"], "setup: record.md does not hold the card's description")
    found = _find(texts, {**CONTROL_CHARS, **BIDI})
    check(not found, ", ".join(found[:4]))
    return "none in the terminal, record.md, report.html, JUnit"


def _small_tmpfs(ctx: Ctx, name: str, size: str) -> Path:
    mount = ctx.folder(name) / "fs"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if made.returncode != 0:
        raise Skipped(f"cannot mount a small tmpfs here ({made.stderr.strip()[:80]})")
    return mount


def _unmount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)


def _plant_links(folder: Path, names: list[str], victim: Path) -> list[Path]:
    """Symlinks to ``victim`` at every name a careless writer might open."""
    planted = []
    for name in names:
        for candidate in (name, f".{name}.tmp", f"{name}.tmp", f".{name}.partial", f"{name}.part"):
            path = folder / candidate
            if not path.exists() and not path.is_symlink():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(victim)
                planted.append(path)
    return planted


@case("two", "High", "make-ds4-model with links planted at its temp names")
def r2_make_ds4_model_links(ctx: Ctx) -> str | None:
    mount = _small_tmpfs(ctx, "r2_ds4_links", "64m")
    try:
        victim = ctx.work / "victim-ds4.txt"
        victim.write_text("precious\n")
        _plant_links(mount, ["model.gguf"], victim)
        (mount / "model.gguf").unlink()  # the target itself absent, so it is written
        res = ctx.harness("make-ds4-model", "-o", mount / "model.gguf", timeout=300)
        check(victim.read_text() == "precious\n", f"the victim was written through ({res.brief()})")
        check(not res.crashed(), f"make-ds4-model: {res.brief()}")
        return f"victim untouched; rc={res.rc} ({res.said(60)})"
    finally:
        _unmount(mount)


@case("two", "Low", "make-ds4-model on a full disk leaves nothing behind")
def r2_make_ds4_model_full_disk(ctx: Ctx) -> str | None:
    mount = _small_tmpfs(ctx, "r2_ds4_full", "32m")
    try:
        res = ctx.harness("make-ds4-model", "-o", mount / "model.gguf", timeout=300)
        left = [p.name for p in mount.iterdir()]
        check(res.rc == 3 and not res.crashed(), f"make-ds4-model on 32 MiB: {res.brief()}")
        check(not left, f"left behind: {left}")
        return res.said(100)
    finally:
        _unmount(mount)


# == round three (issue 57) ======================================================================


def _extend_with_copies(root: Path, grown_root: Path) -> int:
    """Grow a copy to the grown campaign's plan with copies of its own cycle-0 runs: a
    campaign_extended, then run_start/run_done per new run, chained as the harness does."""
    plan = json.loads((grown_root / "plan.json").read_text())
    done = set(run_ids(root))
    by_cell = {run_json(root, r)["cell"]: r for r in sorted(done)}
    shutil.copyfile(grown_root / "plan.json", root / "plan.json")
    jappend(
        root,
        {
            "event": "campaign_extended",
            "from": 1,
            "to": plan["cycles"],
            "runs_before": len(done),
            "runs_after": len(plan["runs"]),
            "files": {"plan.json": sha_file(root / "plan.json")},
        },
    )
    added = 0
    for run in plan["runs"]:
        if run["run_id"] in done:
            continue
        source = root / "runs" / by_cell[run["cell"]]
        target = root / "runs" / run["run_id"]
        shutil.copytree(source, target)
        record = json.loads((target / "run.json").read_text())
        for key in ("run_id", "cell", "cycle", "slot", "repeat", "cache_state"):
            if key in run:
                record[key] = run[key]
        record["boot_id"] = f"{run['run_id']}-a1"
        (target / "run.json").write_text(json.dumps(record, indent=2))
        jappend(root, {"event": "run_start", "run_id": run["run_id"], "attempt": 1})
        jappend(root, {"event": "run_done", "run_id": run["run_id"], "files": run_files(target)})
        added += 1
    return added


@case("three", "High", "runs and a cycle appended after a kept head: gate --journal-head refuses")
def r3_appended_after_head(ctx: Ctx) -> str | None:
    g = grown(ctx)
    if g.res.rc not in (0, 1):
        raise RuntimeError(f"the two-cycle resume did not finish: {g.res.brief()}")
    root = ctx.copy("r3_appended")
    added = _extend_with_copies(root, g.root)
    res = ctx.gate(root, "--journal-head", ctx.base().head)
    check(res.rc == 3, f"{added} copied runs after the kept head: {res.brief()}")
    check("follow" in res.text, f"the refusal does not say lines follow: {res.said()}")
    control = ctx.copy("r3_appended-nohead")
    _extend_with_copies(control, g.root)
    said = ctx.gate(control)
    note = f"without a head rc={said.rc}"
    if said.rc != 3:
        check("itself only" in said.out, "without a head the forged extension is not qualified")
        verdict = json.loads((control / "verdict.json").read_text())
        check(verdict.get("verified") is False, "without a head verdict.json says verified")
        note += " (said: verified against itself only)"
    return f"rc 3 naming what follows; {note}"


@case("three", "High", "card's better gates deleted and re-sealed by a later `sealed` event")
def r3_reseal_card_after_start(ctx: Ctx) -> str | None:
    answers = {}
    for mode in ("head", "nohead"):
        root = ctx.copy(f"r3_reseal_card-{mode}")
        _cut_gates(root)  # and the manifest made to agree: only the re-seal rule is left
        files = {n: sha_file(root / n) for n in ("card.yaml", "inputs/manifest.json")}
        jappend(root, {"event": "sealed", "files": files})
        flags = ("--journal-head", ctx.base().head) if mode == "head" else ()
        answers[mode] = ctx.gate(root, *flags)
    for mode, res in answers.items():
        check(res.rc == 3 and not res.crashed(), f"{mode}: {res.brief()}")
    return answers["nohead"].said(100)


GATE_RECORDS = ["verdict.json", "verdict.junit.xml", "record.md", "report.html"]


def _judge_links(victim: Path, folder: Path, names: list[str], res: Res, want_rc: int) -> str:
    check(victim.read_text() == "precious\n", f"the victim was written through ({res.brief()})")
    check(not res.crashed(), res.brief())
    check(res.rc == want_rc, f"rc={res.rc}, {want_rc} without the links: {res.said()}")
    for name in names:
        path = folder / name
        check(not path.is_symlink(), f"{name} is left a link to the victim")
    return f"victim untouched; rc={res.rc}"


@case("three", "High", "`gate` with links planted at its records' temp names")
def r3_gate_temp_links(ctx: Ctx) -> str | None:
    root = ctx.copy("r3_gate_links")
    victim = ctx.work / "victim-gate.txt"
    victim.write_text("precious\n")
    for name in GATE_RECORDS:
        for candidate in (f".{name}.tmp", f"{name}.tmp", f".{name}.partial"):
            (root / candidate).symlink_to(victim)
    res = ctx.gate(root)
    return _judge_links(victim, root, GATE_RECORDS, res, ctx.base().rc)


@case("three", "High", "`report` with links planted at its outputs' temp names")
def r3_report_temp_links(ctx: Ctx) -> str | None:
    root = ctx.copy("r3_report_links")
    victim = ctx.work / "victim-report.txt"
    victim.write_text("precious\n")
    names = ["record.md", "report.html"]
    for name in names:
        for candidate in (f".{name}.tmp", f"{name}.tmp", f".{name}.partial"):
            (root / candidate).symlink_to(victim)
    figures = root / "figures"
    if figures.is_dir():
        for png in list(figures.glob("*.png"))[:3]:
            (figures / f".{png.name}.tmp").symlink_to(victim)
    res = ctx.harness("report", root, timeout=180)
    return _judge_links(victim, root, names, res, 0)


@case("three", "High", "`make-vllm-model` into a folder with links planted at its file names")
def r3_make_vllm_model_links(ctx: Ctx) -> str | None:
    folder = ctx.folder("r3_vllm_links")
    out = folder / "model"
    out.mkdir()
    victim = ctx.work / "victim-vllm.txt"
    victim.write_text("precious\n")
    names = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    names.append("generation_config.json")
    _plant_links(out, names, victim)
    shape = ("--layers", "2", "--experts", "4", "--experts-used", "2")
    clean = ctx.harness("make-vllm-model", "-o", folder / "clean", *shape, timeout=300)
    if clean.rc != 0:
        raise Skipped(f"make-vllm-model does not run here: {clean.brief()}")
    res = ctx.harness("make-vllm-model", "-o", out, *shape, timeout=300)
    check(victim.read_text() == "precious\n", f"the victim was written through ({res.brief()})")
    check(not res.crashed(), res.brief())
    if res.rc == 0:
        for name in names:
            check(not (out / name).is_symlink(), f"{name} is left a link to the victim")
    return f"victim untouched; rc={res.rc}"


@case("three", "High", "`collect -o` with links planted at its counts and route trace")
def r3_collect_output_links(ctx: Ctx) -> str | None:
    folder = ctx.folder("r3_collect_links")
    out = folder / "out"
    out.mkdir()
    victim = ctx.work / "victim-collect.txt"
    victim.write_text("precious\n")
    names = ["counts.json", "route-trace.jsonl", "route-trace.npz"]
    _plant_links(out, names, victim)
    for name in names:  # the targets themselves absent: they are written
        (out / name).unlink()
    res = _collect(ctx, folder, out)
    check(victim.read_text() == "precious\n", f"the victim was written through ({res.brief()})")
    check(res.rc in (0, 2, 3) and not res.crashed(), f"collect: {res.brief()}")
    if res.rc == 0:
        left = [n for n in names if (out / n).is_symlink()]
        check(not left, f"{left} left links to the victim")
    return f"victim untouched; collect rc={res.rc}"


@case("three", "High", "`fit-map -o` / `fit-cost -o` naming a symlink to a user's file", added=True)
def added_output_file_links(ctx: Ctx) -> str | None:
    folder = ctx.folder("added_output_links")
    victim = ctx.work / "victim-fit.txt"
    victim.write_text("precious\n")
    counts = folder / "counts.json"
    counts.write_text(json.dumps({"logical_count": [[50, 9, 3, 1], [2, 40, 7, 1]]}))
    link = folder / "map.json"
    link.symlink_to(victim)
    fitted = ctx.harness("fit-map", counts, "--top", "1", "-o", link, timeout=60)
    check(victim.read_text() == "precious\n", f"fit-map wrote through -o ({fitted.brief()})")
    check(fitted.rc in (0, 2, 3) and not fitted.crashed(), f"fit-map: {fitted.brief()}")
    root = ctx.copy("added_output_links-cost")
    cost = folder / "cost.json"
    cost.symlink_to(victim)
    costed = ctx.harness("fit-cost", "--per-run", root, "-o", cost, timeout=300)
    check(victim.read_text() == "precious\n", f"fit-cost wrote through -o ({costed.brief()})")
    check(not costed.crashed(), f"fit-cost: {costed.brief()}")
    return f"victim untouched; fit-map rc={fitted.rc}, fit-cost rc={costed.rc}"


def _sglang_attack(ctx: Ctx) -> Live:
    outside = ctx.work / "outside-sglang"
    outside.mkdir(exist_ok=True)
    text = card_text("advsgl", "refbox-sglang", hostile=False, better_gates=False)
    return live_campaign(ctx, "sglang", text, admin_attack(outside, True))


@case("three", "High", "`refbox-sglang` runtime: admin and recorder routes without the token")
def r3_refbox_sglang_admin(ctx: Ctx) -> str | None:
    live = _sglang_attack(ctx)
    return judge_admin(live, ctx.work / "outside-sglang", str(ctx.work / "cases"))


@case("three", "High", "`collect`: a mark of another collection's folder in TMPDIR kills nothing")
def r3_collect_foreign_collection(ctx: Ctx) -> str | None:
    folder = ctx.folder("r3_collect_mark")
    out = folder / "out"
    out.mkdir()
    other = Path(tempfile.mkdtemp(prefix="harness-collect-0123456789abcdef-", dir=ctx.tmp))
    victim = ctx.victim(str(other))
    _plant_boot(out, "collect.journal.jsonl", victim, str(other), chained=False)
    # ... and one line naming only the mark (a boot killed before its group was journalled)
    with (out / "collect.journal.jsonl").open("a") as handle:
        handle.write(json.dumps({"event": "boot_starting", "run_id": "z", "box": "local",
                                 "mark": str(other)}) + "\n")  # fmt: skip
    res = _collect(ctx, folder, out)
    time.sleep(0.5)
    check(victim.alive(), f"collect killed another collection's group ({res.brief()})")
    check(res.rc == 0, f"collect: {res.brief()}")
    killed = (out / "collect.journal.jsonl").read_text().count("orphan_killed")
    check(killed == 0, f"{killed} orphan_killed journalled")
    return "victim alive; collect rc=0"


@case("three", "Medium", "ReDoS: nested bounded repeats `(1{1,30}){1,30}2`")
def r3_redos_nested_bounded(ctx: Ctx) -> str | None:
    return _judge_redos(ctx, "r3_redos_nested", "(1{1,30}){1,30}2", "1" * 40)


@case("three", "Medium", "ReDoS: a chain of like repeats `1*1*…1*2`")
def r3_redos_chain(ctx: Ctx) -> str | None:
    return _judge_redos(ctx, "r3_redos_chain", "1*" * 12 + "2", "1" * 40)


@case("three", "Medium", "ReDoS: a bounded repeat of an optional `(1?){38}1{38}`")
def r3_redos_optional(ctx: Ctx) -> str | None:
    return _judge_redos(ctx, "r3_redos_optional", "(1?){38}1{38}", "1" * 38)


@case("three", "Medium", "ReDoS: a lazy choice of one and two `(?:1|11)+?2`")
def r3_redos_lazy_choice(ctx: Ctx) -> str | None:
    return _judge_redos(ctx, "r3_redos_lazy", "(?:1|11)+?2", "1" * 40)


@case("three", "Medium", "ReDoS: more shapes (nested, overlapping, polynomial)", added=True)
def added_redos_shapes(ctx: Ctx) -> str | None:
    shapes = [
        "(1+)+2",
        "(1*)*2",
        "(1|11)*2",
        "(1|1?)+2",
        "((1+)|(1))+2",
        "(?:1{2,}){2,}2",
        "(1?){25}1{25}",
        "(?:1+1+)+2",
        "(.*1){12}2",
        "(?:(?:1|1)|1)*2",
        "(1+?)+?2",
        "1*1*1*1*1*1*1*1*1*1*1*1*1*1*2",
    ]
    slow = []
    for i, pattern in enumerate(shapes):
        res = _redos(ctx, f"added_redos-{i}", pattern, "1" * 40)
        if res.timed_out or res.crashed() or res.rc not in (0, 2):
            slow.append(f"{pattern} ({res.brief()})")
    check(not slow, "; ".join(slow[:3]))
    return f"{len(shapes)} shapes, none hung"


@case("three", "Medium", "ReDoS through an import mapping's file pattern", added=True)
def added_redos_import_pattern(ctx: Ctx) -> str | None:
    folder = ctx.folder("added_redos_import")
    files, mapping = import_fixture(folder / "in", "vllm")
    evil = folder / "in" / ("1" * 40 + ".json")
    shutil.copyfile(files[0], evil)
    text = mapping.read_text().split("files:")[0]
    pattern = r"(1{1,30}){1,30}2(?P<cell>ctl|cand)-c(?P<cycle>\d)-s(?P<slot>\d)\.json"
    text += f"pattern: '{pattern}'\ngates: [{{kind: better, metric: decode_tok_s}}]\n"
    mapping.write_text(text)
    res = ctx.harness("import", "vllm", evil, *files, "--map", mapping, "-o", folder / "o",
                      timeout=20)  # fmt: skip
    check(not res.timed_out, "import hung on the mapping's pattern")
    check(res.rc == 2 and not res.crashed(), f"import: {res.brief()}")
    return res.said(100)


@case("three", "Medium", "ReDoS through guards.competing_extra", added=True)
def added_redos_guards(ctx: Ctx) -> str | None:
    folder = ctx.folder("added_redos_guards")
    write_pool(folder)
    text = card_text("advguard", hostile=False) + 'guards: {competing_extra: ["(1|1)*2"]}\n'
    (folder / "card.yaml").write_text(text)
    res = ctx.harness("validate", "card.yaml", cwd=folder, timeout=20)
    check(res.rc == 2 and not res.crashed(), f"validate: {res.brief()}")
    return res.said(100)


@case("three", "Medium", "a FIFO in place of the heads store: gate neither hangs nor skips it")
def r3_fifo_heads_store(ctx: Ctx) -> str | None:
    root = ctx.copy("r3_fifo")
    store = heads_store(root)
    store.unlink()
    os.mkfifo(store)
    res = ctx.gate(root, timeout=30)
    check(not res.timed_out, "gate hung on the FIFO (killed at 30 s)")
    check(res.rc == 3 and "FIFO" in res.text, f"gate: {res.brief()}")
    resumed = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=30)
    check(not resumed.timed_out, "run --resume hung on the FIFO (killed at 30 s)")
    check(resumed.rc == 3, f"run --resume: {resumed.brief()}")
    return res.said(100)


@case("three", "Medium", "a symlink in place of the heads store", added=True)
def added_symlink_heads_store(ctx: Ctx) -> str | None:
    root = ctx.copy("added_link_store")
    store = heads_store(root)
    elsewhere = ctx.work / "elsewhere-heads.jsonl"
    elsewhere.write_text("")  # an empty store elsewhere: the rewrite would go unseen
    store.unlink()
    store.symlink_to(elsewhere)
    lines = jread(root)
    events = [ln.event for ln in lines]
    events[1] = {**events[1], "t": events[1]["t"] + 1}
    jrechain(root, events)
    res = ctx.gate(root, timeout=60)
    check(res.rc == 3 and not res.crashed(), f"gate: {res.brief()}")
    return res.said(100)


@case("three", "Medium", "`fit-cost` on a seal-stripped, tampered directory")
def r3_fit_cost_unsealed(ctx: Ctx) -> str | None:
    clean = ctx.copy("r3_fit_cost-clean")
    # --per-run: the ring fit needs more than four tiny runs; the seal check comes first anyway
    control = ctx.harness(
        "fit-cost", "--per-run", clean, "-o", clean.parent / "cost.json", timeout=300
    )
    root = ctx.copy("r3_fit_cost")
    _forge_speedup(root)
    _strip_seal(root)
    refused = ctx.harness(
        "fit-cost", "--per-run", root, "-o", root.parent / "cost.json", timeout=300
    )
    check(refused.rc == 3, f"fit-cost without --allow-unsealed: {refused.brief()}")
    check("--allow-unsealed" in refused.text, f"no way on given: {refused.said()}")
    check(not (root.parent / "cost.json").exists(), "cost.json was written anyway")
    allowed = ctx.harness(
        "fit-cost",
        "--per-run",
        root,
        "--allow-unsealed",
        "-o",
        root.parent / "cost.json",
        timeout=300,
    )
    if control.rc == 0:
        check(allowed.rc == 0, f"--allow-unsealed: {allowed.brief()}")
        cost = (root.parent / "cost.json").read_text()
        check("unverified" in cost, "cost.json does not name its source unverified")
        return "refused; with --allow-unsealed cost.json says unverified"
    return f"refused (fit on the clean copy: rc={control.rc}, so the allowed path is not judged)"


@case("three", "Medium", "`verified: true` only when a kept head was checked")
def r3_verified_without_head(ctx: Ctx) -> str | None:
    base = ctx.base()
    moved = ctx.folder("r3_verified") / "moved"
    shutil.copytree(base.root, moved, symlinks=True)  # outside reports/: no store
    _forge_speedup(moved)
    reseal(moved)
    res = ctx.gate(moved)
    check(res.rc is not None and not res.crashed(), f"gate: {res.brief()}")
    verdict = json.loads((moved / "verdict.json").read_text())
    check(verdict.get("verified") is False, f"verified={verdict.get('verified')} with no head")
    check("itself only" in res.out, "the terminal does not say verified against itself only")
    junit = (moved / "verdict.junit.xml").read_text()
    check("itself only" in junit, "JUnit does not say verified against itself only")
    good = ctx.copy("r3_verified-head")
    with_head = ctx.gate(good, "--journal-head", base.head)
    checked = json.loads((good / "verdict.json").read_text())
    note = f"moved+rewritten: rc={res.rc}, verified=false"
    if checked.get("verified") is not True or checked.get("head_checked") != base.head:
        note += f"; NOTE with the right head verified={checked.get('verified')}"
    return note + f"; with the head rc={with_head.rc}"


@case("three", "Low", "record.md and report.html say 'verified against itself only'", added=True)
def added_self_only_in_record(ctx: Ctx) -> str | None:
    # The README: "without one every output says 'verified against itself only'".
    root = ctx.copy("added_self_only")
    res = ctx.gate(root)
    check(res.rc == ctx.base().rc, f"gate: {res.brief()}")
    missing = [
        name
        for name in ("record.md", "report.html")
        if "itself only" not in (root / name).read_text(errors="replace")
    ]
    check(
        not missing, f"{', '.join(missing)} never say the verdict was verified against itself only"
    )
    return "both say it"


@case("three", "Medium", "SGLang counts summing past 2^63 (fit-map ranks the hottest cold)")
def r3_stat_dump_wrap(ctx: Ctx) -> str | None:
    folder = ctx.folder("r3_wrap")
    big = 2**62 + 5
    rows = [[[big, 9, 3, 1]], [[big, 9, 3, 1]]]  # expert 0 is the hottest by far
    as_json = folder / "counts.json"
    as_json.write_text(json.dumps({"logical_count": rows}))
    as_pt = folder / "dump.pt"
    write_pt(as_pt, {"rank": 0, "logical_count": long_tensor([big, 9, 3, 1] * 2, (2, 1, 4))})
    notes = []
    for label, source in (("json", as_json), ("pt", as_pt)):
        out = folder / f"{label}-map.json"
        res = ctx.harness("fit-map", source, "--top", "1", "-o", out, timeout=60)
        check(not res.crashed() and res.rc in (0, 2), f"{label}: {res.brief()}")
        if res.rc == 0:
            hot = json.loads(out.read_text())["layers"]["0"]["hot"]
            check(hot == [0], f"{label}: the hottest expert 0 left cold; kept {hot}")
            notes.append(f"{label}: expert 0 kept")
        else:
            notes.append(f"{label}: refused")
    return "; ".join(notes)


@case("three", "Low", "`history --max-pvalue` nan, -1, 0, 1, inf")
def r3_history_max_pvalue(ctx: Ctx) -> str | None:
    reports = ctx.copy("r3_pvalue").parent.parent
    bad = []
    for value in ("nan", "-1", "0", "1", "inf"):
        res = ctx.harness("history", "--reports", reports, "--max-pvalue", value, timeout=60)
        if res.rc != 2 or res.crashed():
            bad.append(f"{value}: {res.brief()}")
    check(not bad, "; ".join(bad[:2]))
    return "all five refused (exit 2)"


@case("three", "Low", "a card of 10,002 plain cells is not told 'aliases of aliases?'")
def r3_big_card_message(ctx: Ctx) -> str | None:
    folder = ctx.folder("r3_big_card")
    write_pool(folder)
    head = card_text("advbig", hostile=False).split("cells:")[0]
    cells = "".join(
        f"  c{i}: {{env: {{A: '1', B: '2', C: '3'}}, knobs: {{policy: adaptive, "
        f"drain_every: {i + 1}}}}}\n"
        for i in range(10_002)
    )
    (folder / "card.yaml").write_text(head + "cells:\n" + cells + "control: c0\n")
    res = ctx.harness("validate", "card.yaml", cwd=folder, timeout=120)
    check(res.rc == 2 and not res.crashed(), f"validate: {res.brief()}")
    check("aliases of aliases" not in res.text, f"told: {res.said()}")
    return res.said(100)


@case("three", "Low", "an alias bomb is stopped and named as one", added=True)
def added_alias_bomb(ctx: Ctx) -> str | None:
    folder = ctx.folder("added_alias_bomb")
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    (folder / "card.yaml").write_text("\n".join(lines) + "\ncampaign: bomb\n")
    res = ctx.harness("validate", "card.yaml", cwd=folder, timeout=30, mem=4)
    check(not res.timed_out, "validate hung on the alias bomb")
    check(res.rc == 2 and not res.crashed(), f"validate: {res.brief()}")
    return res.said(100)


@case("three", "Low", "SGLang `duration: -42` imports")
def r3_import_sglang_duration(ctx: Ctx) -> str | None:
    return judge_import(ctx, "r3_sglang_duration", "sglang", _negative("duration", -42))


@case("three", "Low", "vLLM `completed: 10**30` imports")
def r3_import_vllm_completed(ctx: Ctx) -> str | None:
    return judge_import(ctx, "r3_vllm_completed", "vllm", _negative("completed", 10**30))


@case("three", "Low", "zero-width characters and U+2028 from the card in every output")
def r3_invisible_chars_in_outputs(ctx: Ctx) -> str | None:
    texts = _outputs(ctx)
    found = _find(texts, INVISIBLE)
    check(not found, ", ".join(found[:4]))
    return "none in the terminal, record.md, report.html, JUnit"


@case("three", "Low", 'a heads-store line with `"t": "soon"` and a rewritten journal')
def r3_heads_t_soon(ctx: Ctx) -> str | None:
    root = ctx.copy("r3_t_soon")
    key = f"{root.parent.name}/{root.name}"
    entry = {"campaign": key, "head": "0" * 64, "events": 1, "when": "start", "t": "soon"}
    with heads_store(root).open("a") as handle:
        handle.write(json.dumps(entry) + "\n")
    res = ctx.gate(root)
    check(res.rc == 3 and not res.crashed(), f"gate: {res.brief()}")
    check("journal.jsonl" in res.text, f"the journal is not named: {res.said()}")
    return res.said(100)


@case("three", "Low", "a routing .npy whose header declares 64 TiB")
def r3_npy_header_64tib(ctx: Ctx) -> str | None:
    folder = ctx.folder("r3_npy_64tib")
    path = folder / "routes.npy"
    path.write_bytes(npy_bytes("<i4", (2**42, 2, 2), b"\0" * 64))
    res = _fit_map(ctx, "r3", path)
    check(res.rc == 2 and not res.crashed(), f"fit-map: {res.brief()}")
    check("routes.npy" in res.text, f"the file is not named: {res.said()}")
    counts = folder / "counts.json"
    counts.write_text(json.dumps({"logical_count": [[50, 9, 3, 1], [2, 40, 7, 1]]}))
    made = ctx.harness("fit-map", counts, "--top", "1", "-o", folder / "map.json", timeout=60)
    if made.rc != 0:
        raise RuntimeError(f"setup: fit-map of plain counts: {made.brief()}")
    scored = ctx.harness("fit-map", "--map", folder / "map.json", "--top", "1", "--score", path,
                         timeout=60, mem=4)  # fmt: skip
    check(scored.rc == 2 and not scored.crashed(), f"fit-map --score: {scored.brief()}")
    return res.said(100)


@case("three", "Low", "a routing .npz holding a .npy whose header declares 64 TiB", added=True)
def added_npz_header(ctx: Ctx) -> str | None:
    folder = ctx.folder("added_npz")
    path = folder / "routes.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("routes.npy", npy_bytes("<i4", (2**42, 2, 2), b"\0" * 64))
    res = _fit_map(ctx, "added", path)
    check(not res.timed_out, "fit-map hung")
    check(res.rc == 2 and not res.crashed(), f"fit-map: {res.brief()}")
    return res.said(100)


def _partials(ctx: Ctx) -> dict[str, Any]:
    """Abandoned .partial folders planted beside a campaign, then a new start in that folder."""
    if ctx._partials is None:
        folder = ctx.folder("r3_partials")
        write_pool(folder)
        (folder / "card.yaml").write_text(card_text("advpart", hostile=False))
        where = folder / "reports" / "advpart"
        where.mkdir(parents=True)
        gone = subprocess.Popen(["true"])
        gone.wait(timeout=10)
        alive = ctx.victim(None)
        base = ctx.base().root
        dead = where / f".20261206T000000Z-{gone.pid}.partial"
        live = where / f".20261206T000001Z-{alive.pgid}.partial"
        for partial in (dead, live):
            shutil.copytree(base / "inputs", partial / "inputs")
            shutil.copyfile(base / "journal.jsonl", partial / "journal.jsonl")
        outside = ctx.work / "outside-partial"
        outside.mkdir(exist_ok=True)
        (outside / "keep.txt").write_text("mine\n")
        link = where / f".20261206T000002Z-{gone.pid}.partial"
        link.symlink_to(outside, target_is_directory=True)
        res = _start_then_stop(ctx, folder, "advpart")
        ctx._partials = {
            "dead": dead.exists(),
            "live": live.exists(),
            "outside": (outside / "keep.txt").exists(),
            "res": res,
        }
    return ctx._partials


@case("three", "Low", "a killed start's .partial folder is removed by the next start")
def r3_partial_removed(ctx: Ctx) -> str | None:
    found = _partials(ctx)
    check(not found["dead"], "the .partial of a process that is gone is still there")
    check(found["live"], "the .partial of a live process was removed")
    return "dead one removed, live one kept"


@case("three", "Low", "a .partial name that is a symlink out is not followed", added=True)
def added_partial_link(ctx: Ctx) -> str | None:
    found = _partials(ctx)
    check(found["outside"], "the next start deleted a file through a .partial symlink")
    return "the linked folder's file is still there"


# -- added: neighbouring paths -------------------------------------------------------------------


@case("two", "Medium", "read-back: a knob changed through the runtime's control file", added=True)
def added_read_back_control_file(ctx: Ctx) -> str | None:
    landed: list[str] = []

    def attack(box: Refbox) -> dict[str, Any]:
        control = arg_after(box.args, "--control")
        # Once the scored traffic runs (the harness has applied the cell's knobs by then).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and served_tokens(box.url) < 8:
            time.sleep(0.05)
        if control and not landed:
            path = Path(control)
            tmp = path.with_name(".adv-control")
            tmp.write_text(json.dumps({"seq": 4242, "knobs": {"drain_every": 5}}))
            os.replace(tmp, path)
            landed.append(str(path.parent))
        return {}

    live = live_campaign(ctx, "control-file", card_text("advctl", hostile=False), attack)
    if not landed or live.root is None:
        raise RuntimeError(f"no runtime with a control file was reached ({live.res.brief()})")
    logs = "".join(p.read_text(errors="replace") for p in live.root.rglob("server.log"))
    if "control 4242 applied" not in logs:
        raise RuntimeError("the runtime never applied the planted control file")
    reasons = [
        str(run_json(live.root, r).get("reason", ""))
        for r in run_ids(live.root)
        if (live.root / "runs" / r / "run.json").is_file()
        and run_json(live.root, r).get("status") != "ok"
    ]
    check(any("drain_every" in r for r in reasons), f"no run failed on it: {reasons[:2]}")
    check(live.res.rc != 0, f"the campaign still PASSed: {live.res.brief()}")
    return f"the run failed: {next(r for r in reasons if 'drain_every' in r)[:90]}"


@case("two", "Medium", "a staged plan no journal line holds: gate and resume not stranded",
      added=True)  # fmt: skip
def added_staged_plan_unjournalled(ctx: Ctx) -> str | None:
    root = ctx.copy("added_staged_plan")
    (root / ".plan.json.next").write_text('{"runs": []}\n')
    gated = ctx.gate(root)
    check(gated.rc == ctx.base().rc, f"gate: {gated.brief()}")
    resumed = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=300)
    check(resumed.rc in (0, 1), f"resume: {resumed.brief()}")
    check(not (root / ".plan.json.next").exists(), "the staged plan was left in place")
    return f"gate rc={gated.rc}; resume removed it"


@case("three", "High", "`--journal-head` of an earlier (start) head: what follows is refused",
      added=True)  # fmt: skip
def added_stale_head(ctx: Ctx) -> str | None:
    root = ctx.copy("added_stale_head")
    start = jread(root)[0].raw
    res = ctx.gate(root, "--journal-head", sha_bytes(start))
    check(res.rc == 3 and "follow" in res.text, f"gate with the start head: {res.brief()}")
    junk = ctx.gate(root, "--journal-head", "xyz")
    check(junk.rc == 2, f"a malformed head: {junk.brief()}")
    return "rc 3 naming what follows; a malformed head rc 2"


@case("three", "Medium", "other readers of a tampered directory (analyze, report, compare)",
      added=True)  # fmt: skip
def added_other_readers_verify(ctx: Ctx) -> str | None:
    root = ctx.copy("added_readers")
    run_id = run_ids(root)[1]
    scale_timings(root / "runs" / run_id, 0.5)  # not re-sealed
    other = ctx.copy("added_readers-b")
    answers = {
        "analyze": ctx.harness("analyze", root, timeout=120),
        "report": ctx.harness("report", root, "--no-figures", timeout=120),
        "compare": ctx.harness("compare", other, root, timeout=120),
        "fit-cost": ctx.harness("fit-cost", root, "-o", root.parent / "c.json", timeout=300),
    }
    for label, res in answers.items():
        check(res.rc == 3 and not res.crashed(), f"{label}: {res.brief()}")
        named = f"runs/{run_id}/" in res.text and ".parquet" in res.text
        check(named, f"{label} does not name the changed file: {res.said()}")
    return f"all four exit 3 naming a file of runs/{run_id}"


@case("two", "High", "seal stripped but the results store kept: the rewrite is caught",
      added=True)  # fmt: skip
def added_seal_stripped_store_kept(ctx: Ctx) -> str | None:
    root = ctx.copy("added_strip_store")
    store = heads_store(root).read_bytes()
    _forge_speedup(root)
    _strip_seal(root)
    heads_store(root).write_bytes(store)
    for flags in ((), ("--allow-unsealed",)):
        res = ctx.gate(root, *flags)
        check(res.rc == 3 and not res.crashed(), f"gate {' '.join(flags)}: {res.brief()}")
    return "rc 3 with and without --allow-unsealed"


@case("three", "High", "`.lock` planted as a symlink to a user's file", added=True)
def added_lock_file_link(ctx: Ctx) -> str | None:
    # The lock's holder is written into .lock (truncate, then write): never through a link.
    root = ctx.copy("added_lock_link")
    victim = ctx.work / "victim-lock.txt"
    victim.write_text("precious\n")
    (root / ".lock").unlink(missing_ok=True)
    (root / ".lock").symlink_to(victim)
    gated = ctx.gate(root)
    check(victim.read_text() == "precious\n", f"gate wrote through .lock ({gated.brief()})")
    check(not gated.crashed() and gated.rc is not None, f"gate: {gated.brief()}")
    folder = ctx.folder("added_lock_link-import")
    files, mapping = import_fixture(folder / "in", "vllm")
    out = folder / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)  # an -o folder "empty" but for its lock file
    imported = ctx.harness("import", "vllm", *files, "--map", mapping, "-o", out)
    check(victim.read_text() == "precious\n", f"import wrote through .lock ({imported.brief()})")
    check(not imported.crashed(), f"import: {imported.brief()}")
    return f"victim untouched; gate rc={gated.rc}, import rc={imported.rc}"


@case("three", "High", "journal.jsonl replaced by a symlink to a copy elsewhere", added=True)
def added_journal_link(ctx: Ctx) -> str | None:
    root = ctx.copy("added_journal_link")
    elsewhere = ctx.work / "elsewhere-journal.jsonl"
    shutil.copyfile(root / "journal.jsonl", elsewhere)
    before = elsewhere.read_bytes()
    (root / "journal.jsonl").unlink()
    (root / "journal.jsonl").symlink_to(elsewhere)
    gated = ctx.gate(root)
    check(gated.rc == 3 and not gated.crashed(), f"gate: {gated.brief()}")
    resumed = ctx.harness("run", "--resume", root, "--quiet", cwd=root, timeout=120)
    check(resumed.rc == 3 and not resumed.crashed(), f"resume: {resumed.brief()}")
    check(elsewhere.read_bytes() == before, "the linked journal was appended to")
    return gated.said(100)


@case("three", "Medium", "a quality.json sealed by a later `sealed` event", added=True)
def added_quality_sealed_later(ctx: Ctx) -> str | None:
    # The README (since de02fb3): the quality suite, like the card and plan, is sealed once.
    root = ctx.copy("added_quality_later")
    (root / "quality.json").write_text(json.dumps({"schema_version": 1, "prompts": []}))
    jappend(root, {"event": "sealed", "files": {"quality.json": sha_file(root / "quality.json")}})
    res = ctx.gate(root)
    check(res.rc == 3 and not res.crashed(), f"gate: {res.brief()}")
    check("quality.json" in res.text, f"quality.json is not named: {res.said()}")
    return res.said(100)


# -- running and reporting ----------------------------------------------------------------------


def run_case(ctx: Ctx, item: Case) -> Outcome:
    start = time.monotonic()
    try:
        note = item.func(ctx)
        status, why = "held", note or ""
    except Failed as exc:
        status, why = "FAILED", str(exc)
    except Skipped as exc:
        status, why = "skipped", str(exc)
    except Exception as exc:  # the case could not be built: said, and counted against
        status, why = "ERROR", f"{type(exc).__name__}: {exc}"
        if os.environ.get("ADV_DEBUG"):
            traceback.print_exc()
    finally:
        ctx.stop_victims()
    # A runtime a harness we started left behind (a SIGKILLed start, a timeout): stopped here,
    # by PID, and said.
    strays = started_under(ctx.work)
    if strays:
        kill_pids(strays)
        why += f" [stopped {len(strays)} stray process(es) left under the work folder]"
    return Outcome(item, status, " ".join(why.split()), time.monotonic() - start)


def print_table(outcomes: list[Outcome]) -> None:
    width = max(len(o.case.name) for o in outcomes)
    print(f"\n{'case':<{width}}  round  sev     added  status   secs  why / note")
    for o in outcomes:
        c = o.case
        added = "added" if c.added else ""
        print(
            f"{c.name:<{width}}  {c.round:<5}  {c.severity:<6}  {added:<5}  {o.status:<7}"
            f"  {o.secs:5.1f}  {o.why[:150]}"
        )
    print()

    def tally(label: str, keep: Callable[[Outcome], bool]) -> None:
        chosen = [o for o in outcomes if keep(o)]
        if not chosen:
            return
        counts = {s: sum(1 for o in chosen if o.status == s) for s in ("held", "FAILED")}
        other = len(chosen) - counts["held"] - counts["FAILED"]
        extra = f", {other} error/skipped" if other else ""
        print(f"  {label:<22} {len(chosen):3} run: {counts['held']} held, "
              f"{counts['FAILED']} failed{extra}")  # fmt: skip

    def where(round_: str | None = None, severity: str | None = None) -> Callable[[Outcome], bool]:
        def keep(o: Outcome) -> bool:
            return round_ in (None, o.case.round) and severity in (None, o.case.severity)

        return keep

    print("totals")
    tally("all", where())
    for round_ in ("two", "three"):
        tally(f"round {round_}", where(round_))
    for severity in SEVERITIES:
        tally(severity, where(severity=severity))
    for round_ in ("two", "three"):
        for severity in SEVERITIES:
            tally(f"round {round_} {severity}", where(round_, severity))
    tally("added (ours)", lambda o: o.case.added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", metavar="NAME", action="append", help="run this case (again)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    if args.list:
        for c in CASES:
            print(f"{c.name:<42} {c.round:<5} {c.severity:<6} {'added' if c.added else '':<5} "
                  f"{c.title}")  # fmt: skip
        return 0
    chosen = CASES
    if args.only:
        unknown = set(args.only) - {c.name for c in CASES}
        if unknown:
            parser.error(f"no such case: {', '.join(sorted(unknown))} (see --list)")
        chosen = [c for c in CASES if c.name in args.only]
    if not HARNESS.is_file():
        parser.error(f"{HARNESS}: missing; run `make .venv` first")
    work = Path(tempfile.mkdtemp(prefix="adversarial-rerun-"))
    ctx = Ctx(work)
    started = time.monotonic()
    outcomes = []
    try:
        for item in chosen:
            print(f"... {item.name}", file=sys.stderr, flush=True)
            outcomes.append(run_case(ctx, item))
            last = outcomes[-1]
            print(f"    {last.status} ({last.secs:.1f}s) {last.why[:120]}", file=sys.stderr)
    finally:
        ctx.stop_victims()
        if args.keep:
            print(f"kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_table(outcomes)
    print(f"\nwall time: {time.monotonic() - started:.0f} s ({len(outcomes)} cases)")
    bad = [
        o
        for o in outcomes
        if o.status in ("FAILED", "ERROR") and o.case.severity in ("High", "Medium")
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
