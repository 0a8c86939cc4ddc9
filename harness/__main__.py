"""``python -m harness`` is the ``harness`` command."""

from harness.cli import entry

entry()
