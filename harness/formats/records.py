"""Run records on disk: the campaign directory layout, the journal, and reading them back.

Layout (docs/design.md#run-records)::

    reports/<campaign>/<stamp>/
      card.yaml card.path plan.json journal.jsonl boxes/<box>.json inputs/ (harness.card.frozen)
      runs/<run-id>/ run.json requests.parquet chunks.parquet ring.parquet counters.json server.log

The journal is append-only and fsynced. A run is done only when its ``run.json`` says ``ok`` and the
journal holds its ``done`` event, so a harness killed mid-write redoes that run and duplicates none.

Reading is checked as far as the analysis relies on it: ``plan.json``'s runs, the fields of
``run.json`` and ``counters.json`` it reads, and the columns of each run table
(:data:`RUN_TABLE_COLUMNS`), so a damaged record is a :class:`RecordError` naming the file, the
field and the fix, never a KeyError or TypeError inside the statistics.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.errors import RecordError, VerificationError
from harness.formats.ring import RING_FIELDS
from harness.formats.safe_write import atomic_binary_writer, open_in_place
from harness.formats.safe_write import write_text_atomic as write_text_atomic  # its old home
from harness.formats.seal import file_sha256, run_seal, start_seal
from harness.formats.textfile import parse_json, read_bytes, read_text

# 1: first version of run.json, plan.json, journal.jsonl, counters.json and the parquet files.
SCHEMA_VERSION = 1

RUN_OK = "ok"
RUN_FAILED = "failed"
RUN_INTERRUPTED = "interrupted"


@contextlib.contextmanager
def _naming_failures(path: Path) -> Iterator[None]:
    """A failed write(2) names no file: name the one being written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno:
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
        raise


# Beside a trace `collect --as-run` wrote: the host-step ranges of the unscored until_recovered
# extensions it sent, which a run leaves out of its counters (read by harness.sim.trace_files).
UNSCORED_STEPS = "unscored.json"

# In a warm run's folder: the outputs of the canaries its boot answered first
# (harness.drive.canaries writes it, harness.analyze.canaries compares it).
CANARY_FILE = "canaries.json"


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    text = json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2, default=str)
    write_text_atomic(path, text)  # harness.formats.safe_write: never through a planted link


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON record, failing with the file named when it is missing or broken."""
    if not path.is_file():
        raise RecordError(f"{path}: missing")
    data = parse_json(read_text(path, RecordError, "record"), str(path), RecordError)
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a JSON object")
    version = data.get("schema_version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise RecordError(f"{path}: schema_version must be an integer, got {version!r:.40}")
    if version is not None and version > SCHEMA_VERSION:
        raise RecordError(
            f"{path}: schema_version {version} is newer than this harness understands "
            f"({SCHEMA_VERSION}); upgrade the harness"
        )
    return data


def _is_number(value: Any) -> bool:
    """An int or float (not a bool) that converts to a float."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (not isinstance(value, int) or abs(value) < 2**1023)
    )


def _broken(path: Path, field: str, what: str) -> RecordError:
    return RecordError(
        f"{path}: {field}: {what}; the record is damaged: restore it, or run that run again "
        "(delete its folder, then `harness run --resume` the campaign)"
    )


# Run ids name folders: no separators, no "..", nothing a file system would refuse.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_PLAN_TEXT = ("run_id", "cell", "cache_state", "pattern", "comparison")
_PLAN_INTS = ("cycle", "slot", "repeat")


def check_plan(plan: dict[str, Any], path: Path) -> dict[str, Any]:
    """``plan.json``, its runs checked to carry the identity every reader of a run uses."""
    runs = plan.get("runs")
    if not isinstance(runs, list):
        raise _broken(path, "runs", "must be a list of planned runs")
    seen: set[str] = set()
    for index, run in enumerate(runs):
        where = f"runs[{index}]"
        if not isinstance(run, dict):
            raise _broken(path, where, "must be an object")
        for key in _PLAN_TEXT:
            if not isinstance(run.get(key), str):
                raise _broken(path, f"{where}.{key}", "must be a string")
        for key in _PLAN_INTS:
            value = run.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
                raise _broken(path, f"{where}.{key}", "must be a non-negative integer")
        run_id = run["run_id"]
        if not _RUN_ID.fullmatch(run_id) or run_id in seen:
            raise _broken(path, f"{where}.run_id", f"{run_id[:60]!r} is not a unique folder name")
        seen.add(run_id)
    scale = plan.get("scale", 1.0)
    if not _is_number(scale) or not 0 < scale < math.inf:
        raise _broken(path, "scale", "must be a positive number")
    cycles = plan.get("cycles", 1)  # absent from plans written before plans recorded it
    if not isinstance(cycles, int) or isinstance(cycles, bool) or not 0 < cycles < 2**31:
        raise _broken(path, "cycles", "must be a positive integer")
    return plan


def check_run_record(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """``run.json``, checked for the fields analysis and resume read."""
    for key in ("status", "reason"):
        if key in record and not isinstance(record[key], str):
            raise _broken(path, key, "must be a string")
    if "status" not in record:
        raise _broken(path, "status", "missing")
    lost = record.get("ring_lost", 0)
    if not isinstance(lost, int) or isinstance(lost, bool) or not 0 <= lost < 2**62:
        raise _broken(path, "ring_lost", "must be a non-negative integer")
    for key in ("started_at", "ended_at"):
        value = record.get(key)
        if value is not None and not (_is_number(value) and math.isfinite(value)):
            raise _broken(path, key, "must be a time in seconds")
    return record


def read_counters(path: Path) -> dict[str, Any]:
    """``counters.json``: ``before``, ``after`` and ``delta``, each counter a number or null."""
    counters = read_json(path)
    for part in ("before", "after", "delta"):
        values = counters.get(part)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise _broken(path, part, "must be an object of counters")
        for name, value in values.items():
            if value is not None and not (_is_number(value) and math.isfinite(value)):
                raise _broken(path, f"{part}.{name}", f"must be a finite number, got {value!r:.40}")
            if value is not None and part != "delta" and value < 0:
                # A reading of a counter is a count; only a gauge's delta may go down.
                raise _broken(path, f"{part}.{name}", f"must not be negative, got {value!r:.40}")
    return counters


# The columns analysis reads from each run table and what they hold: "int" integers, "bool"
# booleans, "number" ints or floats (null allowed: a failed request has no timings), "text"
# strings (null allowed). Other columns are not checked.
def read_cohorts(root: Path) -> dict[str, dict[str, Any]]:
    """``cohorts.json`` of a campaign (the guards' verdict per cohort); {} when guards never ran.

    Each cohort: ``valid``, ``reasons`` (why not), ``checks`` (what the before-checks saw).
    """
    path = root / "cohorts.json"
    if not path.is_file():
        return {}
    cohorts = read_json(path).get("cohorts")
    if not isinstance(cohorts, dict) or not all(isinstance(v, dict) for v in cohorts.values()):
        raise _broken(path, "cohorts", "must map cohort names to objects")
    return cohorts


RUN_TABLE_COLUMNS: dict[str, dict[str, str]] = {
    "requests.parquet": {
        "request": "int",
        "prompt_id": "text",
        "domain": "text",
        "phase": "text",
        "warmup": "bool",
        "ok": "bool",
        "first_after_boot": "bool",
        "ttft_s": "number",
        "e2el_s": "number",
        "completion_tokens": "number",
        "prompt_tokens": "number",
        "output_sha256": "text",
        "output_text": "text",
    },
    "chunks.parquet": {"request": "int", "chunk": "int", "t_s": "number"},
    "bench.parquet": {"row": "int"},  # a command-driver run: + one number column per metric
    "ring.parquet": dict.fromkeys(RING_FIELDS, "int"),
    "samples.parquet": {
        "t_s": "number",
        "scored": "bool",
        "rss_bytes": "number",
        "swapout_pages": "number",
    },
}


def _holds(column: pd.Series, want: str) -> bool:
    kind = column.dtype.kind
    if want == "int":
        return kind in "iu"
    if want == "bool":
        return kind == "b"
    values = column.dropna()
    if want == "number":
        return kind in "iuf" or all(_is_number(v) for v in values)
    return all(isinstance(v, str) for v in values)


# A ring's columns are the profile's fields (a header-less ring declares its own): only their
# types are checked here; analysis names the fields it needs and a ring lacks (recovery.py).
_PRESENT_ONLY = {"ring.parquet"}


def _check_columns(frame: pd.DataFrame, path: Path) -> None:
    wanted = RUN_TABLE_COLUMNS.get(path.name, {})
    missing = [name for name in wanted if name not in frame.columns]
    if missing and path.name not in _PRESENT_ONLY:
        raise _broken(path, "columns", f"{', '.join(missing)} missing")
    for name, want in wanted.items():
        if name in frame.columns and not _holds(frame[name], want):
            raise _broken(path, name, f"must hold {want} values, has {frame[name].dtype}")


# Values of run tables that are counts, durations or times: finite and never negative.
_NON_NEGATIVE = {
    "requests.parquet": ("ttft_s", "e2el_s", "completion_tokens", "prompt_tokens"),
    "chunks.parquet": ("t_s",),
    "samples.parquet": ("rss_bytes", "swapout_pages"),
}
# Columns that identify a row: a row twice is a damaged (or doctored) table.
_ROW_KEYS = {"requests.parquet": ("request",), "chunks.parquet": ("request", "chunk")}


def _check_values(frame: pd.DataFrame, path: Path) -> None:
    for name in _NON_NEGATIVE.get(path.name, ()):
        if name not in frame.columns:
            continue
        values = pd.to_numeric(frame[name], errors="coerce").dropna().to_numpy(dtype=float)
        bad = values[~np.isfinite(values) | (values < 0)]
        if bad.size:
            raise _broken(path, name, f"must be finite and not negative, has {bad[0]!r}")
    keys = [k for k in _ROW_KEYS.get(path.name, ()) if k in frame.columns]
    if keys and frame.duplicated(subset=keys).any():
        row = frame[frame.duplicated(subset=keys)].iloc[0]
        which = ", ".join(f"{k} {row[k]}" for k in keys)
        raise _broken(path, "rows", f"{which} appears more than once")
    if path.name == "chunks.parquet" and {"request", "chunk", "t_s"} <= set(frame.columns):
        ordered = frame.sort_values(["request", "chunk"])
        gaps = ordered.groupby("request")["t_s"].diff().dropna()
        if (gaps < 0).any():
            request = ordered.loc[gaps[gaps < 0].index[0], "request"]
            raise _broken(
                path,
                "t_s",
                f"request {request}: a token arrives before the one before it "
                "(a negative inter-token latency)",
            )


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Write a DataFrame atomically, tagged with the schema version."""
    frame = frame.copy()
    frame.attrs = {"schema_version": str(SCHEMA_VERSION)}
    with atomic_binary_writer(path) as handle:
        frame.to_parquet(handle, index=False)


def read_parquet(path: Path) -> pd.DataFrame:
    """Read a parquet record, naming the file when it is missing, unreadable or incomplete.

    A run table (:data:`RUN_TABLE_COLUMNS`, by file name) must have the columns analysis reads,
    of the types it reads them as.
    """
    if not path.is_file():
        raise RecordError(f"{path}: missing")
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError, TypeError, KeyError, IndexError, pa.ArrowException) as exc:
        # A corrupt file fails in pyarrow's reader or in pandas' metadata: the file is at fault.
        raise RecordError(
            f"{path}: unreadable parquet ({type(exc).__name__}: {str(exc)[:200]}); the file "
            "is damaged: restore it, or rerun the run"
        ) from None
    _check_columns(frame, path)
    _check_values(frame, path)
    return frame


_APPEND_LOCK = threading.Lock()


CAMPAIGN_JOURNAL = "journal.jsonl"
# A grown plan between its journal line and its rename over plan.json (execute.reopen).
NEXT_PLAN = ".plan.json.next"


def line_digest(line: bytes) -> str:
    """The SHA-256 of one journal line as written (without its newline): what the next
    event's ``prev`` carries, and the journal's head when it is the last."""
    return hashlib.sha256(line).hexdigest()


def _parsed_event(line: bytes, path: Path) -> dict[str, Any] | None:
    """The event a journal line holds, or None for a line that holds none (torn, garbled)."""
    try:
        event = parse_json(line.decode("utf-8"), str(path), RecordError)
    except (RecordError, UnicodeDecodeError):
        return None
    if isinstance(event, dict) and isinstance(event.get("event"), str):
        return event
    return None


def _last_event_line(handle: BinaryIO, path: Path) -> bytes | None:
    """The last line of an open journal that holds an event, read backwards from the end
    (a journal grows to megabytes; each append reads a few kilobytes)."""
    position = handle.seek(0, os.SEEK_END)
    pending = b""
    while True:
        step = min(position, 1 << 16)
        position -= step
        handle.seek(position)
        pending = handle.read(step) + pending
        pieces = pending.split(b"\n")
        # The first piece may be the tail of a longer line unless the file starts there.
        whole, pending = (pieces, b"") if position == 0 else (pieces[1:], pieces[0])
        for piece in reversed(whole):
            if piece.strip() and _parsed_event(piece, path) is not None:
                return piece
        if position == 0:
            return None


class Journal:
    """The append-only, fsynced event log of a campaign.

    The campaign's own journal seals what its events vouch for (:mod:`harness.formats.seal`):
    ``campaign_start``, ``campaign_extended`` and ``run_done`` get the SHA-256 of the files
    they are about, computed here so that every writer of those events seals alike.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _seal(self, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        if self.path.name != CAMPAIGN_JOURNAL or "files" in fields:
            return fields
        root = self.path.parent
        if event == "campaign_start":
            return {**fields, **start_seal(root)}
        if event == "campaign_extended":
            return {**fields, "files": {"plan.json": file_sha256(root / "plan.json")}}
        if event == "run_done" and isinstance(fields.get("run_id"), str):
            return {**fields, "files": run_seal(root / "runs" / fields["run_id"])}
        return fields

    def seal_file(self, path: Path) -> None:
        """Journal the digest of a top-level record written after the start (``sealed``)."""
        relative = path.relative_to(self.path.parent).as_posix()
        self.append("sealed", files={relative: file_sha256(path)})

    def append(self, event: str, **fields: Any) -> None:
        """Append one event and fsync it before returning.

        In a campaign's journal every event carries ``prev``, the SHA-256 of the event line
        before it (:func:`line_digest`): the journal is a hash chain, so an edited, inserted or
        removed line breaks it, and a rewritten chain ends in a head other than the one
        recorded outside the directory (:mod:`harness.formats.heads`)."""
        fields = self._seal(event, fields)
        record = {"schema_version": SCHEMA_VERSION, "t": time.time(), "event": event, **fields}
        chained = self.path.name == CAMPAIGN_JOURNAL
        # A fleet's workers append from several threads: one line at a time, whole.
        with (
            _APPEND_LOCK,
            _naming_failures(self.path),
            open_in_place(self.path, "a+b") as handle,
        ):
            if chained:
                before = _last_event_line(handle, self.path)
                record["prev"] = "" if before is None else line_digest(before)
            line = json.dumps(record, default=str) + "\n"
            # A write cut short (disk full, a kill) leaves a torn last line: end it first, or
            # this event would be glued to it and lost with it.
            end = handle.seek(0, os.SEEK_END)
            if end:
                handle.seek(end - 1)
                if handle.read(1) != b"\n":
                    line = "\n" + line
            handle.write(line.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())

    def event_lines(self) -> list[tuple[int, bytes, dict[str, Any]]]:
        """Every complete event with its line number (from 1) and its bytes as written.

        A resume appends after a torn line, so one may sit anywhere: any line that is not a
        JSON event object (not UTF-8, not JSON, no ``event``) is skipped, never fatal.
        """
        if not self.path.is_file():
            return []
        found = []
        for number, line in enumerate(read_bytes(self.path, RecordError, "journal").split(b"\n")):
            event = _parsed_event(line, self.path)
            if event is not None:
                found.append((number + 1, line, event))
        return found

    def events(self) -> list[dict[str, Any]]:
        """Every complete event; a torn line (a kill mid-write) is ignored."""
        return [event for _, _, event in self.event_lines()]

    def done_runs(self) -> set[str]:
        """Run ids whose completion was journalled."""
        return {
            e["run_id"]
            for e in self.events()
            if e["event"] == "run_done" and isinstance(e.get("run_id"), str)
        }


def check_inside(root: Path, path: Path) -> Path:
    """``path``, checked to land inside ``root`` (a name from a card never writes elsewhere)."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise RecordError(f"{path}: outside {root}; a name from the card must not leave it")
    return path


def write_sealed_json(root: Path, path: Path, payload: dict[str, Any]) -> None:
    """Write a top-level record of the campaign in ``root`` and journal its digest (when the
    folder has a campaign journal: a Slurm job's folder keeps the same files unsealed)."""
    write_json_atomic(check_inside(root, path), payload)
    if (root / CAMPAIGN_JOURNAL).is_file():
        Journal(root / CAMPAIGN_JOURNAL).seal_file(path)


@dataclass
class CampaignDir:
    """A campaign directory on disk."""

    root: Path

    @property
    def runs_dir(self) -> Path:
        """Folder holding one folder per run."""
        return self.root / "runs"

    @property
    def analysis_dir(self) -> Path:
        """Folder of the analysis tables."""
        return self.root / "analysis"

    @property
    def journal(self) -> Journal:
        """The campaign's journal."""
        return Journal(self.root / CAMPAIGN_JOURNAL)

    def run_dir(self, run_id: str) -> Path:
        """Folder of one run."""
        return self.runs_dir / run_id

    def plan(self) -> dict[str, Any]:
        """The plan the campaign executes, its runs checked (:func:`check_plan`)."""
        path = self.root / "plan.json"
        return check_plan(read_json(path), path)

    def card_path(self) -> Path:
        """The card as run (a verbatim copy)."""
        return self.root / "card.yaml"

    def run_record(self, run_id: str) -> dict[str, Any] | None:
        """``run.json`` of a run, or None when the run never finished writing it."""
        path = self.run_dir(run_id) / "run.json"
        if not path.is_file():
            return None
        return check_run_record(read_json(path), path)

    def is_done(self, run_id: str) -> bool:
        """True when the run completed and its record is whole."""
        record = self.run_record(run_id)
        return record is not None and record.get("status") == RUN_OK

    def done_runs(self, run_ids: Iterable[str]) -> set[str]:
        """The runs of ``run_ids`` that are complete: ``run.json`` says ok and, in a sealed
        directory, the journal sealed the run as done. A harness killed (or out of disk) between
        writing ``run.json`` and journalling ``run_done`` left a record nothing vouches for:
        verification refuses it, so a resume must redo it rather than count it done."""
        events = self.journal.events()
        sealed = any(e.get("event") == "campaign_start" and "seal" in e for e in events)
        journalled = {e.get("run_id") for e in events if e.get("event") == "run_done"}
        return {r for r in run_ids if self.is_done(r) and (not sealed or r in journalled)}


def open_campaign(path: Path) -> CampaignDir:
    """A campaign directory, checked to have a plan and a card."""
    if not (path / "plan.json").is_file() and (path / CAMPAIGN_JOURNAL).is_file():
        raise VerificationError(
            f"{path / 'plan.json'}: missing, but {CAMPAIGN_JOURNAL} holds a campaign that was "
            "planned; restore the file, or rerun the campaign"
        )
    if not (path / "plan.json").is_file():
        raise RecordError(
            f"{path}: not a campaign directory (no plan.json); "
            "pass the folder `harness run` printed, e.g. reports/<campaign>/<stamp>"
        )
    return CampaignDir(path)


@dataclass
class RunRecord:
    """Everything ``run.json`` holds about one run."""

    run_id: str
    status: str
    reason: str = ""
    cell: str = ""
    cycle: int = 0
    slot: int = 0
    repeat: int = 0
    cache_state: str = "warm"
    pattern: str = ""
    comparison: str = ""
    block: str = ""
    box: str = ""
    boot_id: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    ended_at: float = 0.0
    log_tail: str = ""
    ring_lost: int = 0
    attempt: int = 1
    slurm_job_id: str | None = None  # the Slurm job (``123_4``) that ran it, on a slurm box
    node: str | None = None  # the cluster node it ran on, on a slurm box

    def to_json(self) -> dict[str, Any]:
        """The record as written to ``run.json``."""
        return dict(self.__dict__)
