"""Text from a card, a profile, a prompt or a runtime, made inert for a terminal table.

``rich`` reads ``[bold red]`` in any string it prints as markup (and ``[/x]`` with no opening
tag is a MarkupError), and a control character (an ANSI escape in a runtime's log line) would
move the cursor or recolour the terminal: data is shown, never obeyed.
"""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls but tab: ESC, BEL, backspace, carriage return and the like.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def shown(value: Any) -> str:
    """``value`` as text a rich table prints literally, controls as U+FFFD, on one line."""
    from rich.markup import escape  # when needed: a validate with no warning never loads rich

    return escape(_CONTROL.sub("\ufffd", str(value).replace("\n", " ")))


__all__ = ["shown"]
