"""Files that a user or another process named, read as untrusted: a regular file only (a FIFO
would block, /dev/zero never ends), only so much of it, and only inside the folder it belongs to."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Optional


class NotReadable(ValueError):
    """What is wrong with the file, as the end of a sentence: "is a FIFO, not a regular file"."""


KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
         (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str) -> BinaryIO:
    """``path`` open for reading; NotReadable when it is not a regular file (opened without blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in KINDS if test(mode)), "not a file")
        raise NotReadable(f"is {kind}, not a regular file")
    return os.fdopen(fd, "rb")


def read_regular(path: str, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; NotReadable otherwise, OSError when it cannot be read."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotReadable(f"is larger than {size_text(limit)}")
    return data


def size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def inside(folder: str, name: str) -> Optional[str]:
    """The path of file ``name`` of ``folder``, or None when ``name`` is not a plain file name or
    leads out of ``folder`` (``..``, an absolute path, a symbolic link pointing elsewhere)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        return None
    path = os.path.join(folder, name)
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder):
        return None
    return path
