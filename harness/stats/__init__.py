"""The decision math: pure functions from block values to labels, intervals, looks and designs.

Nothing here knows a card, a box or a file: the package imports nothing of ours but
``harness.errors`` (an import contract holds it so), so the analysis, the design simulator, the
benchmarks and a notebook decide with the same code. ``cycles`` builds the order-balanced cycle
effects, ``decision`` labels a comparison (``compare_cycles``), ``crossover`` fits the carry-over
model, ``drift`` and ``intervals`` check and widen, ``power`` and ``sequential*`` plan looks and
cycles, ``design_sim`` simulates whole campaigns of a design, ``layout`` is the ABBA/BAAB order,
``tails`` bounds p95/p99 by order statistics (MLPerf LoadGen's early stopping).
"""
