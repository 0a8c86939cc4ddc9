"""Where ``make llama-server`` puts llama.cpp's binaries, and building them when missing.

``scripts/build-llama-server.sh`` builds into ``$HARNESS_CACHE/llama.cpp/<version>-<cpu>/bin``
(``HARNESS_CACHE`` defaults to ``~/.cache/harness``) and points the stable link
``$HARNESS_CACHE/llama.cpp/bin`` at it; the ``llama-cpp`` runtime profile boots that link.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.errors import InfrastructureError
from harness.runtimes.build_script import cache_root, run_build_script

# The llama-cpp-python release whose vendored llama.cpp `make llama-server` builds: the default
# of scripts/build-llama-server.sh (a test checks they agree).
PINNED_VERSION = "0.3.36"
BINARIES = ("llama-server", "llama-bench", "llama-eval-callback")
DEFAULT_VOCAB = "ggml-vocab-llama-spm.gguf"
BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-llama-server.sh"


def bin_dir() -> Path:
    """The stable directory of the built binaries (a link to the pinned version's build)."""
    return cache_root() / "llama.cpp" / "bin"


def pinned_version() -> str:
    """``$HARNESS_LLAMA_CPP_PY_VERSION`` or :data:`PINNED_VERSION`: the build to use."""
    return os.environ.get("HARNESS_LLAMA_CPP_PY_VERSION") or PINNED_VERSION


def built() -> bool:
    """True when the stable link points at the pinned version's build and every binary of
    :data:`BINARIES` is there (a cache of an older pin is rebuilt, not booted)."""
    link = bin_dir()
    return link.resolve().parent.name.startswith(f"{pinned_version()}-") and all(
        (link / name).is_file() for name in BINARIES
    )


def binary(name: str) -> Path:
    """The path of one built binary; InfrastructureError naming the fix when it is missing."""
    path = bin_dir() / name
    if not path.is_file():
        raise InfrastructureError(
            f"{path}: not built; run `make llama-server` (about 5 minutes on 2 cores, once)"
        )
    return path


def default_vocab() -> Path:
    """The vocab-only GGUF the build keeps from the llama.cpp sources (llama SPM, 32000 tokens)."""
    return bin_dir() / "models" / DEFAULT_VOCAB


def ensure_built(timeout_s: float = 3600) -> Path:
    """Build the binaries with the build script when missing; returns :func:`bin_dir`."""
    run_build_script(BUILD_SCRIPT, "llama.cpp", built, timeout_s)
    return bin_dir()
