"""The bundled reference runtime: a small, real MoE decoder with a two-tier expert store.

``model`` is the decoder's maths, ``tiers`` the two-tier expert store (hot arrays or a cache
over a memory-mapped slow tier), ``engine`` the :class:`Engine` that steps them (policy,
counters, ring, route trace); ``options`` parses and checks the serve flags, and ``server``
serves the engine over an OpenAI-compatible HTTP API (``harness refbox serve``, registered by
``commands``). Nothing is imported here, so registering the verb costs nothing.
"""
