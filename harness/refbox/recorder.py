"""The reference runtime's SGLang dialect: an expert-distribution recorder.

What SGLang does with ``--expert-distribution-recorder-mode stat`` (and an infinite buffer,
``--expert-distribution-recorder-buffer-size -1``), and KTransformers' build with
``--record-kt-gpu-expert-distribution``: between ``start`` and ``stop`` every forward pass (a
host step here: a prefill, or one decode token) adds one row of expert selections per layer and
expert, every token of the pass counted; with masks, also the experts resident on the fast tier
(the GPU, in KT's terms) when the pass began. ``dump`` writes them in SGLang's exact file format
(:func:`harness.formats.expert_distribution.write_stat_dump`) and clears the record.

Selections × masks are exactly the pass's fast-tier lookups: a rowmap's swaps land after the
forward pass, so the mask taken at its start is the one its lookups saw.
"""

from __future__ import annotations

import os
import time

import numpy as np
import numpy.typing as npt

from harness.formats.expert_distribution import write_stat_dump
from harness.formats.torchfile import write_torch_file

__all__ = ["ExpertRecorder"]

I64 = npt.NDArray[np.int64]


class ExpertRecorder:
    """Per-pass counts (and masks) while recording; not thread-safe (the engine's lock is)."""

    def __init__(self, layers: int, experts: int, *, masks: bool) -> None:
        self.layers = layers
        self.experts = experts
        self.masks = masks
        self.recording = False
        self._counts: list[I64] = []
        self._masks: list[npt.NDArray[np.bool_]] = []

    def start(self) -> None:
        """Clear what was recorded and record from now (SGLang's start also clears)."""
        self._counts.clear()
        self._masks.clear()
        self.recording = True

    def stop(self) -> None:
        """Stop recording; what was recorded stays until the dump."""
        self.recording = False

    def add(self, routes: I64, hot: list[list[int]] | None) -> None:
        """One pass: ``routes`` ``[tokens, layers, top_k]`` chosen experts; ``hot`` the
        fast-tier experts per layer when it began (with masks on)."""
        counts = np.zeros((self.layers, self.experts), dtype=np.int64)
        rows = np.arange(self.layers)[:, None]
        for token in routes:
            counts[rows, token] += 1  # a token's top-k experts of a layer are distinct
        self._counts.append(counts)
        if self.masks:
            mask = np.zeros((self.layers, self.experts), dtype=bool)
            for layer, ids in enumerate(hot or []):
                mask[layer, ids] = True
            self._masks.append(mask)

    def dump(self, folder: str) -> list[str]:
        """Write ``expert_distribution_recorder_<time>.pt`` into ``folder`` (made if missing)
        and, with masks on, ``gpu_expert_distribution_<time>.pt`` beside it, as KTransformers'
        SGLang build writes them (two files, each stamped with its own ``time.time()``);
        clear the record, and return the files' paths."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"expert_distribution_recorder_{time.time()}.pt")
        shape = (0, self.layers, self.experts)
        counts = np.stack(self._counts) if self._counts else np.zeros(shape, np.int64)
        write_stat_dump(path, counts)
        paths = [path]
        if self.masks:
            masks = np.stack(self._masks) if self._masks else np.zeros(shape, bool)
            paths.append(os.path.join(folder, f"gpu_expert_distribution_{time.time()}.pt"))
            write_torch_file(paths[-1], {"gpu_expert_masks": masks})
        self._counts.clear()
        self._masks.clear()
        return paths
