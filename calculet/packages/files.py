"""Safe file-system primitives shared by building, archiving and verifying packages.

Why this exists: §11 step 1 (R11.1) requires that nothing in a package points outside it. Every
step therefore walks, reads and writes files the same careful way — symlinks and special files
are rejected, files are read without following links and created exclusively — and that way is
written once, here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

from calculet.packages.checks import PackageCheck, fail

__all__ = [
    "CHUNK",
    "READ_NOFOLLOW",
    "create_new",
    "read_limited",
    "scan_tree",
    "unsafe_relative_path",
    "write_new_file",
]

CHUNK: Final = 1024 * 1024
READ_NOFOLLOW: Final = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
"""Flags to open a listed file for reading without following a symlink planted in its place."""
_CREATE_NEW: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def create_new(path: Path, mode: int) -> BinaryIO:
    """Open ``path`` for writing, creating it exclusively (never through a link, never over a file)."""
    return os.fdopen(os.open(path, _CREATE_NEW, mode), "wb")


def write_new_file(path: Path, data: bytes, *, mode: int) -> None:
    """Write ``data`` to a new file with exactly ``mode`` (whatever the umask)."""
    with create_new(path, mode) as stream:
        stream.write(data)
    os.chmod(path, mode)


def read_limited(path: Path, limit: int, where: Path, rel: str) -> bytes:
    """At most ``limit`` bytes of ``path``, opened without following links."""
    try:
        descriptor = os.open(path, READ_NOFOLLOW)
    except OSError as exc:
        fail(PackageCheck.NOT_FOUND, where, f"cannot open: {exc.strerror}", file=rel)
    with os.fdopen(descriptor, "rb") as stream:
        return stream.read(limit)


def unsafe_relative_path(rel: object) -> str | None:
    """Why ``rel`` is not a plain relative POSIX path inside the package, or None if it is."""
    if not isinstance(rel, str) or not rel:
        return "not a non-empty string"
    if len(rel) > 4096:
        return "path too long"
    if "\x00" in rel or any(ord(ch) < 0x20 for ch in rel):
        return "control character in path"
    if "\\" in rel:
        return "backslash in path (use '/')"
    if rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        return "absolute path; paths must be relative to the package"
    parts = rel.split("/")
    if ".." in parts:
        return "'..' component would leave the package"
    if any(part in ("", ".") for part in parts):
        return "empty or '.' component; paths must be normalised"
    return None


def scan_tree(root: Path, *, label: Path) -> Iterator[tuple[str, Path]]:
    """Yield ``(relative POSIX path, path)`` of every regular file under ``root``, sorted.

    Symlinks and special files are rejected rather than skipped: a symlink in a package is
    either an escape (§11 step 1, R11.1) or a second name for a file that would be hashed
    twice, and neither belongs in a signed artifact.
    """
    stack = [root]
    found: list[tuple[str, Path]] = []
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                path = Path(entry.path)
                rel = path.relative_to(root).as_posix()
                if entry.is_symlink():
                    _reject_symlink(path, root, label, rel)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel, path))
                else:
                    fail(PackageCheck.SPECIAL_FILE, label,
                         "not a regular file or directory", file=rel)
    yield from sorted(found)


def _reject_symlink(path: Path, root: Path, label: Path, rel: str) -> None:
    target = os.readlink(path)
    escapes = not (path.parent / target).resolve().is_relative_to(root)
    detail = (f"symlink to {target!r} points outside the package"
              if escapes else f"symlink to {target!r}; packages hold regular "
              "files only")
    fail(PackageCheck.SYMLINK, label, detail, file=rel)
