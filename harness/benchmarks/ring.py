"""``harness bench ring``: the cost of the telemetry ring and of the residency policy.

Figures, each measured side by side with a baseline in the same run:

* ring append per record (target < 2 µs) vs a bare ``struct.pack_into`` into a bytearray;
* ``read_ring`` of a large ring (1M records quick, 15M full) vs ``np.fromfile`` of the same
  file (target within 3x);
* ``ResidencyPolicy.observe`` per step at 40 layers x 384 experts x top-6 (drains included)
  vs a bare numpy decay of the [40, 384] counts.

Each timing is the best of a few repeats, so a noisy neighbour inflates neither side.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from collections.abc import Callable

import numpy as np

from harness.benchmarks import Figure
from harness.formats.ring import RING_FIELDS, RingGeometry, RingWriter
from harness.formats.ring_read import read_ring
from harness.policy.residency import PolicyKnobs, ResidencyPolicy

_GEOMETRY = RingGeometry(layers=40, experts=384, top_k=6, hot_slots=295)
_REPEATS = 3


def _best_s(action: Callable[[], object], repeats: int = _REPEATS) -> float:
    """Best wall time of ``repeats`` runs of ``action``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def _append_figures(directory: str, records: int) -> list[Figure]:
    values = tuple(range(len(RING_FIELDS)))
    writer = RingWriter(os.path.join(directory, "append.ring"), 4096, _GEOMETRY)

    def appends() -> None:
        append = writer.append
        for _ in range(records):
            append(values)

    packer = struct.Struct(f"<{len(RING_FIELDS)}q")
    buffer = bytearray(4096 * packer.size)

    def bare() -> None:
        pack_into = packer.pack_into
        slots = 4096
        for index in range(records):
            pack_into(buffer, (index % slots) * packer.size, *values)

    try:
        append_us = _best_s(appends) / records * 1e6
    finally:
        writer.close()
    bare_us = _best_s(bare) / records * 1e6
    ratio = append_us / bare_us
    return [
        Figure(
            name="ring append per record",
            value=append_us,
            unit="µs",
            baseline=f"bare struct.pack_into into a bytearray: {bare_us:.3f} µs",
            target="< 2 µs",
            passed=append_us < 2.0,
        ),
        Figure(
            name="ring append vs bare pack_into",
            value=ratio,
            unit="x",
            baseline=f"{bare_us:.3f} µs per bare pack_into",
        ),
    ]


def _read_figure(directory: str, records: int) -> Figure:
    path = os.path.join(directory, "read.ring")
    chunk = 1_000_000
    rng = np.random.default_rng(0)
    block = rng.integers(0, 1 << 40, size=(chunk, len(RING_FIELDS)), dtype=np.int64)
    # Capacity below the record count, so the read has to unwrap.
    with RingWriter(path, records - records // 7, _GEOMETRY) as writer:
        for start in range(0, records, chunk):
            writer.extend(block[: min(chunk, records - start)])
    del block
    np.fromfile(path, dtype="<i8")  # warm the page cache for both sides
    ring_s = _best_s(lambda: read_ring(path))
    bare_s = _best_s(lambda: np.fromfile(path, dtype="<i8"))
    os.unlink(path)
    ratio = ring_s / bare_s
    return Figure(
        name=f"read_ring of {records:,} records vs np.fromfile",
        value=ratio,
        unit="x",
        baseline=f"read_ring {ring_s * 1e3:.1f} ms, np.fromfile {bare_s * 1e3:.1f} ms",
        target="<= 3x",
        passed=ratio <= 3.0,
    )


def _policy_figure(steps: int) -> Figure:
    layers, experts, top_k = _GEOMETRY.layers, _GEOMETRY.experts, _GEOMETRY.top_k
    rng = np.random.default_rng(1)
    popularity = 1.0 / np.arange(1, experts + 1) ** 1.1
    popularity /= popularity.sum()
    # Two domains with different popularity orders; the stream shifts half way, so drains swap.
    domains = [rng.permutation(experts) for _ in range(2)]
    pool = 256
    routes = np.empty((2, pool, layers, top_k), dtype=np.intp)
    for d, order in enumerate(domains):
        for s in range(pool):
            for layer in range(layers):
                picks = rng.choice(experts, size=top_k, replace=False, p=popularity)
                routes[d, s, layer] = order[picks]
    hot = [np.sort(domains[0][: _GEOMETRY.hot_slots]).tolist()] * layers

    # Policies are built outside the timed region; each repeat consumes a fresh one.
    policies = [ResidencyPolicy(PolicyKnobs(), hot, experts) for _ in range(_REPEATS)]

    def observe() -> None:
        policy = policies.pop()
        for step in range(1, steps + 1):
            policy.observe(step, routes[0 if step < steps // 2 else 1, step % pool])

    counts = np.zeros((layers, experts))
    decay = 0.5 ** (1.0 / 256.0)

    def bare() -> None:
        for _ in range(steps):
            counts.__imul__(decay)

    observe_us = _best_s(observe) / steps * 1e6
    bare_us = _best_s(bare) / steps * 1e6
    return Figure(
        name=f"policy.observe per step ({layers}x{experts}, top-{top_k}, drains included)",
        value=observe_us / bare_us,
        unit="x",
        baseline=f"observe {observe_us:.2f} µs vs bare numpy decay {bare_us:.2f} µs",
    )


def run_bench(quick: bool = False) -> list[Figure]:
    """Measure the ring and policy figures; ``quick`` uses 1M-record rings and fewer steps."""
    with tempfile.TemporaryDirectory(prefix="harness-bench-ring-") as directory:
        figures = _append_figures(directory, 100_000 if quick else 1_000_000)
        figures.append(_read_figure(directory, 1_000_000 if quick else 15_000_000))
    figures.append(_policy_figure(2_000 if quick else 20_000))
    return figures
