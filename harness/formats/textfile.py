"""Users' text and JSON files read into our own errors, naming the file and line.

Every reader of a file a user hands us (cards, pools, maps, traces, run records) decodes and
parses through here, so bytes that are not UTF-8, a number with more digits than Python will
convert, or nesting deeper than the parser's stack become ``file:line: what is wrong, and the
fix`` in the caller's :class:`BadInput` subclass instead of a traceback (and exit 1, which a
release gate would read as a failed candidate).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import warnings
from re import _constants as re_constants  # type: ignore[attr-defined]
from re import _parser as re_parser  # type: ignore[attr-defined]
from typing import Any

from harness.errors import BadInput

__all__ = ["compile_pattern", "decode_utf8", "parse_json", "read_bytes", "read_text"]

# Python refuses to convert longer digit strings (CVE-2020-10735); json and YAML raise ValueError.
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300
_LONG_NUMBER = re.compile(rf"\d{{{_MAX_DIGITS + 1},}}")


def check_regular(path: str | os.PathLike[str], error: type[BadInput], what: str) -> None:
    """``error`` unless ``path`` is a regular file: a FIFO would block a reader forever, and a
    device or a socket is no file of ours (a missing file is left to the reader to say)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode):
        kind = (
            "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a file"
        )
        raise error(f"{os.fspath(path)}: {what} is {kind}, not a regular file; give a file")


def read_bytes(path: str | os.PathLike[str], error: type[BadInput], what: str) -> bytes:
    """The bytes of ``path``; a missing or unreadable file raises ``error`` naming it."""
    check_regular(path, error, what)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise error(f"{os.fspath(path)}: cannot read {what}: {exc.strerror or exc}") from None


def decode_utf8(data: bytes, where: str, error: type[BadInput], *, first_line: int = 1) -> str:
    """``data`` as UTF-8 text; a bad byte raises ``error`` at ``where:line`` of that byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise error(
            f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}: {exc.reason}); the file is binary or corrupt: save it as UTF-8 or "
            "restore it"
        ) from None


def read_text(path: str | os.PathLike[str], error: type[BadInput], what: str) -> str:
    """The UTF-8 text of ``path``, every failure raised as ``error`` naming the file (and line)."""
    return decode_utf8(read_bytes(path, error, what), os.fspath(path), error)


def parse_json(text: str, where: str, error: type[BadInput], *, first_line: int = 1) -> Any:
    """One JSON document; syntax, over-long numbers and deep nesting raise ``error`` with a line.

    ``first_line`` is the line of ``text``'s start in its file (for one line of a JSONL file).
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = first_line + exc.lineno - 1
        raise error(f"{where}:{line}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise error(
            f"{where}:{first_line}: JSON nested too deeply to read; the file is corrupt"
        ) from None
    except ValueError:  # only a number too long to convert reaches here
        found = _LONG_NUMBER.search(text)
        line = first_line + (text.count("\n", 0, found.start()) if found else 0)
        raise error(
            f"{where}:{line}: a number with more than {_MAX_DIGITS} digits; no field takes "
            "one: the file is corrupt"
        ) from None


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A user's regular expression compiled; raises re.error, OverflowError or RecursionError.

    Quietly: a FutureWarning about a valid pattern (``[[``) is not the user's error, and under
    ``-W error`` it would escape as an exception of its own.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = re.compile(pattern)
        if _repeat_in_repeat(re_parser.parse(pattern)):
            raise re.error(
                "a repeated group that itself repeats (like `(a+)+`, `(\\d*)*`, or "
                "`(1?){38}` past 8 copies), a repeated choice whose alternatives can match the "
                "same text (like `(1|1)*`, `(a|a?)+` or `(1|11)+`), or three varying repeats in a "
                "row that start alike (`1*1*1*`) can take exponential time on a line that almost "
                "matches; write it with one repeat and distinct alternatives (`a+`, `\\d*`, `1*`)"
            )
        return compiled


_REPEATS = (re_constants.MAX_REPEAT, re_constants.MIN_REPEAT, re_constants.POSSESSIVE_REPEAT)


_ANYCHAR = frozenset({-1})  # stands for "any character" in a first-character set


def _first(items: Any) -> tuple[frozenset[int], bool]:
    """The characters a parsed sequence can start with (``_ANYCHAR`` when it cannot say) and
    whether it can match the empty string."""
    first: set[int] = set()
    for op, arg in items:
        if op == re_constants.AT:
            continue  # an anchor matches no character
        if op == re_constants.LITERAL:
            return frozenset(first | {arg}), False
        if op in _REPEATS:
            low, _, body = arg
            inner, empty = _first(body)
            first |= inner
            if low > 0 and not empty:
                return frozenset(first), False
            continue
        if op == re_constants.SUBPATTERN:
            inner, empty = _first(arg[-1])
        elif op == re_constants.BRANCH:
            parts = [_first(branch) for branch in arg[1]]
            inner = frozenset().union(*(p[0] for p in parts))
            empty = any(p[1] for p in parts)
        else:  # a set, a class, any, a back reference: any character, as far as this check goes
            inner, empty = _ANYCHAR, op == re_constants.GROUPREF
        first |= inner
        if not empty:
            return frozenset(first), False
    return frozenset(first), True


def _ambiguous(branches: list[Any]) -> bool:
    """Whether two alternatives of a choice can match the same text, as far as their first
    characters tell: identical alternatives, two that can match nothing, one that can match
    nothing beside one that starts where it would, or a literal one that another extends by
    text another alternative can start (``1|11``: ``11`` is ``1`` twice). Under a repeat each
    such character doubles the paths a failing match tries (``(1|1)*2`` on a line of 1s)."""
    shapes = [_first(branch) for branch in branches]
    for i, (first_i, empty_i) in enumerate(shapes):
        for j in range(i + 1, len(shapes)):
            first_j, empty_j = shapes[j]
            if branches[i] == branches[j] or (empty_i and empty_j):
                return True
            overlap = bool(first_i & first_j) or (first_i | first_j) >= _ANYCHAR
            if (empty_i or empty_j) and overlap:
                return True
    starts = frozenset().union(*(first for first, _ in shapes))
    literals = [_literal_prefix(branch) for branch in branches]
    for i, whole in enumerate(literals):
        if len(whole) != len(branches[i]) or not whole:
            continue  # only an all-literal alternative is known to end where its text does
        for j, longer in enumerate(literals):
            extends = i != j and len(longer) > len(whole) and longer[: len(whole)] == whole
            if extends and (longer[len(whole)] in starts or starts >= _ANYCHAR):
                return True
    return False


def _literal_prefix(items: Any) -> list[int]:
    """The characters a parsed sequence starts with for certain (its leading literals)."""
    prefix: list[int] = []
    for op, arg in items:
        if op != re_constants.LITERAL:
            break
        prefix.append(arg)
    return prefix


# A bounded repeat of more than this many copies multiplies the paths of a varying body inside
# it: `(1?){38}1{38}` tries 2^38 before it fails; `(\d{1,3}\.){3}` (an address) stays small.
_BOUNDED_NEST = 8
# Consecutive varying repeats that can start on the same character split a line between them
# in n^k ways: `1*1*1*2` on a line of 1s is cubic, and a card can chain twenty.
_ADJACENT_REPEATS = 3


def _varies(op: Any, arg: Any) -> bool:
    return op in _REPEATS and arg[0] < arg[1]


def _adjacent_repeats(parsed: Any) -> bool:
    """Whether ``_ADJACENT_REPEATS`` varying repeats in a row can start on one known character."""
    run: frozenset[int] = frozenset()
    count = 0
    for op, arg in parsed:
        if op == re_constants.AT:
            continue
        if not _varies(op, arg):
            run, count = frozenset(), 0
            continue
        first, _ = _first(arg[2])
        if first >= _ANYCHAR:
            run, count = frozenset(), 0
            continue
        run, count = (run & first, count + 1) if count and run & first else (first, 1)
        if count >= _ADJACENT_REPEATS:
            return True
    return False


def _optional_tail_restarts(body: Any) -> bool:
    """Whether a repeated body ends in an optional part that can start as the body does: the
    next copy could match that text too (``(?:1|11)+``, which re parses as ``1(?:|1)``)."""
    items = [item for item in body if item[0] != re_constants.AT]
    if len(items) == 1 and items[0][0] == re_constants.SUBPATTERN:
        return _optional_tail_restarts(items[0][1][-1])  # a group around the whole body
    if len(items) < 2:
        return False  # a body that is all optional repeats nothing but itself (`(a|)*`)
    op, arg = items[-1]
    if op == re_constants.BRANCH:
        parts = [_first(branch) for branch in arg[1]]
        if not any(empty for _, empty in parts):
            return False
        tail = frozenset().union(*(first for first, _ in parts))
    elif op in _REPEATS and arg[0] == 0:
        tail, _ = _first(arg[2])
    else:
        return False
    start, _ = _first(items)
    return not (tail >= _ANYCHAR or start >= _ANYCHAR) and bool(tail & start)


def _repeat_in_repeat(parsed: Any, inside: bool = False, bounded: bool = False) -> bool:
    """Whether an unbounded repeat holds another repeat (or a bounded repeat of more than
    ``_BOUNDED_NEST`` copies a varying one), or a sequence chains varying repeats that start
    alike: the constructs that backtrack without practical bound. Python's ``re`` has no time
    limit, so user patterns are refused them instead."""
    if _adjacent_repeats(parsed):
        return True
    for op, arg in parsed:
        children: list[Any] = []
        repeats = many = False
        if op in _REPEATS:
            low, high, body = arg
            if (high > 1 and inside) or (bounded and low < high):
                return True
            if high > 1 and _optional_tail_restarts(body):
                return True
            repeats = high == re_constants.MAXREPEAT  # unbounded: where backtracking explodes
            many = _BOUNDED_NEST < high < re_constants.MAXREPEAT
            children = [body]
        elif op == re_constants.SUBPATTERN:
            children = [arg[-1]]
        elif op == re_constants.BRANCH:
            children = list(arg[1])
            if (inside or bounded) and _ambiguous(children):
                return True
        elif op in (re_constants.ASSERT, re_constants.ASSERT_NOT):
            children = [arg[1]]
        elif op == re_constants.ATOMIC_GROUP:
            children = [arg]
        elif op == re_constants.GROUPREF_EXISTS:
            children = [branch for branch in arg[1:] if branch is not None]
        for child in children:
            if _repeat_in_repeat(child, inside or repeats, bounded or many):
                return True
    return False
