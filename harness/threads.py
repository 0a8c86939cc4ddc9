"""The harness's own arithmetic on one BLAS thread; the runtimes it boots keep the box's setting.

The analysis's matrices are small (the crossover design of 100 cycles that "how many more
cycles" searches up to is 400 x 203), where OpenBLAS's threads cost more than they give, and on
a busy box (the runtime under test beside the analysis, a second campaign, a test suite's other
worker) a BLAS thread waiting for a core stalls the others at every call: that design's
projection took 0.75-0.98 s on two shared cores with OpenBLAS's default threads, 6-14 ms on one.
OpenBLAS reads its thread count once, when it loads, so the setting is made before numpy or
scipy is imported: :func:`one_blas_thread` at the command's entry. A value the user set stands.
"""

from __future__ import annotations

import os

VARIABLE = "OPENBLAS_NUM_THREADS"
# Inherited with the setting, so that a harness started by a harness (a benchmark's campaign, a
# Slurm job) still knows the setting is its own and not the user's.
MARK = "HARNESS_SET_OPENBLAS_NUM_THREADS"


def one_blas_thread() -> None:
    """One OpenBLAS thread for this process, unless the user chose a count themselves."""
    if VARIABLE in os.environ and MARK not in os.environ:
        return
    os.environ[VARIABLE] = "1"
    os.environ[MARK] = "1"


def box_setting_prefix() -> str:
    """Shell text that gives a command the box's own BLAS setting back: what only the harness
    set is unset, so a runtime is never slowed to one thread by the harness that booted it."""
    return f"unset {VARIABLE} {MARK}; " if os.environ.get(MARK) else ""
