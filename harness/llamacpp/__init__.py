"""llama.cpp as a runtime the harness did not write: its build, a tiny MoE model, traces.

* :mod:`harness.llamacpp.build`: where ``make llama-server`` puts the binaries;
* :mod:`harness.llamacpp.gguf_model`: ``harness make-gguf``, a seeded random-weight MoE GGUF;
* :mod:`harness.llamacpp.traces`: ``llama-eval-callback`` routing as a trace the simulator reads;
* :mod:`harness.llamacpp.commands`: the CLI verbs.

Its Prometheus ``/metrics`` counters and ``timings`` are read by the executor for any runtime that
serves them (:mod:`harness.execute.counters`).
"""
