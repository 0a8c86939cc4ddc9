"""Golden files: what people read, pinned whole (benchstat's pattern).

:func:`assert_golden` compares a text with ``tests/data/golden/NAME``. On a mismatch it writes the
got-file beside the golden one (``NAME.got``) and fails with a unified diff; with
``HARNESS_UPDATE_GOLDEN=1`` it rewrites the golden file instead, so an intended change is one
rerun and a reviewed diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


def assert_golden(name: str, got: str) -> None:
    """Fail with a diff unless ``got`` is exactly the golden file ``name``."""
    path = GOLDEN / name
    if os.environ.get("HARNESS_UPDATE_GOLDEN"):
        path.write_text(got, encoding="utf-8")
    want = path.read_text(encoding="utf-8") if path.is_file() else ""
    if got == want:
        return
    got_path = path.with_name(path.name + ".got")
    got_path.write_text(got, encoding="utf-8")
    diff = "".join(
        difflib.unified_diff(
            want.splitlines(keepends=True), got.splitlines(keepends=True), str(path), str(got_path)
        )
    )
    raise AssertionError(
        f"{name} differs from its golden file (got-file: {got_path}; rerun with "
        f"HARNESS_UPDATE_GOLDEN=1 if the change is meant):\n{diff}"
    )
