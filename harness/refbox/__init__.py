"""The bundled reference runtime: a small, real MoE decoder with a two-tier expert store.

``model`` holds the decoder, its tiers and the :class:`Engine` (policy, counters, ring, route
trace); ``server`` serves it over an OpenAI-compatible HTTP API (``harness refbox serve``).
"""

from __future__ import annotations

from harness.refbox.model import (
    DOMAIN_SAMPLES,
    DOMAINS,
    Engine,
    EngineOptions,
    ModelConfig,
)

__all__ = ["DOMAINS", "DOMAIN_SAMPLES", "Engine", "EngineOptions", "ModelConfig"]
