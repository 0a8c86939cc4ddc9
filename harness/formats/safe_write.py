"""The one way the harness writes a file: never through a link someone else planted.

A file is written whole or not at all: into a temp file beside it, under a fresh random
name created with ``O_EXCL | O_NOFOLLOW`` (a link planted at any name the harness might use is
never opened), fsynced, then renamed over the target with ``os.replace``. The rename replaces
whatever sits at the target, a symlink included, and never writes through it: the record is
always a regular file. Any failure removes the temp file and leaves the old file as it was.

Files a runtime shares while the harness writes them (a ring it maps, a journal appended
line by line) are opened in place by :func:`open_in_place`, which refuses a link there.
Every file is made ``0644``: a runtime in a container may read it as another user.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal, TextIO, overload

from harness.errors import RecordError

_MODE = 0o644
# Keeps ".<name>.<16 hex>.tmp" under the 255 bytes a file name may have.
_NAME_KEEP = 200
_COPY_CHUNK = 1 << 20


def _temp_beside(path: Path, make_folder: bool) -> tuple[int, Path]:
    """A new, empty temp file in ``path``'s folder, open for writing: (descriptor, path).

    The leading dot makes it scratch to the seal (harness.formats.seal)."""
    if make_folder:
        path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.with_name(f".{path.name[:_NAME_KEEP]}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, _MODE)
        except FileExistsError:
            continue  # 64 random bits taken: astronomically rare, and never reused
        os.fchmod(fd, _MODE)  # the umask may have taken bits a runtime needs
        return fd, tmp


@contextlib.contextmanager
def _replacing(path: Path, make_folder: bool = True) -> Iterator[tuple[int, Path]]:
    """A temp file beside ``path`` renamed over it once the block ends without an error,
    removed when it ends with one. ``make_folder``: create ``path``'s folder when missing."""
    fd, tmp = _temp_beside(path, make_folder)
    try:
        yield fd, tmp
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.filename is None and exc.errno:
            # A failed write(2) names no file: name the one being written.
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
        raise


@contextlib.contextmanager
def atomic_binary_writer(path: Path, *, make_folder: bool = True) -> Iterator[BinaryIO]:
    """A binary handle whose bytes replace ``path`` once the block ends without an error."""
    with _replacing(path, make_folder) as (fd, _), os.fdopen(fd, "wb") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[TextIO]:
    """A UTF-8 text handle whose text replaces ``path`` once the block ends without an error."""
    with _replacing(path) as (fd, _), os.fdopen(fd, "w", encoding="utf-8") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` for a writer that opens files by name (pandas, gguf);
    renamed over ``path`` once the block ends without an error."""
    with _replacing(path) as (fd, tmp):
        os.close(fd)
        yield tmp
        synced = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(synced)
        finally:
            os.close(synced)


def copy_file_atomic(source: Path, target: Path) -> None:
    """Replace ``target`` with a copy of ``source``: its bytes and mode bits, as cp."""
    with source.open("rb") as src, atomic_binary_writer(target) as dst:
        shutil.copyfileobj(src, dst, _COPY_CHUNK)
        os.fchmod(dst.fileno(), stat.S_IMODE(os.fstat(src.fileno()).st_mode))


def write_bytes_atomic(path: Path, data: bytes, *, make_folder: bool = True) -> None:
    """Replace ``path`` with ``data``, whole or not at all."""
    with atomic_binary_writer(path, make_folder=make_folder) as handle:
        handle.write(data)


def write_text_atomic(path: Path, text: str, *, make_folder: bool = True) -> None:
    """Replace ``path`` with ``text`` (UTF-8), whole or not at all; ``make_folder=False``: a
    missing folder is an error (FileNotFoundError), as for a state file a user named."""
    write_bytes_atomic(path, text.encode("utf-8"), make_folder=make_folder)


_IN_PLACE_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "w+b": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "a+b": os.O_RDWR | os.O_CREAT | os.O_APPEND,
}


@overload
def open_in_place(path: Path | str, mode: Literal["w"]) -> TextIO: ...
@overload
def open_in_place(path: Path | str, mode: Literal["w+b", "a+b"]) -> BinaryIO: ...
def open_in_place(path: Path | str, mode: Literal["w", "w+b", "a+b"]) -> TextIO | BinaryIO:
    """Open ``path`` itself for writing (a ring a runtime maps, an append-only journal, a
    trace written as it goes); a RecordError when a symlink stands there."""
    flags = _IN_PLACE_FLAGS[mode] | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, _MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RecordError(
                f"{path}: is a symbolic link where the harness writes its own file; "
                "remove the link (and find out who put it there), then run the command again"
            ) from None
        raise
    if mode == "w":
        return os.fdopen(fd, "w", encoding="utf-8")
    return os.fdopen(fd, mode)
