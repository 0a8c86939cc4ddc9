"""The ds4 CLI verb ``harness make-ds4-model``.

``harness/cli.py`` calls :func:`register` with its sub-parsers; handlers take ``(args, out)`` and
return the exit code, raising harness errors for bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK, BadInput
from harness.runtimes.ds4 import build

__all__ = ["register"]


def _cmd_make_model(args: argparse.Namespace, out: TextIO) -> int:
    from harness.runtimes.ds4.flash_model import write_flash_model  # numpy: loaded when used

    target = Path(args.output) if args.output else build.model_path()
    if target.is_dir():
        raise BadInput(f"{target}: is a directory; give the path of the .gguf file to write")
    if target.is_file() and not args.force:
        out.write(f"{target}: already there (reused; --force writes it again)\n")
        return EXIT_OK
    summary = write_flash_model(target, args.seed)
    out.write(
        f"wrote {summary['path']}: {int(str(summary['bytes'])) / 2**30:.2f} GiB, "
        f"{summary['tensors']} tensors over {summary['regions']} shared regions, "
        f"DeepSeek V4 Flash shape, random weights, seed {args.seed}\n"
    )
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``make-ds4-model`` to the harness CLI."""
    make = verbs.add_parser(
        "make-ds4-model",
        help="write a random-weight GGUF of DeepSeek V4 Flash's exact shape that ds4 loads",
    )
    make.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help=f"the .gguf to write (default: the one ds4's tests use, {build.model_path()})",
    )
    make.add_argument(
        "--seed", type=int, default=build.DEFAULT_SEED, help="weights seed (same seed, same bytes)"
    )
    make.add_argument("--force", action="store_true", help="write it even when it is there")
    make.set_defaults(handler=_cmd_make_model)
