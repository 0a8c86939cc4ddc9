"""Logit parity: the frontier-logit dumps of a run, as hashes the ``exact_outputs`` gate compares.

ds4-bench ``--dump-frontier-logits-dir D`` writes one ``frontier_NNNNNN.logits.json`` per context
frontier (greedy argmax and the logits there). Seed 004's "frontier-logit SHA-256" is the SHA-256
over the sorted per-file hashes; here each file is also an output of its own, named by its path
inside the dump folder without the suffix (``frontier_000128``, or ``PROMPT/frontier_000128`` when
the dumps are kept per prompt), so the gate compares arms per prompt and per frontier, exactly as
it compares greedy texts. The JSON embeds more than logits (``ds4_bench.c``,
``write_frontier_logits_json``): ``source`` (the binary's name), ``model`` (the path as given),
``backend``, ``quality`` and ``ctx`` (``--ctx-alloc``, or its default ctx-max + gen-tokens + 1).
Two arms that differ in any of them hash differently with identical logits, so those values are
read back and :func:`embedded_mismatch` says when they differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import RecordError
from harness.formats.textfile import parse_json, read_bytes

LOGITS_DIR = "logits"  # under runs/<id>/: the dumps as the runtime wrote them
_SUFFIX = ".logits.json"
# Top-level JSON keys whose values are not logits yet change the file's hash: ds4-bench's
# identity fields (``ctx`` is its --ctx-alloc; ``ctx_alloc`` kept for dumps that spell it out).
_EMBEDDED = frozenset({"source", "model", "backend", "quality", "ctx", "ctx_alloc"})


@dataclass
class LogitDumps:
    """One run's dumps: SHA-256 per frontier file, and the strings they embed."""

    hashes: dict[str, str] = field(default_factory=dict)  # output name -> file SHA-256
    embedded: dict[str, set[str]] = field(default_factory=dict)  # key -> values seen

    @property
    def combined_sha256(self) -> str | None:
        """SHA-256 over the sorted per-file hashes (seed 004's frontier-logit SHA-256)."""
        if not self.hashes:
            return None
        joined = "\n".join(sorted(self.hashes.values())) + "\n"
        return hashlib.sha256(joined.encode("ascii")).hexdigest()


def read_logit_dumps(folder: Path, pattern: str = "frontier_*.logits.json") -> LogitDumps:
    """Hash every dump under ``folder`` (recursively) and read its embedded identity strings."""
    dumps = LogitDumps()
    for path in sorted(folder.rglob(pattern)):
        data = read_bytes(path, RecordError, "frontier-logit dump")
        name = path.relative_to(folder).as_posix()
        name = name[: -len(_SUFFIX)] if name.endswith(_SUFFIX) else name
        dumps.hashes[name] = hashlib.sha256(data).hexdigest()
        body: Any = parse_json(data.decode("utf-8", "replace"), str(path), RecordError)
        if isinstance(body, dict):
            for key, value in body.items():
                if key in _EMBEDDED and isinstance(value, str | int | bool):
                    shown = str(value).lower() if isinstance(value, bool) else str(value)
                    dumps.embedded.setdefault(str(key), set()).add(shown)
    return dumps


def embedded_mismatch(by_cell: dict[str, dict[str, set[str]]]) -> str | None:
    """A warning when the cells' dumps embed different identity values (model path, ctx…)."""
    keys = sorted({key for embedded in by_cell.values() for key in embedded})
    differing = []
    for key in keys:
        seen = {cell: sorted(embedded.get(key, set())) for cell, embedded in by_cell.items()}
        if len({tuple(v) for v in seen.values()}) > 1:
            shown = ", ".join(f"{cell}: {'/'.join(v) or 'absent'}" for cell, v in seen.items())
            differing.append(f"{key} ({shown})")
    if not differing:
        return None
    return (
        "frontier-logit dumps embed different strings across arms: "
        + "; ".join(differing)
        + ". Identical logits then hash differently: give every arm the same binary name, model "
        "path, backend, quality and --ctx-alloc (ds4 writes it as `ctx`)"
    )
