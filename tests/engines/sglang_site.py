"""The engines' released wheels installed whole, and what stands in for a GPU box on this CPU.

Shared by the tests that import SGLang 0.5.23, sglang-kt 0.7.2 and kt-kernel 0.7.2 as shipped:
each release is installed with ``pip install --no-deps --target`` into its own folder of the
harness cache (made once, marked complete), with the pure-Python modules their import needs and
vLLM's venv lacks, and run in vLLM's venv (python 3.11, CPU torch) with that folder on sys.path.

``STAND_INS`` is the preamble such a run starts with. It stands in only for what cannot load
on a CPU:

- ``sgl_kernel`` (SGLang's CUDA kernels; the PyPI build, and the one kt-kernel's wheel ships,
  need a GPU to load): an empty package whose names are placeholders, and
  ``torch.library.register_fake`` skips the ``sgl_kernel::`` ops SGLang registers fake kernels
  for (the extension would have defined them). Nothing run here calls a kernel.
- ``torchvision``: the only build on the index links ``libc10_cuda`` and fails to load against
  CPU torch. SGLang's multimodal modules import its transforms at import time; nothing run here
  calls them. transformers is told (before the stand-in goes in) that torchvision is absent.
- The GPU: CUDA reported available, eight H100s (compute capability 9.0, 80 GiB), and (with
  ``gpu_env``) an ``nvidia-smi`` on PATH that prints their memory.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from harness.runtimes.build_script import cache_root

# What the releases import and vLLM's venv lacks: pure Python, or CPU wheels.
IMPORT_NEEDS = ["orjson", "ipython", "traitlets", "gguf", "nvidia-ml-py"]
SITES_VARIABLE = "HARNESS_ENGINE_SITES"


def site(name: str, wheels: list[Path], python: str, needs: list[str] | None = None) -> Path:
    """The release installed whole into its own folder of the harness cache, made once."""
    folder = cache_root() / f"{name}-site"
    done = folder / ".harness-complete"
    if not done.exists():
        subprocess.run(
            [python, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(folder),
             *map(str, wheels), *(IMPORT_NEEDS if needs is None else needs)],
            check=True, timeout=1800,
        )  # fmt: skip
        done.touch()
    return folder


def gpu_env(folder: Path, sites: list[Path]) -> dict[str, str]:
    """The environment a run gets: the sites (first wins) for ``STAND_INS`` to put on
    sys.path, a fake ``nvidia-smi`` of eight H100s on PATH, no network, a home of its own."""
    fake = folder / "bin"
    fake.mkdir(exist_ok=True)
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor gpu in 0 1 2 3 4 5 6 7; do echo 81559; done\n")
    smi.chmod(0o755)
    return {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(folder), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "SGLANG_PLATFORM": "",
            SITES_VARIABLE: os.pathsep.join(map(str, sites))}  # fmt: skip


# Runs in vLLM's venv before anything of the releases is imported: the stand-ins (the module
# docstring says which and why), then the sites on sys.path.
STAND_INS = r"""
import importlib.abc, importlib.machinery, os, sys, types
import torch
from transformers.utils import import_utils

class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(name)

def placeholder(name):
    return _Placeholder(name, (), {"__init__": lambda self, *a, **k: None,
                                   "__call__": lambda self, *a, **k: placeholder(name)})

class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = ("sgl_kernel", "torchvision")
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        def missing(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return placeholder(attr)
        module.__getattr__ = missing
        return module
    def exec_module(self, module):
        module.__path__ = []

assert not import_utils.is_torchvision_available()  # cached: transformers sees none
sys.meta_path.insert(0, StandIns())
real_register_fake = torch.library.register_fake
def register_fake(op, *args, **kwargs):
    if isinstance(op, str) and op.startswith("sgl_kernel::"):
        return None if args else (lambda fn: fn)
    return real_register_fake(op, *args, **kwargs)
torch.library.register_fake = register_fake
h100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30, major=9,
                             minor=0, multi_processor_count=132)
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 8
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: h100.name
torch.cuda.get_device_properties = lambda *a, **k: h100
torch.cuda.mem_get_info = lambda *a, **k: (79 * 2**30, 80 * 2**30)
torch.version.cuda = "12.9"
sys.path[:0] = os.environ["HARNESS_ENGINE_SITES"].split(os.pathsep)
"""


def ask(process: subprocess.Popen[str], job: Any, log: Path) -> Any:
    """Send one JSON job to a long-lived engine process and read its answer (the line marked
    ``@@``); the process's log tail when it ends without one."""
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(job) + "\n")
    process.stdin.flush()
    for line in process.stdout:
        if line.startswith("@@"):
            return json.loads(line[2:])
    raise AssertionError(log.read_text()[-4000:])


def close(process: subprocess.Popen[str]) -> None:
    """End a long-lived engine process: its input closed, then waited for, killed past 60 s."""
    assert process.stdin is not None and process.stdout is not None
    if not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(timeout=60)
    finally:
        process.kill()  # a no-op once it has exited
        process.stdout.close()
