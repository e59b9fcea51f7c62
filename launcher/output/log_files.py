"""A worker's log file (--log_dir): the folder made, the file opened for appending with the header
of each run, and whatever would keep the file from taking the output refused first, in one sentence."""

from __future__ import annotations

import errno
import os
import shlex
import stat
import time
from contextlib import suppress
from typing import Optional

from launcher.errors import LaunchError
from launcher.output.lines import write_all


def header(label: str, cmd, attempt: int = 0, round_: Optional[str] = None) -> bytes:
    """The line that opens each run in a log; ``label`` names the process ("rank 3", "server 0"); ``round_``: an
    elastic job's round, in a line."""
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    again = f" (attempt {attempt + 1}, restart {attempt})" if attempt else ""
    again += f" ({round_})" if round_ else ""
    return f"===== {when} launcher: {label} starts{again}: {shlex.join(cmd)}\n".encode()


def open_log(path: str, log_dir: str, label: str, cmd, attempt: int = 0, round_: Optional[str] = None) -> int:
    """Open a worker's log file for appending and write this run's header; the descriptor.

    Checked by doing, not by asking (``os.access`` says yes to root): whatever would keep the
    file from taking the worker's output is refused here, before any worker starts.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise LaunchError(_log_problem(log_dir, path, e)) from None
    size = None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LaunchError(f"--log_dir {log_dir}: {path} is {_file_kind(mode)}, not a regular file; "
                              f"remove it or choose another --log_dir.")
        os.set_blocking(fd, True)
        size = os.fstat(fd).st_size
        glue = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # the last run ended mid-line
        write_all(fd, (b"\n" if glue else b"") + header(label, cmd, attempt, round_))
    except OSError as e:
        if size is not None:  # a full disk took part of the header: the old log is left as it was
            with suppress(OSError):
                os.ftruncate(fd, size)
        os.close(fd)
        raise LaunchError(_log_problem(log_dir, path, e)) from None
    except LaunchError:
        os.close(fd)
        raise
    return fd


def make_log_dir(log_dir: str) -> None:
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as e:
        if os.path.islink(log_dir) and not os.path.exists(log_dir):
            raise LaunchError(_log_problem(log_dir, log_dir, e)) from None
        why = "a part of its path is a file" if e.errno == errno.ENOTDIR else e.strerror
        raise LaunchError(f"--log_dir {log_dir} cannot be created ({why}); choose a folder you can write to.") from None
    if not os.path.isdir(log_dir):
        raise LaunchError(f"--log_dir {log_dir} is not a folder; choose another --log_dir.")


def make_folder_of(path: str, option: str) -> None:
    """The folder of a file written at the run's end (tune's --out and --plot), made now, and the file refused in one
    sentence where it could not be written there, so that no trial runs before the user learns it."""
    if os.path.isdir(path):
        raise LaunchError(f"{option} {path} is a folder; give the path of a file.")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        why = "a part of its path is a file" if e.errno in (errno.ENOTDIR, errno.EEXIST) else e.strerror
        raise LaunchError(f"{option} {path}: its folder {folder} cannot be created ({why}); give another path.") from None
    target = path if os.path.lexists(path) else folder
    if not os.access(target, os.W_OK):
        raise LaunchError(f"{option} {path} cannot be written ({target}: {os.strerror(errno.EACCES)}); give another "
                          "path.")


def _log_problem(log_dir: str, path: str, e: OSError) -> str:
    if e.errno == errno.ENXIO:
        return f"--log_dir {log_dir}: {path} is a FIFO nobody reads, not a regular file; remove it or choose another --log_dir."
    if e.errno == errno.EISDIR:
        return f"--log_dir {log_dir}: {path} is a folder, not a file; remove it or choose another --log_dir."
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"--log_dir {log_dir}: cannot write {path} ({e.strerror}); free some space or choose another --log_dir."
    if os.path.islink(log_dir) and not os.path.exists(log_dir):
        return f"--log_dir {log_dir} is a symbolic link to {os.readlink(log_dir)}, which does not exist; fix the link or choose another --log_dir."
    return f"--log_dir {log_dir}: cannot write {path} ({e.strerror}); choose a folder you can write to."


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
