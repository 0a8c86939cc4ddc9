"""What every box and runtime-profile model shares: strictness, and patterns checked as read."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

from harness.formats.textfile import compile_pattern

Platform = Literal["linux-cpu", "linux-cuda", "macos-metal", "any"]


def _check_regex(pattern: str, field: str) -> None:
    """Raise ValueError (pydantic reports it at the field's line) for a bad pattern."""
    try:
        compile_pattern(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise ValueError(f"`{field}` is not a regular expression: {exc}") from None


class Strict(BaseModel):
    """Base of every user-facing model: unknown keys are errors, not silently ignored, and no
    number is NaN or infinite (a bound of `.nan` would let every value pass)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)
