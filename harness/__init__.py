"""harness: benchmark and A/B campaign orchestration for two-tier mixture-of-experts runtimes."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
