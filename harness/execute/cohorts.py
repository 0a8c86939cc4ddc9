"""Cohort validity, kept in ``cohorts.json``: which cohorts the guards checked, and which broke.

A cohort is invalid once any of its checks fails, any of its runs is aborted by a guard, or the
runtime binary changes between its runs. Invalid is final: its remaining runs are not run, its
failed runs are not retried, and ``--resume`` reads the file back, so no rerun repairs it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.execute.guards import GuardCheck
from harness.formats.records import read_json, write_sealed_json

COHORTS_FILE = "cohorts.json"


@dataclass
class CohortBook:
    """The cohorts of one campaign directory, written through on every change."""

    path: Path
    enabled: bool
    why: str
    cohorts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A fleet's workers record their cohorts from several threads into the one file.
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @classmethod
    def open(cls, root: Path, enabled: bool, why: str) -> CohortBook:
        """The book of ``root``, with what an earlier (interrupted) run of it recorded."""
        path = root / COHORTS_FILE
        book = cls(path, enabled, why)
        if path.is_file():
            book.cohorts = dict(read_json(path).get("cohorts") or {})
        return book

    def checked(self, key: str) -> bool:
        """True once the cohort's before-checks ran."""
        return key in self.cohorts

    def record_checks(self, key: str, checks: list[GuardCheck]) -> None:
        """Keep a cohort's before-checks; a failed one invalidates it."""
        with self.lock:
            entry = self._entry(key)
            entry["checks"] = [c.to_json() for c in checks]
            for check in checks:
                if not check.passed:
                    entry["valid"] = False
                    entry["reasons"].append(f"{check.guard}: {check.reason}")
            self._write()

    def invalidate(self, key: str, reason: str) -> None:
        """Mark a cohort invalid, saying why."""
        with self.lock:
            entry = self._entry(key)
            entry["valid"] = False
            entry["reasons"].append(reason)
            self._write()

    def invalid_reason(self, key: str) -> str | None:
        """Why a cohort is invalid, or None while it is valid."""
        entry = self.cohorts.get(key)
        if entry is None or entry.get("valid", True):
            return None
        return "; ".join(entry.get("reasons") or ["invalid"])

    def binary(self, key: str, sha256: str | None) -> str | None:
        """Note the binary a run of the cohort used; a reason when it differs from the first."""
        with self.lock:
            entry = self._entry(key)
            first = entry.get("binary_sha256")
            if first is None:
                entry["binary_sha256"] = sha256
                self._write()
                return None
            if sha256 != first:
                return f"runtime binary changed within the cohort ({first} -> {sha256})"
            return None

    def adopt(self, key: str, entry: dict[str, Any]) -> None:
        """Take in what another book (a Slurm job's, on its node) recorded of a cohort: its
        checks and binary, and its invalidity, which stays final."""
        with self.lock:
            mine = self._entry(key)
            mine["valid"] = bool(mine.get("valid", True) and entry.get("valid", True))
            mine["reasons"].extend(
                r for r in entry.get("reasons") or [] if r not in mine["reasons"]
            )
            if entry.get("checks"):
                mine["checks"] = list(entry["checks"])
            if entry.get("binary_sha256") is not None:
                mine.setdefault("binary_sha256", entry["binary_sha256"])
            self._write()

    def _entry(self, key: str) -> dict[str, Any]:
        return self.cohorts.setdefault(key, {"valid": True, "reasons": [], "checks": []})

    def _write(self) -> None:
        with self.lock:
            payload = {"enabled": self.enabled, "why": self.why, "cohorts": self.cohorts}
            write_sealed_json(self.path.parent, self.path, payload)
