"""The simulator: replay routing traces through the runtime's own policy code, fit maps.

``trace_files`` reads every trace format into one :class:`Trace` (``traces``); ``replay``
replays it (plain and fast, identical decisions; cache mode) into a ``results`` ReplayResult;
``decisions`` checks a replay against recorded decisions (lockstep); ``fitmap`` fits rowmaps
and hotlists and scores their coverage; ``simulate`` writes a simulated campaign directory;
``commands`` holds the ``harness simulate`` and ``harness fit-map`` verbs.
"""

from harness.sim.decisions import Lockstep, lockstep
from harness.sim.fitmap import Coverage, coverage, fit_hotlist_entries, fit_top_k, load_counts
from harness.sim.replay import replay_cache, replay_fast, replay_reference
from harness.sim.results import CostModel, ReplayResult
from harness.sim.trace_files import load_trace
from harness.sim.traces import Trace, concat_traces, decode_counts, trace_from_arrays

__all__ = [
    "CostModel",
    "Coverage",
    "Lockstep",
    "ReplayResult",
    "Trace",
    "concat_traces",
    "coverage",
    "decode_counts",
    "fit_hotlist_entries",
    "fit_top_k",
    "load_counts",
    "load_trace",
    "lockstep",
    "replay_cache",
    "replay_fast",
    "replay_reference",
    "trace_from_arrays",
]
