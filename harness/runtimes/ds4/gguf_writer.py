"""A minimal GGUF v3 writer whose tensors may share one data region.

The ``gguf`` package gives every tensor its own bytes; a DeepSeek-V4-Flash-shaped file written that
way is 86 GB. GGUF only records an offset per tensor, and ds4 never checks that two tensors'
bytes do not overlap, so here every tensor names a *region* and tensors of one region point at
the same offset: the file holds each distinct (type, shape) once.

Layout (little-endian): magic ``GGUF``, version 3, tensor count, key-value count; the key-value
pairs; the tensor infos (name, dims in GGUF order, type, offset relative to the data section);
padding to ``general.alignment`` (32); the regions, each aligned.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from harness.formats.safe_write import atomic_binary_writer

ALIGNMENT = 32

# GGUF value types (the metadata's, not the tensors').
U32, I32, F32, BOOL, STRING, ARRAY, U64 = 4, 5, 6, 7, 8, 9, 10

# GGUF tensor types this writer knows the block size of: (elements per block, bytes per block).
TENSOR_TYPES: dict[str, tuple[int, int, int]] = {  # name: (ggml type id, block elems, block bytes)
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84),
    "IQ2_XXS": (16, 256, 66),
    "I32": (26, 1, 4),
}


@dataclass(frozen=True)
class Value:
    """One metadata value with its GGUF type; ``element`` is the array's element type."""

    kind: int
    value: object
    element: int = 0


@dataclass(frozen=True)
class Region:
    """Bytes shared by every tensor of one type and shape; ``fill`` writes them."""

    type_name: str
    dims: tuple[int, ...]
    fill: Callable[[BinaryIO, int], None]  # (handle, byte count)

    @property
    def nbytes(self) -> int:
        _, block_elems, block_bytes = TENSOR_TYPES[self.type_name]
        elements = 1
        for d in self.dims:
            elements *= d
        return -(-elements // block_elems) * block_bytes


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _scalar(kind: int, value: object) -> bytes:
    if kind == STRING:
        assert isinstance(value, str)
        return _string(value)
    fmt = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q"}[kind]
    return struct.pack(fmt, value)


def _value(item: Value) -> bytes:
    if item.kind != ARRAY:
        return struct.pack("<I", item.kind) + _scalar(item.kind, item.value)
    assert isinstance(item.value, list | tuple)
    values = list(item.value)
    head = struct.pack("<IIQ", ARRAY, item.element, len(values))
    if item.element == STRING:
        return head + b"".join(_string(str(v)) for v in values)
    fmt = {U32: "I", I32: "i", F32: "f"}[item.element]
    return head + struct.pack(f"<{len(values)}{fmt}", *values)


def _pad(handle: BinaryIO) -> None:
    handle.write(b"\0" * (-handle.tell() % ALIGNMENT))


def write_gguf(
    path: Path,
    metadata: Iterable[tuple[str, Value]],
    tensors: Iterable[tuple[str, str]],
    regions: dict[str, Region],
) -> int:
    """Write ``path`` (atomically: harness.formats.safe_write); ``tensors`` are (name, region
    key) pairs. Returns the file's size in bytes."""
    tensor_list = list(tensors)
    kv = list(metadata)
    used = [key for key in regions if any(r == key for _, r in tensor_list)]
    offsets: dict[str, int] = {}
    cursor = 0
    for key in used:
        offsets[key] = cursor
        cursor += regions[key].nbytes
        cursor += -cursor % ALIGNMENT
    # The temp file goes on any failure: a full disk must not keep gigabytes of a half-written
    # model.
    with atomic_binary_writer(path) as handle:
        return _write_body(handle, kv, tensor_list, regions, used, offsets)


def _write_body(
    handle: BinaryIO,
    kv: list[tuple[str, Value]],
    tensor_list: list[tuple[str, str]],
    regions: dict[str, Region],
    used: list[str],
    offsets: dict[str, int],
) -> int:
    """The file's header, tensor infos and regions; returns its size."""
    handle.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensor_list), len(kv)))
    for key, item in kv:
        handle.write(_string(key) + _value(item))
    for name, key in tensor_list:
        region = regions[key]
        type_id = TENSOR_TYPES[region.type_name][0]
        handle.write(_string(name) + struct.pack("<I", len(region.dims)))
        handle.write(struct.pack(f"<{len(region.dims)}Q", *region.dims))
        handle.write(struct.pack("<IQ", type_id, offsets[key]))
    _pad(handle)
    for key in used:
        start = handle.tell()
        regions[key].fill(handle, regions[key].nbytes)
        if handle.tell() - start != regions[key].nbytes:
            raise AssertionError(f"region {key} wrote {handle.tell() - start} bytes")
        _pad(handle)
    return handle.tell()
