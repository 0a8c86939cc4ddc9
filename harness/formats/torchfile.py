"""PyTorch ``.pt`` files without torch: a restricted reader and a writer for plain tensors.

A file ``torch.save`` writes is an uncompressed zip whose entries share one folder prefix
(``<name>/``): ``data.pkl`` (a pickle of the saved object), ``data/<key>`` (the raw bytes of each
storage, little-endian), ``version`` and, from torch 2, ``byteorder``. In the pickle a tensor is
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[,
metadata])`` and a storage is a persistent id ``('storage', torch.<Type>Storage, key, location,
numel)``.

Reading unpickles with an allow-list: tensor rebuilds, the storage types, ``OrderedDict``, and
the pickle's own dicts, lists, tuples, numbers, strings, booleans and None. Any other global (a
class, a function, ``os.system``) refuses the file as bad input before anything is called.
Tensors come back as numpy arrays (copies, owning their memory).

Writing emits those same records for a dict of numpy arrays, numbers, strings and lists, so
``torch.load(path, weights_only=True)`` reads it back (the dumps the reference runtime writes in
SGLang's recorder format, and the ``--init-expert-location`` files ``fit-map`` writes).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import BadInput
from harness.formats.safe_write import atomic_binary_writer

__all__ = ["TorchFileError", "read_torch_file", "write_torch_file"]

# torch storage type name -> numpy dtype (little-endian, as torch writes on every platform we
# support; a file whose `byteorder` record says "big" is swapped on read).
_STORAGES: dict[str, str] = {
    "DoubleStorage": "<f8",
    "FloatStorage": "<f4",
    "HalfStorage": "<f2",
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}
_DTYPE_STORAGE = {np.dtype(code): name for name, code in _STORAGES.items()}

# Zip records of storages start on 64-byte boundaries, as torch aligns them (so a loader that
# maps the file can view them in place).
_ALIGN = 64
_FORMAT_VERSION = b"3\n"
# The most elements a tensor may hold beyond its storage's size (a stride-0 view).
_MAX_EXPANDED = 1 << 24
# The most elements all of a file's tensors may hold beyond its storages' bytes: each stride-0
# view is bounded above, and this bounds how many a file may ask for.
_MAX_EXPANDED_TOTAL = 1 << 26


class TorchFileError(BadInput):
    """A ``.pt`` file that is not a torch zip of plain tensors and containers."""


class _Storage:
    """One storage of the file: its element type and raw bytes."""

    def __init__(self, dtype: np.dtype[Any], data: bytes) -> None:
        self.dtype = dtype
        self.data = data


def _rebuild_tensor(
    storage: _Storage,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool = False,
    hooks: object = None,
    metadata: object = None,
) -> npt.NDArray[Any]:
    """A tensor's view of its storage as an owned numpy array (offset and strides in
    elements)."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor rebuild without a storage")
    flat = np.frombuffer(storage.data, dtype=storage.dtype)
    if any(not isinstance(n, int) or n < 0 for n in (offset, *size, *stride)):
        raise pickle.UnpicklingError("a tensor with a negative size, stride or offset")
    if len(size) != len(stride):
        raise pickle.UnpicklingError("a tensor whose size and stride differ in length")
    native = storage.dtype.newbyteorder("=")
    numel = int(np.prod(size, dtype=np.float64))
    if numel > max(flat.size, _MAX_EXPANDED):
        # Only stride-0 views (torch's expand) exceed their storage; a hostile file would ask
        # for billions of elements from one.
        raise pickle.UnpicklingError(
            f"a tensor of {numel:.0f} elements over a storage of {flat.size}"
        )
    if any(n == 0 for n in size):
        return np.zeros(size, dtype=native)
    if not size:  # a 0-d tensor: one element
        if offset >= flat.size:
            raise pickle.UnpicklingError("a 0-d tensor past the end of its storage")
        return np.array(flat[offset], dtype=native)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= flat.size:
        raise pickle.UnpicklingError(
            f"a tensor reaches element {last} of a storage of {flat.size} elements"
        )
    item = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
    )
    return np.array(view, dtype=native)


class _StorageType:
    """A ``torch.<Type>Storage`` named in a persistent id (its dtype, nothing callable)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(_STORAGES[name])


def _fresh(target: Any) -> Any:
    """A new callable forwarding to ``target``."""

    def call(*args: Any) -> Any:
        return target(*args)

    return call


class _Unpickler(pickle.Unpickler):
    """The allow-list unpickler: tensor rebuilds, storages, OrderedDict; nothing else."""

    def __init__(self, data: bytes, storages: Mapping[str, bytes], swap: bool) -> None:
        super().__init__(io.BytesIO(data))
        self._records = storages
        self._swap = swap
        self._loaded: dict[str, _Storage] = {}
        # Elements the file's tensors may hold in all: what its storages hold, plus a bounded
        # allowance for expanded views.
        self._budget = sum(len(v) for k, v in storages.items() if k.startswith("data/"))
        self._budget += _MAX_EXPANDED_TOTAL

    def _rebuild(self, *args: Any) -> npt.NDArray[Any]:
        tensor = _rebuild_tensor(*args)
        self._budget -= tensor.size
        if self._budget < 0:
            raise pickle.UnpicklingError(
                "the file's tensors hold more elements than its storages and the allowance "
                "for expanded views: refused before they fill memory"
            )
        return tensor

    def find_class(self, module: str, name: str) -> Any:
        # A fresh object per global named: a BUILD opcode aimed at it changes only that object,
        # never this module's function or the OrderedDict class.
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _fresh(self._rebuild)
        if (module, name) == ("collections", "OrderedDict"):
            return _fresh(OrderedDict)
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        raise pickle.UnpicklingError(
            f"refused global {module}.{name}: only tensors, storages, OrderedDict and plain "
            "containers are read"
        )

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"refused persistent id {pid!r}: not a storage")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str):
            raise pickle.UnpicklingError(f"refused persistent id {pid!r}: not a storage")
        if key in self._loaded:
            return self._loaded[key]
        data = self._records.get(f"data/{key}")
        if data is None:
            raise pickle.UnpicklingError(f"storage {key} has no data/{key} record")
        dtype = kind.dtype.newbyteorder(">") if self._swap else kind.dtype
        if isinstance(numel, int) and numel * dtype.itemsize > len(data):
            raise pickle.UnpicklingError(
                f"storage {key}: {numel} elements need {numel * dtype.itemsize} bytes, "
                f"the record holds {len(data)}"
            )
        storage = _Storage(dtype, data)
        self._loaded[key] = storage
        return storage


def _records(path: str, archive: zipfile.ZipFile) -> dict[str, bytes]:
    """Entries by name below the archive's one folder prefix."""
    infos = [info for info in archive.infolist() if not info.is_dir()]
    packed = [info.filename for info in infos if info.compress_type != zipfile.ZIP_STORED]
    if packed:
        # torch stores records uncompressed; a compressed one could inflate past memory.
        raise TorchFileError(f"{path}: compressed records ({packed[0]}): not a torch file")
    names = [info.filename for info in infos]
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise TorchFileError(
            f"{path}: not a torch file (a zip holding one <name>/data.pkl; found {len(pickles)})"
        )
    prefix = pickles[0][: -len("data.pkl")]
    return {n[len(prefix) :]: archive.read(n) for n in names if n.startswith(prefix)}


def read_torch_file(path: str | os.PathLike[str]) -> Any:
    """The object a ``torch.save`` file holds, tensors as numpy arrays.

    Raises :class:`TorchFileError` (bad input, exit 2) naming the file for anything else: not a
    zip, no ``data.pkl``, a global outside the allow-list, a storage record too short.
    """
    name = os.fspath(path)
    try:
        with zipfile.ZipFile(name) as archive:
            records = _records(name, archive)
    except FileNotFoundError:
        raise TorchFileError(f"{name}: no such file") from None
    except TorchFileError:
        raise
    except Exception as exc:  # zipfile raises many kinds on damaged bytes; all are bad input
        raise TorchFileError(
            f"{name}: not a torch file (torch.save's zip format; legacy pickles are not read): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    order = records.get("byteorder", b"little").strip()
    if order not in (b"little", b"big"):
        raise TorchFileError(f"{name}: byteorder record {order!r} is neither little nor big")
    try:
        return _Unpickler(records["data.pkl"], records, order == b"big").load()
    except Exception as exc:  # any failure of a damaged or hostile pickle is bad input
        raise TorchFileError(f"{name}: refused as bad input: {exc}") from None


# -- writing ----------------------------------------------------------------------------------


class _Writer:
    """Pickle protocol 2 opcodes for plain containers and tensors, written by hand: the globals
    torch expects cannot be pickled by reference without torch installed."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.storages: list[bytes] = []

    def emit(self, value: Any) -> None:
        out = self.out
        if value is None:
            out += b"N"
        elif isinstance(value, bool | np.bool_):
            out += b"\x88" if value else b"\x89"
        elif isinstance(value, int | np.integer):
            self._int(int(value))
        elif isinstance(value, float | np.floating):
            out += b"G" + struct.pack(">d", float(value))
        elif isinstance(value, str):
            raw = value.encode("utf-8")
            out += b"X" + struct.pack("<I", len(raw)) + raw
        elif isinstance(value, np.ndarray):
            self._tensor(value)
        elif isinstance(value, Mapping):
            out += b"}"
            if value:
                out += b"("
                for key, item in value.items():
                    self.emit(key)
                    self.emit(item)
                out += b"u"
        elif isinstance(value, list):
            out += b"]"
            if value:
                out += b"("
                for item in value:
                    self.emit(item)
                out += b"e"
        elif isinstance(value, tuple):
            out += b"("
            for item in value:
                self.emit(item)
            out += b"t"
        else:
            raise TypeError(f"cannot write {type(value).__name__} to a torch file")

    def _int(self, value: int) -> None:
        if -(2**31) <= value < 2**31:
            self.out += b"J" + struct.pack("<i", value)
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(raw)]) + raw

    def _tensor(self, array: npt.NDArray[Any]) -> None:
        contiguous = np.array(array, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        if contiguous.dtype.byteorder == ">":
            contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
        storage = _DTYPE_STORAGE.get(contiguous.dtype)
        if storage is None:
            raise TypeError(f"no torch storage for numpy dtype {contiguous.dtype}")
        key = str(len(self.storages))
        self.storages.append(contiguous.tobytes())
        # Row-major strides in elements (computed, not read: numpy reports 0-sized dims oddly).
        stride = tuple(int(np.prod(contiguous.shape[i + 1 :])) for i in range(contiguous.ndim))
        self.out += b"ctorch._utils\n_rebuild_tensor_v2\n("
        # The persistent id: ('storage', torch.<Type>Storage, key, 'cpu', numel).
        self.out += b"(X" + struct.pack("<I", 7) + b"storage"
        self.out += f"ctorch\n{storage}\n".encode()
        self.emit(key)
        self.emit("cpu")
        self.emit(int(contiguous.size))
        self.out += b"tQ"
        self.emit(0)
        self.emit(tuple(int(n) for n in contiguous.shape))
        self.emit(stride)
        self.out += b"\x89"  # requires_grad False
        self.out += b"ccollections\nOrderedDict\n)R"  # no backward hooks
        self.out += b"tR"


def _aligned(archive: zipfile.ZipFile, handle: Any, name: str, data: bytes) -> None:
    """Write one stored record whose data starts on a 64-byte boundary (padding in the extra
    field, as torch does)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    offset = handle.tell() + 30 + len(name.encode())
    pad = (-(offset + 4)) % _ALIGN
    info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    archive.writestr(info, data)


def write_torch_file(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` (a numpy array, or dicts, lists and tuples of them, numbers, strings,
    None) as a torch file, atomically (harness.formats.safe_write)."""
    writer = _Writer()
    writer.emit(obj)
    writer.out += b"."
    target = Path(path)
    prefix = "archive"
    with atomic_binary_writer(target) as handle, zipfile.ZipFile(handle, "w") as archive:
        _aligned(archive, handle, f"{prefix}/data.pkl", bytes(writer.out))
        _aligned(archive, handle, f"{prefix}/byteorder", b"little")
        for key, data in enumerate(writer.storages):
            _aligned(archive, handle, f"{prefix}/data/{key}", data)
        _aligned(archive, handle, f"{prefix}/version", _FORMAT_VERSION)
