"""``.pt`` files without torch: our reader and writer against each other, and refusing pickles
that would run code. tests/engines/test_real_torch.py checks both against real torch.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.errors import BadInput
from harness.formats.torchfile import TorchFileError, read_torch_file, write_torch_file
from tests.conftest import run_cli


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


def test_a_compressed_record_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"x": 1}, protocol=2))
        archive.writestr("archive/data/0", b"\0" * (1 << 20))
    with pytest.raises(TorchFileError, match="compressed records"):
        read_torch_file(path)


def test_expanded_views_past_the_files_allowance_are_refused(tmp_path: Path) -> None:
    # Each stride-0 view (torch's expand) may exceed its storage up to 2^24 elements; a file of
    # many such views of a one-byte storage asked for unbounded memory. Five of 2^24 bytes each
    # pass the per-tensor bound and exceed the file's allowance (2^26 beyond its storages).
    path = tmp_path / "expanded.pt"
    write_torch_file(path, {f"t{i}": np.zeros(1, dtype=np.uint8) for i in range(5)})
    one = b"J\x00\x00\x00\x00(J\x01\x00\x00\x00t(J\x01\x00\x00\x00t"  # offset 0, size (1,), (1,)
    wide = b"J\x00\x00\x00\x00(J\x00\x00\x00\x01t(J\x00\x00\x00\x00t"  # size (2^24,), stride (0,)
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert data.count(one) == 5
                data = data.replace(one, wide)
            target.writestr(info.filename, data)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(TorchFileError, match="more elements than its storages"):
        read_torch_file(path)
