"""Text from a card, a profile, a prompt or a runtime, made inert for a terminal table.

``rich`` reads ``[bold red]`` in any string it prints as markup (and ``[/x]`` with no opening
tag is a MarkupError), and a control character (an ANSI escape in a runtime's log line) would
move the cursor or recolour the terminal: data is shown, never obeyed.
"""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls but tab: ESC, BEL, backspace, carriage return and the like; and the
# bidirectional formatting characters, which reorder what a reader sees without showing
# themselves (a "Trojan Source" line that reads differently from what it holds).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# Zero-width characters (space, joiners, word joiner, BOM), which make two names that differ
# look alike, and the Unicode line and paragraph separators, which break a line where a
# viewer honours them and a reader expects one line.
_HIDDEN = "\u200b-\u200d\u2060\ufeff\u2028\u2029"
_CONTROL = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_BIDI}{_HIDDEN}]")
# The same for text that keeps its lines (a report's pre block, record.md): tab and newline stay.
_UNSEEN = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}{_HIDDEN}]")


def inert(value: Any) -> str:
    """``value`` as text with every control and bidi override as U+FFFD (CRLF read as a line
    end): data in a report or record.md is shown, never obeyed by the terminal or viewer."""
    return _UNSEEN.sub("\ufffd", str(value).replace("\r\n", "\n"))


def shown(value: Any) -> str:
    """``value`` as text a rich table prints literally, controls as U+FFFD, on one line."""
    from rich.markup import escape  # when needed: a validate with no warning never loads rich

    return escape(_CONTROL.sub("\ufffd", str(value).replace("\n", " ")))


__all__ = ["inert", "shown"]
