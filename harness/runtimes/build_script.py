"""Running one of the repository's build scripts (llama.cpp, vLLM, ds4) when its output is
missing, and the cache they build into."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness.errors import InfrastructureError


def cache_root() -> Path:
    """``$HARNESS_CACHE`` or ``~/.cache/harness``: where every engine build lives."""
    return Path(os.environ.get("HARNESS_CACHE") or Path.home() / ".cache" / "harness")


def run_build_script(
    script: Path, what: str, built: Callable[[], bool], timeout_s: float = 3600
) -> None:
    """Run ``script`` unless ``built()``; InfrastructureError with the output's tail when it
    fails or leaves the build incomplete."""
    if built():
        return
    if not script.is_file():
        raise InfrastructureError(f"{script}: the build script is missing from this checkout")
    result = subprocess.run(
        ["bash", str(script)],
        cwd=script.parents[1],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if result.returncode != 0 or not built():
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise InfrastructureError(f"building {what} failed (exit {result.returncode}):\n{tail}")
