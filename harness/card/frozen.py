"""A card frozen into its campaign directory, so the directory alone can run the campaign again.

``harness run`` copies every file loading the card read (:attr:`LoadedCard.inputs`) into the
campaign directory and lists them in ``inputs/manifest.json``::

    DIR/card.yaml                      the card, byte for byte
    DIR/inputs/<path as on the card>   pools, quality suite, cell files; ``..`` becomes ``_up``
    DIR/inputs/_abs/<absolute path>    those the card names by an absolute or ``~`` path
    DIR/inputs/runtimes/<name>.yaml    the runtime profile the card's name resolved to
    DIR/inputs/boxes.yaml              the boxes file that defined the card's box
    DIR/inputs/manifest.json           per file: role, as written, fields, original, copy,
                                       sha256, bytes, mtime_ns

A file over :data:`COPY_LIMIT_BYTES` (a model: a GGUF is gigabytes) is not copied: the manifest
records its hash, and a resume reads the original and refuses when it changed or is gone, since
new runs on another model would not be the same campaign. :func:`load_frozen_card` loads the
card from the copies through a :class:`~harness.card.inputs.Locator`, so nothing downstream
knows where the files came from, and says in one line per file when an original changed or is
gone.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harness.card.inputs import PATH_ROLES, InputFile, Locator
from harness.card.load import LoadedCard, load_card
from harness.errors import RecordError
from harness.formats.records import check_inside, read_json, write_json_atomic
from harness.formats.safe_write import atomic_binary_writer

MANIFEST = Path("inputs") / "manifest.json"
# Larger files are referenced by hash, not copied: a campaign directory should not hold a model.
COPY_LIMIT_BYTES = 64 * 1024 * 1024
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FrozenCard:
    """A card loaded from a campaign directory's copies, and what changed outside it."""

    loaded: LoadedCard
    notes: tuple[str, ...]  # one line per original that changed or is gone


def has_frozen_inputs(root: Path) -> bool:
    """True when the campaign directory keeps its inputs (made since inputs were frozen)."""
    return (root / MANIFEST).is_file()


def freeze_inputs(
    loaded: LoadedCard, root: Path, *, copy_limit_bytes: int = COPY_LIMIT_BYTES
) -> None:
    """Copy the card and every file it names into ``root`` and write the manifest last.

    Files over ``copy_limit_bytes`` are recorded by hash, not copied. The manifest is written
    only once every copy is in place, so a directory with one holds all of its inputs.
    """
    taken: dict[PurePosixPath, Path] = {}
    entries = []
    for item in loaded.inputs:
        stat = item.path.stat()
        copy: PurePosixPath | None = None
        if item.role == "card":
            copy = PurePosixPath("card.yaml")
        elif stat.st_size <= copy_limit_bytes:
            copy = _unique(_copy_name(item), item.path, taken)
        digest = (
            _sha256(item.path)
            if copy is None
            else _copy(item.path, check_inside(root, root / copy))
        )
        entries.append(
            {
                "role": item.role,
                "written": item.written,
                "fields": list(item.fields),
                "original": str(item.path),
                "copy": None if copy is None else str(copy),
                "sha256": digest,
                "bytes": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
            }
        )
    write_json_atomic(root / MANIFEST, {"copy_limit_bytes": copy_limit_bytes, "files": entries})


def load_frozen_card(root: Path) -> FrozenCard:
    """The card of a campaign directory, loaded from its frozen copies.

    A copy that no longer matches the manifest, or a file too large to have been copied that
    changed or is gone, is a RecordError naming the file and the fix; an original that changed
    or is gone is a note, and the copy is used.
    """
    entries = _entries(root / MANIFEST)
    notes: list[str] = []
    copies: dict[str, Path] = {}
    runtime_file: Path | None = None
    boxes_file: Path | None = None
    card_file = root / "card.yaml"
    for entry in entries:
        path = _checked(root, entry, notes)
        role = entry["role"]
        if role == "card":
            card_file = path
        elif role in PATH_ROLES:
            copies[str(entry["written"])] = path
        elif role == "runtime":
            runtime_file = path
        elif role == "boxes":
            boxes_file = path
    # Paths not in the manifest resolve under inputs/, where nothing else lives: a file the
    # card names that was not frozen is reported missing, never read from elsewhere.
    where = Locator(root / "inputs", copies, runtime_file, boxes_file, frozen=True)
    return FrozenCard(load_card(card_file, where), tuple(notes))


def frozen_paths(root: Path, role: str) -> list[Path] | None:
    """The files of one role as a resume reads them (copies, or originals too large to copy),
    in manifest order; None when the directory has no manifest."""
    if not has_frozen_inputs(root):
        return None
    entries = _entries(root / MANIFEST)
    return [
        check_inside(root, root / e["copy"]) if e.get("copy") else Path(e["original"])
        for e in entries
        if e.get("role") == role
    ]


# What each manifest entry holds, as written by freeze_inputs; null only where it writes one.
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "role": (str,),
    "written": (str,),
    "original": (str,),
    "copy": (str, type(None)),
    "sha256": (str,),
    "bytes": (int,),
    "mtime_ns": (int,),
}


def _entries(path: Path) -> list[dict[str, Any]]:
    """The manifest's entries, each checked to hold what a resume reads from it."""
    entries = read_json(path).get("files")
    if not isinstance(entries, list):
        raise RecordError(f"{path}: no `files` list; the campaign directory is damaged")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise RecordError(f"{path}: files[{index}] is not an object; the manifest is damaged")
        for key, types in _ENTRY_TYPES.items():
            value = entry.get(key)
            # A path pathlib would refuse (a NUL, longer than any file system takes) is damage.
            unusable = isinstance(value, str) and (
                not value or "\x00" in value or len(value) > 4096
            )
            if not isinstance(value, types) or isinstance(value, bool) or unusable:
                raise RecordError(
                    f"{path}: files[{index}].{key}: {value!r:.40} is not what freeze_inputs "
                    "writes; the manifest is damaged: restore it or start a new campaign"
                )
    return entries


def _checked(root: Path, entry: dict[str, Any], notes: list[str]) -> Path:
    """The file to read for one manifest entry, after checking it against its hash."""
    original = Path(entry["original"])
    recorded = str(entry["sha256"])
    if entry.get("copy") is None:
        # Too large to copy: the original is the input, and it must be the one the runs used.
        size = f"{int(entry['bytes']) / 2**30:.1f} GiB" if "bytes" in entry else "large"
        if not original.is_file():
            raise RecordError(
                f"{original}: gone; {entry['role']} {entry['written']!r} ({size}) was too large "
                "to copy into the campaign directory, so put it back at that path"
            )
        stat = original.stat()
        if (stat.st_size, stat.st_mtime_ns) != (entry.get("bytes"), entry.get("mtime_ns")):
            found = _sha256(original)
            if found != recorded:
                raise RecordError(
                    f"{original}: changed since the campaign started (sha256 {recorded[:12]} → "
                    f"{found[:12]}); it was too large to copy ({size}), and new runs on another "
                    "file would not be the same campaign: restore it or start a new campaign"
                )
        return original
    copy = check_inside(root, root / str(entry["copy"]))
    if not copy.is_file():
        raise RecordError(
            f"{copy}: missing from the campaign directory (listed in {root / MANIFEST}); "
            "restore it or start a new campaign"
        )
    found = _sha256(copy)
    if found != recorded:
        raise RecordError(
            f"{copy}: edited since the campaign started (sha256 {recorded[:12]} in "
            f"{MANIFEST}, {found[:12]} now); restore the copy or start a new campaign"
        )
    if not original.is_file():
        notes.append(f"note: {original}: gone; using the frozen copy {copy}")
    elif original.resolve() != copy.resolve():
        now = _sha256(original)
        if now != recorded:
            notes.append(
                f"note: {original}: changed since the campaign started (sha256 {recorded[:12]} "
                f"→ {now[:12]}); using the frozen copy {copy}"
            )
    return copy


def _copy_name(item: InputFile) -> PurePosixPath:
    """Where a file lands under inputs/: its path as on the card, made to stay inside."""
    if item.role == "runtime":
        return PurePosixPath("inputs", "runtimes", f"{item.written}.yaml")
    if item.role == "boxes":
        return PurePosixPath("inputs", "boxes.yaml")
    written = PurePosixPath(item.written.replace(os.sep, "/"))
    if written.is_absolute() or item.written.startswith("~"):
        return PurePosixPath("inputs", "_abs", *item.path.parts[1:])
    parts = ["_up" if part == ".." else part for part in written.parts if part != "."]
    return PurePosixPath("inputs", *parts)


def _unique(name: PurePosixPath, source: Path, taken: dict[PurePosixPath, Path]) -> PurePosixPath:
    """``name``, or ``name-2``… when another file already took it."""
    candidate, n = name, 1
    while taken.get(candidate, source) != source:
        n += 1
        candidate = name.with_name(f"{name.stem}-{n}{name.suffix}")
    taken[candidate] = source
    return candidate


def _copy(source: Path, target: Path) -> str:
    """Copy through a temp file and rename; the SHA-256 of what was copied."""
    digest = hashlib.sha256()
    with source.open("rb") as src, atomic_binary_writer(target) as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = [
    "COPY_LIMIT_BYTES",
    "MANIFEST",
    "FrozenCard",
    "freeze_inputs",
    "frozen_paths",
    "has_frozen_inputs",
    "load_frozen_card",
]
