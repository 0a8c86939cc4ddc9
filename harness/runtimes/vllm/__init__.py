"""vLLM as a runtime the harness boots: its environment, a tiny model, and the route plugin.

* :mod:`harness.runtimes.vllm.build`: where ``make vllm`` puts vLLM's venv and the tiny model;
* :mod:`harness.runtimes.vllm.model`: ``harness make-vllm-model``, a seeded random-weight Qwen3-MoE;
* :mod:`.plugin`: the vLLM plugin (installed into vLLM's venv, not imported here)
  that writes route counts and a route trace from the MoE router;
* :mod:`harness.runtimes.vllm.commands`: the CLI verbs.

The profile is ``campaigns/runtimes/vllm.yaml``; its ``/metrics`` counters are read by the
executor for any runtime that serves Prometheus text (:mod:`harness.runtimes.counters`).
"""
