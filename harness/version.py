"""The package's version and where it lives: the ground floor, imported by any module that
records or ships the harness (run records, the report, the on-box driver, Slurm preflights)
without reaching up to the package face (``harness/__init__.py``, the library API)."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).parent  # the directory the driver archive zips

__all__ = ["PACKAGE_DIR", "__version__"]
