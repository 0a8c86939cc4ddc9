"""Verifying a campaign directory against its seal before anything is read from it.

``analyze``, ``gate``, ``report`` and ``compare`` call :func:`verify_campaign` first. A sealed
directory (:mod:`.seal`) must hold exactly what its journal vouches for: ``plan.json``
and ``card.yaml`` as last journalled, every top-level record as some journalled write left it,
every run journalled done with exactly its sealed files, no run folder the plan does not name,
no ``run.json`` whose identity disagrees with its folder and its planned run, and nothing the
campaign started with sealed again after its start. Anything else
is a :class:`VerificationError` (exit 3) naming the file. A directory started before campaign
directories were sealed is read as before (identity checks only), and said so; what a resume by
this harness added to it since is verified like any sealed record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import VerificationError
from harness.formats.heads import HeadCheck, check_heads
from harness.formats.records import (
    CAMPAIGN_JOURNAL,
    NEXT_PLAN,
    CampaignDir,
    Journal,
    line_digest,
    read_json,
)
from harness.formats.seal import START_FILES, START_FOLDERS, file_sha256, folder_files

# The fields of run.json that say which planned run it is.
_IDENTITY = ("run_id", "cell", "cycle", "slot", "repeat", "cache_state")
# Top-level records that must match the last digest journalled for them (they are rewritten
# only by the events that seal them); any other sealed record must match one journalled write.
_STRICT = ("plan.json", "card.yaml")


@dataclass(frozen=True)
class Verification:
    """The outcome of a verification that passed."""

    sealed: bool  # False: an older, unsealed directory, read with identity checks only
    runs_verified: int
    journal_head: str  # the digest of the journal's last event line (heads.Head)
    heads: HeadCheck  # the kept head that vouches for the whole journal, if one does


def _fail(root: Path, path: Path | str, what: str) -> VerificationError:
    shown = path if isinstance(path, str) else path.relative_to(root).as_posix()
    return VerificationError(f"{root / shown}: {what}")


def _event_lines(root: Path) -> list[tuple[int, bytes, dict[str, Any]]]:
    path = root / CAMPAIGN_JOURNAL
    if path.is_symlink() or not path.is_file():
        kind = "missing" if not path.exists() else "not a regular file"
        raise _fail(root, CAMPAIGN_JOURNAL, f"{kind}; the journal is what vouches for the records")
    lines = Journal(path).event_lines()
    if not any(e["event"] == "campaign_start" for _, _, e in lines):
        raise _fail(root, CAMPAIGN_JOURNAL, "holds no campaign_start event (cut short or replaced)")
    return lines


def _chained_from_start(events: list[dict[str, Any]]) -> bool:
    """Whether the journal was chained from its first event (sealed by version 2 or later)."""
    for event in events:
        if event["event"] == "campaign_start":
            version = event.get("seal")
            return isinstance(version, int) and not isinstance(version, bool) and version >= 2
    return False


def _check_chain(
    root: Path, lines: list[tuple[int, bytes, dict[str, Any]]], digests: list[str]
) -> None:
    """Each event's ``prev`` is the digest of the event line before it (``digests``, one per
    line): from the first event of a journal chained from its start, else from the first event
    that carries one (an older directory resumed by this harness)."""
    chained = _chained_from_start([e for _, _, e in lines])
    for index, (number, _, event) in enumerate(lines):
        if "prev" in event:
            chained = True
        if chained:
            expected = digests[index - 1] if index else ""
            if event.get("prev") != expected:
                raise _fail(
                    root,
                    CAMPAIGN_JOURNAL,
                    f"line {number} ({event['event']}): its prev is not the digest of the event "
                    "line before it; a line was edited, inserted or removed",
                )


def _sealed_files(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Every digest journalled for each top-level record, oldest first."""
    written: dict[str, list[str]] = {}
    for event in events:
        if event["event"] not in ("campaign_start", "campaign_extended", "sealed"):
            continue
        files = event.get("files")
        if isinstance(files, dict):
            for name, digest in files.items():
                written.setdefault(str(name), []).append(str(digest))
    return written


def _started_with(name: str) -> bool:
    """Whether ``name`` is sealed once, at the start (card, plan, quality suite, frozen
    inputs)."""
    return name in START_FILES or any(name.startswith(f"{top}/") for top in START_FOLDERS)


def _check_sealed_once(root: Path, lines: list[tuple[int, bytes, dict[str, Any]]]) -> None:
    """What a campaign starts with is sealed by its ``campaign_start`` and never again: the
    harness only grows ``plan.json`` (``campaign_extended``, which the frozen card is then held
    to), so a later event sealing the card or an input anew is an edit made to look sealed."""
    started = False
    for number, _, event in lines:
        kind = event["event"]
        if kind == "campaign_start":
            if started:
                raise _fail(
                    root,
                    CAMPAIGN_JOURNAL,
                    f"line {number}: a second campaign_start; a campaign starts once, so this "
                    "one re-seals what it started with",
                )
            started = True
            continue
        files = event.get("files")
        if kind not in ("sealed", "campaign_extended") or not isinstance(files, dict):
            continue
        for name in files:
            if _started_with(str(name)) and (kind, name) != ("campaign_extended", "plan.json"):
                raise _fail(
                    root,
                    str(name),
                    f"sealed again by journal line {number} ({kind}) after the campaign "
                    "started; what a campaign starts with is sealed once, at its start, so "
                    "this is a change made to look sealed",
                )


def _confined(root: Path, name: str) -> None:
    """A sealed name is a path inside the directory: relative, no ``..``, no link out (else the
    verifier would report on any file of the machine: a hash oracle)."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts:
        raise _fail(
            root,
            CAMPAIGN_JOURNAL,
            f"seals {name!r:.80}, which is not a path inside the campaign directory",
        )
    if not (root / name).resolve().is_relative_to(root.resolve()):
        raise _fail(root, CAMPAIGN_JOURNAL, f"seals {name!r:.80}, which leads out of the directory")


def _check_file(root: Path, name: str, allowed: list[str]) -> None:
    path = root / name
    if path.is_symlink():
        raise _fail(root, name, "is a symlink; a sealed record must be the file itself")
    if not path.is_file():
        kind = "missing" if not path.exists() else "not a regular file"
        raise _fail(root, name, f"{kind}, but the journal sealed it")
    if file_sha256(path) not in allowed:
        staged = root / NEXT_PLAN
        if name == "plan.json" and staged.is_file() and file_sha256(staged) in allowed:
            raise _fail(
                root,
                name,
                "not yet the grown plan the journal sealed: a stop cut an extension off before "
                f"renaming {NEXT_PLAN} into place; `harness run --resume {root}` finishes it",
            )
        raise _fail(root, name, "changed since it was written (its SHA-256 is not the sealed one)")


def _check_top_level(root: Path, events: list[dict[str, Any]], *, sealed: bool) -> None:
    written = _sealed_files(events)
    for name in _STRICT if sealed else ():
        if name not in written:
            raise _fail(root, CAMPAIGN_JOURNAL, f"seals no {name}; the journal was replaced")
    for name, digests in written.items():
        _confined(root, name)
        _check_file(root, name, digests[-1:] if name in _STRICT else digests)


def _done_seals(root: Path, events: list[dict[str, Any]]) -> dict[str, dict[str, str] | None]:
    """The files each run's ``run_done`` sealed (None for an unsealed ``run_done``)."""
    done: dict[str, dict[str, str] | None] = {}
    for event in events:
        run_id = event.get("run_id")
        if event["event"] != "run_done" or not isinstance(run_id, str):
            continue
        files = event.get("files")
        seal = {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None
        if run_id in done and done[run_id] != seal:
            raise _fail(
                root,
                CAMPAIGN_JOURNAL,
                f"run {run_id} journalled done twice with different records (two harnesses "
                "wrote it at once)",
            )
        done[run_id] = seal
    return done


def _check_run_files(root: Path, run_dir: Path, seal: dict[str, str]) -> None:
    present = set()
    for path in folder_files(run_dir):
        name = path.relative_to(run_dir).as_posix()
        present.add(name)
        if path.is_symlink():
            raise _fail(root, path, "is a symlink; a sealed record must be the file itself")
        if name not in seal:
            raise _fail(root, path, "was not there when the run was journalled done")
        if file_sha256(path) != seal[name]:
            raise _fail(root, path, "changed since the run was done (its SHA-256 is not sealed)")
    for name in sorted(set(seal) - present):
        raise _fail(root, run_dir / name, "missing, but the run's seal holds it")


def _check_identity(root: Path, run_dir: Path, planned: dict[str, Any]) -> dict[str, Any] | None:
    path = run_dir / "run.json"
    if path.is_symlink():
        raise _fail(root, path, "is a symlink; a run's record must be the file itself")
    if not path.is_file():
        return None
    record = read_json(path)
    for key in _IDENTITY:
        if key in record and record[key] != planned[key]:
            raise _fail(
                root,
                path,
                f"{key} {record[key]!r:.60} disagrees with plan.json's {planned[key]!r:.60} for "
                f"runs/{planned['run_id']} (a record moved or swapped)",
            )
    return record


def _check_runs(
    root: Path,
    campaign: CampaignDir,
    events: list[dict[str, Any]],
    sealed: bool,
    resuming: bool = False,
) -> int:
    planned = {run["run_id"]: run for run in campaign.plan()["runs"]}
    runs_dir = campaign.runs_dir
    if runs_dir.is_symlink() or (runs_dir.exists() and not runs_dir.is_dir()):
        raise _fail(root, "runs", "not a folder")
    if runs_dir.is_dir():
        for entry in sorted(runs_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.name not in planned:
                raise _fail(root, entry, "a run folder plan.json does not name (an extra run)")
            if entry.is_symlink() or not entry.is_dir():
                raise _fail(root, entry, "not a folder; a run's records are a folder of files")
    done = _done_seals(root, events)
    for run_id in sorted(set(done) - set(planned)):
        raise _fail(root, "plan.json", f"lacks run {run_id}, which the journal holds as done")
    verified = 0
    for run_id, run in planned.items():
        run_dir = campaign.run_dir(run_id)
        seal = done.get(run_id)
        if sealed and run_id in done and seal is None:
            raise _fail(root, CAMPAIGN_JOURNAL, f"run_done of {run_id} carries no seal")
        if seal is not None:  # in an older directory resumed since: the runs done since
            if not run_dir.is_dir():
                raise _fail(root, run_dir, "missing, but the journal holds the run as done")
            _check_run_files(root, run_dir, seal)
            verified += 1
        if not run_dir.is_dir():
            continue
        record = _check_identity(root, run_dir, run)
        unsealed_ok = record is not None and record.get("status") == "ok"
        if sealed and run_id not in done and unsealed_ok and not resuming:
            raise _fail(
                root,
                run_dir / "run.json",
                "says ok, but the journal never sealed the run as done (cut off while writing, "
                f"or edited): resume the campaign to redo it (harness run --resume {root})",
            )
    return verified


def verify_campaign(
    root: Path, *, resuming: bool = False, journal_head: str | None = None
) -> Verification:
    """Check ``root`` against its seal; a :class:`VerificationError` naming the file if not.

    The journal first: its hash chain, and every head kept for it outside the directory
    (:mod:`.heads`; ``journal_head`` is one the user kept). ``resuming``: the check ``run
    --resume`` makes before it boots anything. A run whose ``run.json`` says ok without a
    sealed ``run_done`` (a harness killed between the two) is what the resume redoes, so it
    passes here; everything else must verify."""
    campaign = CampaignDir(root)
    lines = _event_lines(root)
    digests = [line_digest(line) for _, line, _ in lines]
    _check_chain(root, lines, digests)
    events = [event for _, _, event in lines]
    heads = check_heads(root, digests, [e["event"] for e in events], journal_head)
    _check_sealed_once(root, lines)
    # Sealed from its start; an older directory resumed by this harness is sealed from then on
    # (its later records are verified, its earlier ones by identity only).
    sealed = any(e["event"] == "campaign_start" and "seal" in e for e in events)
    _check_top_level(root, events, sealed=sealed)
    verified = _check_runs(root, campaign, events, sealed, resuming)
    return Verification(sealed, verified, digests[-1], heads)


UNSEALED_NOTE = "(unverified: no seal from its start)"


def verified_source(root: Path, *, allow_unsealed: bool, command: str) -> str:
    """``root`` verified for a reader that prices or predicts from its records (``fit-cost``):
    refused (exit 3) when no seal vouches for it from its start, unless ``allow_unsealed``;
    then the name it is cited by says so, wherever the fit is read later."""
    if verify_campaign(root).sealed:
        return str(root)
    if not allow_unsealed:
        raise VerificationError(
            f"{root}: not sealed from its start (made before campaign directories were sealed, "
            f"or its seal was stripped), so nothing vouches for its records; `harness {command} "
            "--allow-unsealed` reads it unverified and says so where the fit is named"
        )
    return f"{root} {UNSEALED_NOTE}"


__all__ = ["UNSEALED_NOTE", "Verification", "verified_source", "verify_campaign"]
