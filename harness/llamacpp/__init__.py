"""llama.cpp as a runtime the harness did not write: its build, a tiny MoE model, metrics, traces.

* :mod:`harness.llamacpp.build`: where ``make llama-server`` puts the binaries;
* :mod:`harness.llamacpp.gguf_model`: ``harness make-gguf``, a seeded random-weight MoE GGUF;
* :mod:`harness.llamacpp.metrics`: Prometheus ``/metrics`` as counters, ``timings`` as columns;
* :mod:`harness.llamacpp.traces`: ``llama-eval-callback`` routing as a trace the simulator reads;
* :mod:`harness.llamacpp.commands`: the CLI verbs.
"""
