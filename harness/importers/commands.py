"""The ``harness import`` verb."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from harness.errors import EXIT_OK

# The formats' names for the help text; ``importers.write.FORMATS`` holds their readers (and
# pandas, which registering the verb does not load). A test holds the two together.
FORMAT_NAMES = ("vllm", "ds4", "llama-bench", "aiperf", "sglang", "knee")

__all__ = ["register"]

_HELP = """\
Turn results files of another tool into a campaign directory that `harness analyze`,
`harness gate` and `harness report` read unchanged. MAPPING (YAML) says which file is which
cell, cycle and slot (`files:` by name, or `pattern:` with named groups), the control and the
gates. Formats: {formats}.
"""


def _cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    from harness.importers.write import import_results

    result = import_results(
        args.format,
        [Path(f) for f in args.files],
        Path(args.map),
        Path(args.out),
        cells_by=args.cells_by,
    )
    out.write(
        f"imported {result.runs} runs ({result.cycles} cycles"
        + (f", {result.summary_only} summary-only" if result.summary_only else "")
        + f") into {result.root}\n"
        f"next: harness gate {result.root}\n"
    )
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``harness import`` to the CLI."""
    formats = ", ".join(FORMAT_NAMES)
    verb = verbs.add_parser(
        "import",
        help="results files of other tools (vllm, ds4, llama-bench…) as a campaign directory",
        description=_HELP.format(formats=formats),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verb.add_argument("format", metavar="FORMAT", help=f"one of: {formats}")
    verb.add_argument("files", nargs="+", metavar="FILE", help="the other tool's results files")
    verb.add_argument("--map", required=True, metavar="MAPPING", help="the mapping YAML")
    verb.add_argument("-o", "--out", required=True, metavar="DIR", help="campaign folder to write")
    verb.add_argument(
        "--cells-by",
        metavar="FIELD",
        help="llama-bench: split each file's tests into cells at every change of FIELD "
        "(e.g. n_cpu_moe: `llama-bench -ncmoe 0,16,16,0` is one A/B/B/A cycle; cells are "
        "named FIELD-VALUE, the mapping gives no files/pattern)",
    )
    verb.set_defaults(handler=_cmd_import)
