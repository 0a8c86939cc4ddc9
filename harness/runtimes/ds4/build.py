"""Where ``make ds4`` puts ds4's CPU binaries and the Flash-shaped model, and making them.

``scripts/build-ds4.sh`` unpacks the seed-004 source tarball (``../shared/third_party/ds4/``, or
``$HARNESS_DS4_TARBALL``) and builds ``make cpu`` into ``$HARNESS_CACHE/ds4/<ds4-commit>/bin``
(``HARNESS_CACHE`` defaults to ``~/.cache/harness``), pointing the stable link
``$HARNESS_CACHE/ds4/bin`` at it. ``harness make-ds4-model`` writes the random-weight model to
``$HARNESS_CACHE/ds4/models/ds4flash-random.gguf``. Both are reused when present.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import InfrastructureError
from harness.runtimes.build_script import cache_root, run_build_script

BINARIES = ("ds4", "ds4-server", "ds4-bench")
BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-ds4.sh"
DEFAULT_MODEL = "ds4flash-random.gguf"
DEFAULT_SEED = 1


def bin_dir() -> Path:
    """The stable directory of the built binaries (a link to the tarball commit's build)."""
    return cache_root() / "ds4" / "bin"


def model_path() -> Path:
    """Where the default random-weight Flash model lives."""
    return cache_root() / "ds4" / "models" / DEFAULT_MODEL


def built() -> bool:
    """True when every binary of :data:`BINARIES` is there."""
    return all((bin_dir() / name).is_file() for name in BINARIES)


def binary(name: str) -> Path:
    """The path of one built binary; InfrastructureError naming the fix when it is missing."""
    path = bin_dir() / name
    if not path.is_file():
        raise InfrastructureError(f"{path}: not built; run `make ds4` (under a minute on 2 cores)")
    return path


def ensure_built(timeout_s: float = 1800) -> Path:
    """Build the binaries from the source tarball when missing; returns :func:`bin_dir`."""
    run_build_script(BUILD_SCRIPT, "ds4", built, timeout_s)
    return bin_dir()


def ensure_model(seed: int = DEFAULT_SEED) -> Path:
    """Write the default model when it is missing; returns its path."""
    from harness.runtimes.ds4.flash_model import write_flash_model

    target = model_path()
    if not target.is_file():
        write_flash_model(target, seed)
    return target
