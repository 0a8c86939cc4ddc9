"""llama.cpp as a runtime the harness did not write: its build, a tiny MoE model, traces.

* :mod:`harness.runtimes.llamacpp.build`: where ``make llama-server`` puts the binaries;
* :mod:`.gguf_model`: ``harness make-gguf``, a seeded random-weight MoE GGUF;
* :mod:`.traces`: ``llama-eval-callback`` routing as a trace the simulator reads;
* :mod:`harness.runtimes.llamacpp.commands`: the CLI verbs.

Its Prometheus ``/metrics`` counters and ``timings`` are read by the executor for any runtime that
serves them (:mod:`harness.runtimes.counters`).
"""
