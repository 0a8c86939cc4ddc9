"""A ``.npy`` header held to the bytes behind it, before numpy allocates the shape it claims.

numpy's loader trusts the header: one claiming 64 PiB makes ``np.load`` allocate that much and
fail with a MemoryError, far from the file that caused it. Routing arrays (vLLM's
``routed_experts``, in a trace file or a response) are read only after this check.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np


def npy_header_problem(handle: BinaryIO, size: int) -> str | None:
    """What is wrong with the ``.npy`` header at ``handle``'s start (``size``: the bytes there
    are in all); None when it agrees with them, or for a format version numpy checks itself."""
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(handle)
    elif version == (2, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    else:
        return None  # a newer format: np.load checks it (and its callers catch what it raises)
    if dtype.hasobject:
        return f"holds Python objects ({dtype}), not expert ids"
    body = size - handle.tell()
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if need != body:
        return f"its header says {list(shape)} {dtype} ({need:,} bytes), the file has {body:,}"
    return None


__all__ = ["npy_header_problem"]
