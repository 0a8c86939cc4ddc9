"""Run records on disk: the campaign directory layout, the journal, and reading them back.

Layout (docs/design.md#run-records)::

    reports/<campaign>/<stamp>/
      card.yaml card.path plan.json journal.jsonl boxes/<box>.json inputs/ (harness.card.frozen)
      runs/<run-id>/ run.json requests.parquet chunks.parquet ring.parquet counters.json server.log

The journal is append-only and fsynced. A run is done only when its ``run.json`` says ``ok`` and the
journal holds its ``done`` event, so a harness killed mid-write redoes that run and duplicates none.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import RecordError

# 1: first version of run.json, plan.json, journal.jsonl, counters.json and the parquet files.
SCHEMA_VERSION = 1

RUN_OK = "ok"
RUN_FAILED = "failed"
RUN_INTERRUPTED = "interrupted"


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump({"schema_version": SCHEMA_VERSION, **payload}, handle, indent=2, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    """Write text through a temp file and rename (plan.json, rewritten when a campaign grows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON record, failing with the file named when it is missing or broken."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{path}: missing") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a JSON object")
    version = data.get("schema_version")
    if version is not None and version > SCHEMA_VERSION:
        raise RecordError(
            f"{path}: schema_version {version} is newer than this harness understands "
            f"({SCHEMA_VERSION}); upgrade the harness"
        )
    return data


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Write a DataFrame atomically, tagged with the schema version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    frame = frame.copy()
    frame.attrs = {"schema_version": str(SCHEMA_VERSION)}
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def read_parquet(path: Path) -> pd.DataFrame:
    """Read a parquet record, naming the file when it is missing or unreadable."""
    if not path.is_file():
        raise RecordError(f"{path}: missing")
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: unreadable parquet: {exc}") from None


class Journal:
    """The append-only, fsynced event log of a campaign."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, event: str, **fields: Any) -> None:
        """Append one event and fsync it before returning."""
        record = {"schema_version": SCHEMA_VERSION, "t": time.time(), "event": event, **fields}
        line = json.dumps(record, default=str) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def events(self) -> list[dict[str, Any]]:
        """Every complete event; a torn last line (a kill mid-write) is ignored."""
        if not self.path.is_file():
            return []
        events = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events

    def done_runs(self) -> set[str]:
        """Run ids whose completion was journalled."""
        return {e["run_id"] for e in self.events() if e.get("event") == "run_done"}


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
        return Journal(self.root / "journal.jsonl")

    def run_dir(self, run_id: str) -> Path:
        """Folder of one run."""
        return self.runs_dir / run_id

    def plan(self) -> dict[str, Any]:
        """The plan the campaign executes."""
        return read_json(self.root / "plan.json")

    def card_path(self) -> Path:
        """The card as run (a verbatim copy)."""
        return self.root / "card.yaml"

    def run_record(self, run_id: str) -> dict[str, Any] | None:
        """``run.json`` of a run, or None when the run never finished writing it."""
        path = self.run_dir(run_id) / "run.json"
        if not path.is_file():
            return None
        return read_json(path)

    def is_done(self, run_id: str) -> bool:
        """True when the run completed and its record is whole."""
        record = self.run_record(run_id)
        return record is not None and record.get("status") == RUN_OK


def open_campaign(path: Path) -> CampaignDir:
    """A campaign directory, checked to have a plan and a card."""
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

    def to_json(self) -> dict[str, Any]:
        """The record as written to ``run.json``."""
        return dict(self.__dict__)
