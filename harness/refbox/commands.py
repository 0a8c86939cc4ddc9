"""``harness refbox …``: the bundled reference runtime's own command line, passed through whole."""

from __future__ import annotations

import argparse
from typing import TextIO

__all__ = ["register"]


def _cmd_refbox(args: argparse.Namespace, out: TextIO) -> int:
    from harness.refbox.server import serve_main

    code: int = serve_main(list(args.rest))
    return code


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``refbox``; its arguments (``serve --port …``) are the runtime's, not argparse's."""
    refbox = verbs.add_parser(
        "refbox", help="the bundled reference runtime", add_help=False, prefix_chars="\0"
    )
    refbox.add_argument(
        "rest", nargs=argparse.REMAINDER, help="the runtime's own arguments (serve --help)"
    )
    refbox.set_defaults(handler=_cmd_refbox)
