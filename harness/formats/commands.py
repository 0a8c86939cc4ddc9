"""``harness ring show FILE``: a telemetry ring's header and a summary of its records."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK

__all__ = ["register"]


def _cmd_ring_show(args: argparse.Namespace, out: TextIO) -> int:
    from harness.formats.ring_read import describe_ring

    out.write(describe_ring(Path(args.file)) + "\n")
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ring show``."""
    ring = verbs.add_parser("ring", help="telemetry ring files")
    ring_verbs = ring.add_subparsers(
        dest="ring_verb", metavar="VERB", required=True, help="show: a ring's header and summary"
    )
    show = ring_verbs.add_parser("show", help="print a ring's header and a summary")
    show.add_argument("file", metavar="FILE", help="a telemetry ring file (ring.bin)")
    show.set_defaults(handler=_cmd_ring_show)
