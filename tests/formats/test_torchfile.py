"""``.pt`` files without torch: our reader and writer against each other, against real torch both
ways, and refusing pickles that would run code.

Real torch is the one in vLLM's venv (``make vllm``: ``~/.cache/harness/vllm/<version>/venv``),
or ``$HARNESS_TORCH_PYTHON``; those tests skip, saying so, only where no interpreter imports
torch.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.errors import BadInput
from harness.formats.torchfile import TorchFileError, read_torch_file, write_torch_file
from harness.runtimes.vllm.build import cache_root
from tests.conftest import run_cli


def _torch_python() -> str | None:
    """An interpreter that imports torch: $HARNESS_TORCH_PYTHON, else vLLM's venv(s)."""
    candidates = [os.environ.get("HARNESS_TORCH_PYTHON", "")]
    root = cache_root() / "vllm"
    candidates.append(str(root / "venv" / "bin" / "python"))
    candidates += sorted(str(p) for p in root.glob("*/venv/bin/python"))
    for python in candidates:
        if python and Path(python).is_file():
            done = subprocess.run(
                [python, "-c", "import torch"], capture_output=True, timeout=120, check=False
            )
            if done.returncode == 0:
                return python
    return None


TORCH = _torch_python()
needs_torch = pytest.mark.skipif(
    TORCH is None,
    reason="no interpreter with torch: `make vllm` builds vLLM's venv (torch included) into "
    "~/.cache/harness/vllm, or set HARNESS_TORCH_PYTHON",
)


def _torch(code: str, *args: str) -> str:
    assert TORCH is not None
    done = subprocess.run(
        [TORCH, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_our_files_read_back_with_every_dtype_and_shape(tmp_path: Path) -> None:
    data = {
        "rank": 0,
        "logical_count": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "gpu_expert_masks": np.arange(24).reshape(2, 3, 4) % 3 == 0,
        "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not contiguous
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 5), dtype=np.int64),
        "halves": np.array([0.5, -2.0], dtype=np.float16),
        "bytes": np.array([1, 255], dtype=np.uint8),
        "nested": {"list": [1, 2**40, -(2**40), "x", None, True, 2.5], "tuple": (1, "a")},
        "average_utilization_rate_over_window": None,
    }
    path = tmp_path / "dump.pt"
    write_torch_file(path, data)
    back = read_torch_file(path)
    assert set(back) == set(data)
    for key in ("logical_count", "gpu_expert_masks", "transposed", "scalar", "empty"):
        assert back[key].dtype == data[key].dtype, key
        assert back[key].shape == data[key].shape, key
        assert np.array_equal(back[key], data[key]), key
    assert back["halves"].tolist() == [0.5, -2.0] and back["bytes"].tolist() == [1, 255]
    assert back["nested"] == {"list": [1, 2**40, -(2**40), "x", None, True, 2.5], "tuple": (1, "a")}
    assert back["rank"] == 0 and back["average_utilization_rate_over_window"] is None
    # Storage records start on 64-byte boundaries, as torch writes them.
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename:
                start = info.header_offset + 30 + len(info.filename) + len(info.extra)
                assert start % 64 == 0, info.filename


def _malicious(path: Path) -> None:
    """A torch-shaped zip whose pickle calls os.system when unpickled by plain pickle."""

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch " + str(path.parent / "pwned"),))

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"logical_count": Boom()}, protocol=2))
        archive.writestr("archive/version", "3\n")


def test_a_pickle_that_calls_a_function_is_refused_and_never_run(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    _malicious(path)
    with pytest.raises(TorchFileError) as caught:
        read_torch_file(path)
    assert isinstance(caught.value, BadInput)
    assert str(path) in str(caught.value)
    assert "refused global" in str(caught.value) and "system" in str(caught.value)
    assert not (tmp_path / "pwned").exists()
    # Through the CLI: bad input, exit 2, the file named, no traceback.
    result = run_cli("fit-map", str(path), "--format", "kt-frequency", "-o", str(tmp_path / "o.pt"))
    assert result.code == 2, result.stdout + result.stderr
    assert str(path) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a zip at all", "not a torch file"),
        (None, "found 0"),  # a zip without <name>/data.pkl
    ],
)
def test_files_that_are_not_torch_zips_are_refused(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "bad.pt"
    if content is None:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/other", b"x")
    else:
        path.write_bytes(content)
    with pytest.raises(TorchFileError, match=message):
        read_torch_file(path)


def test_a_tensor_reaching_past_its_storage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.pt"
    write_torch_file(path, {"t": np.arange(4, dtype=np.int64)})
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            target.writestr(info.filename, data[:16] if info.filename.endswith("data/0") else data)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(TorchFileError, match="need 32 bytes, the record holds 16"):
        read_torch_file(path)


@needs_torch
def test_a_file_real_torch_saved_reads_here(tmp_path: Path) -> None:
    path = tmp_path / "torch.pt"
    _torch(
        "import sys, collections, torch\n"
        "base = torch.arange(60, dtype=torch.int32).reshape(3, 4, 5)\n"
        "torch.save({'rank': 0, 'logical_count': base,\n"
        "  'gpu_expert_masks': (base % 2 == 0),\n"
        "  'view': base[1:, :, 2:],  # storage offset and strides of a view\n"
        "  'f': torch.tensor([[1.5, 2.5]], dtype=torch.float64).t(),\n"
        "  'od': collections.OrderedDict(a=1), 'avg': None, 'x': 0.25}, sys.argv[1])\n",
        str(path),
    )
    back = read_torch_file(path)
    base = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    assert back["logical_count"].dtype == np.int32
    assert np.array_equal(back["logical_count"], base)
    assert np.array_equal(back["gpu_expert_masks"], base % 2 == 0)
    assert np.array_equal(back["view"], base[1:, :, 2:])
    assert np.array_equal(back["f"], np.array([[1.5], [2.5]]))
    assert back["od"] == {"a": 1} and back["avg"] is None and back["x"] == 0.25


@needs_torch
def test_our_file_loads_in_real_torch_weights_only_with_equal_arrays(tmp_path: Path) -> None:
    path = tmp_path / "ours.pt"
    counts = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    masks = counts % 3 == 0
    write_torch_file(
        path,
        {
            "rank": 0,
            "logical_count": counts,
            "gpu_expert_masks": masks,
            "scalar": np.array(9, dtype=np.int64),
            "f": np.array([0.5, 1.25], dtype=np.float32),
            "average_utilization_rate_over_window": None,
            "meta": {"list": [1, "a", 2.5], "tuple": (3, 4)},
        },
    )
    out = _torch(
        "import sys, json, torch\n"
        "d = torch.load(sys.argv[1], weights_only=True)\n"
        "print(json.dumps({k: (str(v.dtype), list(v.shape), v.tolist())\n"
        "  if isinstance(v, torch.Tensor) else repr(v) for k, v in d.items()}))\n",
        str(path),
    )
    got = json.loads(out)
    assert got["logical_count"] == ["torch.int32", [2, 3, 4], counts.tolist()]
    assert got["gpu_expert_masks"] == ["torch.bool", [2, 3, 4], masks.tolist()]
    assert got["scalar"] == ["torch.int64", [], 9]
    assert got["f"] == ["torch.float32", [2], [0.5, 1.25]]
    assert got["rank"] == "0" and got["average_utilization_rate_over_window"] == "None"
    assert got["meta"] == repr({"list": [1, "a", 2.5], "tuple": (3, 4)})


def test_a_compressed_record_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"x": 1}, protocol=2))
        archive.writestr("archive/data/0", b"\0" * (1 << 20))
    with pytest.raises(TorchFileError, match="compressed records"):
        read_torch_file(path)
