"""Long runs: draining the telemetry ring while it is written, and sampling memory and swap.

A ring holds its last ``capacity`` records; a soak writes far more, so a background thread reads
the new records every ``drain_interval_s`` (``read_ring_since`` on a local box; on an SSH box a
stdlib-only snippet that prints the new slots as base64) into chunk files under the run folder.
The final ``ring.parquet`` is every chunk plus the read after the runtime stopped, deduplicated by
sequence number. Loss is counted, never hidden: a record overwritten before a drain reached it is
lost, and so is a torn one, and the writer's own dropped count is added at the end.

Both boxes read through one stdlib reader (:data:`DRAIN_CORE`), which reads the live file
through an mmap: ``read_ring_since`` reads through a buffered file whose first read can cache
the slots of a small ring, which then look torn when the header says they were written since.

The same thread samples the runtime's process group RSS (``ps`` summed over the group) and the
box's swap-out counter every ``sample_interval_s`` into ``samples.parquet``.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.boxes.base import Box, shell_command
from harness.boxes.local import LocalBox
from harness.errors import BoxError, HarnessError, RingError
from harness.formats.records import read_parquet, write_parquet

# Seconds between ring drains: a 1M-slot ring at a few thousand steps/s lasts minutes, so 10 s
# leaves a wide margin while costing one small command per 10 s on an SSH box.
DRAIN_INTERVAL_S = 10.0
# Seconds between RSS / swap-out samples: 48 h gives ~35k rows, enough for quartile medians.
SAMPLE_INTERVAL_S = 5.0
# Most records one remote drain prints (72 bytes each for the refbox, base64 adds a third);
# a drain that is further behind loops until it has caught up.
REMOTE_DRAIN_LIMIT = 50_000
# Drained records held in memory before they are written as a chunk file.
FLUSH_RECORDS = 100_000

# Reads records with seq > AFTER of a headed ring with the standard library only (the box need
# not have the harness or numpy), through an mmap so every read sees the live file. The same
# seqlock rules as harness.formats.ring: the slots are copied, then the header's sequence is read
# again and the slots the writer may have reached meanwhile are copied again; the caller drops
# rows whose marker is not the expected sequence or changed. Run in-process for a local box and
# as a script (DRAIN_SNIPPET) on an SSH box, so both boxes use this one reader.
DRAIN_CORE = r"""
import mmap, os, struct
def drain_window(path, after, limit):
    if not os.path.exists(path):
        return None
    with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:8] != b'HRING\x00\r\n':
            raise ValueError('not a telemetry ring: ' + path)
        ver, hb, rb, nf, cap = struct.unpack_from('<IIIIq', m, 8)
        dropped = struct.unpack_from('<q', m, 40)[0]
        names = m[64:hb].rstrip(b'\0').decode('ascii').replace('\0', ',')
        seq = lambda: struct.unpack_from('<q', m, 32)[0]
        new = seq()
        if after > new:
            raise ValueError('ring sequence %d is behind %d: the runtime recreated its ring'
                             % (new, after))
        first = max(after, new - cap) + 1
        count = max(0, min(new - first + 1, limit))
        def slots(a, n):
            s = (a - 1) % cap
            h = min(n, cap - s)
            return m[hb + s * rb: hb + (s + h) * rb] + m[hb: hb + (n - h) * rb]
        rows = slots(first, count) if count else b''
        reach = max(0, min(count, seq() + 1 - cap - first + 1))
        again = slots(first, reach) if reach else b''
        return new, first, count, dropped, reach, names, rows, again
"""
DRAIN_SNIPPET = (
    DRAIN_CORE
    + r"""
import base64, sys
got = drain_window(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
if got is None:
    sys.exit(print('absent'))
print(*got[:6])
print(base64.b64encode(got[6]).decode())
print(base64.b64encode(got[7]).decode())
"""
)
_CORE: dict[str, Any] = {}
exec(compile(DRAIN_CORE, "<drain-core>", "exec"), _CORE)


@dataclass(frozen=True)
class DrainResult:
    """Records read in one drain, and what the next drain starts after."""

    frame: pd.DataFrame  # seq and one int64 column per field
    after_sequence: int  # pass this to the next drain
    caught_up: bool  # False when a size limit left newer records for the next call
    lost: int  # records of the window overwritten or torn before this read
    dropped: int  # the writer's cumulative dropped count (header)


def _decode_window(
    after_sequence: int,
    window: tuple[int, int, int, int, int, str, bytes, bytes],
) -> DrainResult:
    new, first, count, dropped, reach, names, raw, raw_again = window
    fields = tuple(names.split(","))
    width = 1 + len(fields)
    rows = np.frombuffer(raw, dtype="<i8").reshape(-1, width)
    again = np.frombuffer(raw_again, dtype="<i8").reshape(-1, width)
    if rows.shape[0] != count or again.shape[0] != reach:
        raise RingError(f"drained window is short ({rows.shape[0]} of {count} records)")
    expected = np.arange(first, first + count, dtype=np.int64)
    bad = rows[:, 0] != expected
    bad[:reach] |= again[:, 0] != rows[:reach, 0]
    torn = int(np.count_nonzero(bad))
    frame = pd.DataFrame(rows[~bad], columns=["seq", *fields]).astype("int64")
    overwritten = first - after_sequence - 1
    last = first + count - 1 if count else max(after_sequence, new)
    return DrainResult(frame, last, last >= new, overwritten + torn, dropped)


def drain_local(path: str, after_sequence: int, limit: int = 1 << 62) -> DrainResult:
    """Drain a live ring file on this machine (raises FileNotFoundError before it exists)."""
    try:
        window = _CORE["drain_window"](path, after_sequence, limit)
    except ValueError as exc:
        raise RingError(f"{path}: {exc}") from exc
    if window is None:
        raise FileNotFoundError(path)
    return _decode_window(after_sequence, window)


def drain_remote(
    box: Box, python: str, path: str, after_sequence: int, limit: int = REMOTE_DRAIN_LIMIT
) -> DrainResult:
    """Drain a ring on a box by running :data:`DRAIN_SNIPPET` there with its Python."""
    command = shell_command([python, "-c", DRAIN_SNIPPET, path, str(after_sequence), str(limit)])
    result = box.sh(command, timeout_s=120, check=False)
    lines = result.stdout.splitlines()
    if result.code == 0 and lines == ["absent"]:
        raise FileNotFoundError(path)
    if result.code != 0 or len(lines) < 3:
        raise RingError(f"{box.where}: draining {path} failed: {result.stderr.strip()[-500:]}")
    head = lines[0].split(" ")
    numbers = [int(v) for v in head[:5]]
    window = (*numbers, head[5], base64.b64decode(lines[1]), base64.b64decode(lines[2]))
    try:
        return _decode_window(after_sequence, window)  # type: ignore[arg-type]
    except RingError as exc:
        raise RingError(f"{box.where}: {path}: {exc}") from exc


class RingStore:
    """The drained records of one run as chunk files, and the loss each boot saw.

    Chunks are ``ring-chunks/b<boot>-<first seq>-<last seq>.parquet`` with a ``boot`` column, so
    a run resumed on a fresh boot (whose ring starts again at seq 1) keeps both boots apart.
    """

    def __init__(self, folder: Path, boot: int) -> None:
        self.folder = folder
        self.boot = boot
        self.after_sequence = 0
        self.lost = 0  # overwritten or torn before a drain reached them, this boot
        self.dropped = 0  # the writer's dropped count at the latest read, this boot
        self.drains = 0
        self._buffer: list[pd.DataFrame] = []
        self._buffered = 0

    def add(self, result: DrainResult) -> None:
        """Take one drain's records and loss."""
        self.after_sequence = max(self.after_sequence, result.after_sequence)
        self.lost += result.lost
        self.dropped = max(self.dropped, result.dropped)
        self.drains += 1
        if len(result.frame):
            self._buffer.append(result.frame)
            self._buffered += len(result.frame)
        if self._buffered >= FLUSH_RECORDS:
            self.flush()

    def flush(self) -> None:
        """Write the buffered records as one chunk file (fsynced by the atomic rename)."""
        if not self._buffer:
            return
        frame = pd.concat(self._buffer, ignore_index=True)
        frame["boot"] = np.int64(self.boot)
        first, last = int(frame["seq"].iloc[0]), int(frame["seq"].iloc[-1])
        write_parquet(frame, self.folder / f"b{self.boot}-{first:012d}-{last:012d}.parquet")
        self._buffer, self._buffered = [], 0


def assemble_ring(folder: Path, caps: dict[int, int] | None = None) -> pd.DataFrame:
    """Every chunk of a run in (boot, seq) order, duplicates dropped; ``caps`` trims a boot.

    ``caps[boot] = S`` keeps that boot's records with seq <= S (an interrupted boot is kept up to
    its last checkpoint). The ``boot`` column is dropped when the run had a single boot.
    """
    frames = [read_parquet(p) for p in sorted(folder.glob("b*-*-*.parquet"))]
    if not frames:
        return pd.DataFrame()
    ring = pd.concat(frames, ignore_index=True)
    for boot, cap in (caps or {}).items():
        ring = ring[(ring["boot"] != boot) | (ring["seq"] <= cap)]
    ring = ring.drop_duplicates(subset=["boot", "seq"]).sort_values(["boot", "seq"], kind="stable")
    if ring["boot"].nunique() <= 1:
        ring = ring.drop(columns=["boot"])
    return ring.reset_index(drop=True)


def _sample_command(pgid: int, platform: str) -> str:
    group = int(pgid)
    rss = (
        "ps -A -o pgid= -o rss= | "
        f"awk -v g={group} '$1 == g {{s += $2; n++}} END {{print s + 0, n + 0}}'"
    )
    if platform == "macos-metal":
        swap = "vm_stat | awk '/^Swapouts:/ {gsub(/\\./, \"\", $2); print $2}'"
    else:
        swap = "awk '$1 == \"pswpout\" {print $2}' /proc/vmstat"
    return f"{rss}; {swap} 2>/dev/null || true"


def sample_group(box: Box, pgid: int) -> tuple[int | None, int | None]:
    """(RSS bytes summed over the process group or None when it is gone, swap-out pages)."""
    result = box.sh(_sample_command(pgid, box.spec.platform), timeout_s=30, check=False)
    lines = result.stdout.split("\n")
    try:
        kib, processes = (int(v) for v in lines[0].split())
    except (ValueError, IndexError):
        raise BoxError(f"{box.where}: RSS sample printed {result.stdout!r}") from None
    swap = lines[1].strip() if len(lines) > 1 else ""
    return (kib * 1024 if processes else None), (int(swap) if swap.isdigit() else None)


@dataclass
class MonitorSettings:
    """How often a run's monitor drains the ring and samples memory."""

    drain_interval_s: float = DRAIN_INTERVAL_S
    sample_interval_s: float = SAMPLE_INTERVAL_S


@dataclass
class RunMonitor:
    """A background thread that drains one boot's ring and samples its memory and swap.

    It opens its own box (``open_box``) on first use, so short runs never pay for a connection
    and an SSH box's main connection is never shared between threads.
    """

    open_box: Callable[[], Box]
    pgid: int
    store: RingStore
    ring_path: str | None
    python: str
    settings: MonitorSettings = field(default_factory=MonitorSettings)
    samples: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    scored: bool = False  # set once the warm-up requests are done

    def __post_init__(self) -> None:
        self._box: Box | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-monitor", daemon=True)

    def start(self) -> None:
        """Start draining and sampling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and flush what it drained (the final ring read is the caller's)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self.store.flush()
            if self._box is not None:
                self._box.close()
                self._box = None

    def _get_box(self) -> Box:
        if self._box is None:
            self._box = self.open_box()
        return self._box

    def drain_now(self) -> None:
        """Drain until caught up (a checkpoint calls this; the thread calls it on schedule)."""
        if self.ring_path is None:
            return
        with self._lock:
            box = self._get_box()
            while True:
                try:
                    if isinstance(box, LocalBox):
                        result = drain_local(self.ring_path, self.store.after_sequence)
                    else:
                        result = drain_remote(
                            box, self.python, self.ring_path, self.store.after_sequence
                        )
                except FileNotFoundError:
                    return  # the runtime has not created its ring yet
                except (HarnessError, OSError) as exc:
                    self.errors.append(f"drain: {exc}")
                    return
                self.store.add(result)
                if result.caught_up:
                    return

    def sample_now(self) -> None:
        """Take one RSS / swap-out sample."""
        with self._lock:
            try:
                rss, swap = sample_group(self._get_box(), self.pgid)
            except (HarnessError, OSError) as exc:
                self.errors.append(f"sample: {exc}")
                return
        self.samples.append(
            {
                "t_wall": time.time(),
                "boot": self.store.boot,
                "scored": self.scored,
                "rss_bytes": rss,
                "swapout_pages": swap,
            }
        )

    def flush(self) -> None:
        """Write the drained records held in memory as a chunk file."""
        with self._lock:
            self.store.flush()

    def samples_frame(self, origin_wall: float) -> pd.DataFrame:
        """Samples so far: ``t_s`` (from ``origin_wall``), ``boot``, ``scored`` (after the
        warm-up), ``rss_bytes`` (NaN once the group is gone), ``swapout_pages`` (NaN if unknown)."""
        rows = [
            {
                "t_s": s["t_wall"] - origin_wall,
                "boot": s["boot"],
                "scored": s["scored"],
                "rss_bytes": s["rss_bytes"],
                "swapout_pages": s["swapout_pages"],
            }
            for s in self.samples
        ]
        columns = ["t_s", "boot", "scored", "rss_bytes", "swapout_pages"]
        types = {"t_s": "float64", "boot": "int64", "scored": "bool"}
        frame = pd.DataFrame(rows, columns=columns).astype(types)
        frame["rss_bytes"] = pd.to_numeric(frame["rss_bytes"]).astype("float64")
        frame["swapout_pages"] = pd.to_numeric(frame["swapout_pages"]).astype("float64")
        return frame

    def _loop(self) -> None:
        settings = self.settings
        now = time.monotonic()
        next_drain = now + settings.drain_interval_s
        next_sample = now + settings.sample_interval_s
        while not self._stop.is_set():
            wait_s = max(0.0, min(next_drain, next_sample) - time.monotonic())
            if self._stop.wait(wait_s):
                return
            now = time.monotonic()
            if now >= next_drain:
                self.drain_now()
                next_drain = now + settings.drain_interval_s
            if now >= next_sample:
                self.sample_now()
                next_sample = now + settings.sample_interval_s


__all__ = [
    "DRAIN_CORE",
    "DRAIN_INTERVAL_S",
    "DRAIN_SNIPPET",
    "SAMPLE_INTERVAL_S",
    "DrainResult",
    "MonitorSettings",
    "RingStore",
    "RunMonitor",
    "assemble_ring",
    "drain_local",
    "drain_remote",
    "sample_group",
]
