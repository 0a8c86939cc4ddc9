"""The simulator: replay routing traces through the runtime's own policy code, fit maps.

``trace_files`` reads every trace format into one :class:`Trace` (``traces``); ``replay``
replays it (plain and fast, identical decisions; cache mode) into a ``results`` ReplayResult;
``decisions`` checks a replay against recorded decisions (lockstep); ``fitmap`` fits rowmaps
and hotlists and scores their coverage; ``simulate`` writes a simulated campaign directory;
``commands`` holds the ``harness simulate`` and ``harness fit-map`` verbs.

Nothing is imported here: the CLI registers ``simulate`` without loading numba or pandas, so
import what you use from its module (``harness.sim.replay``, ``harness.sim.results``, ...).
"""
