"""Whole lines out of a byte stream: a worker's output cut into lines, a line redrawn in place (a
progress bar) taken at its last state, a prefix before each line, the last lines of a text."""

from __future__ import annotations

import os
from typing import Optional

CHUNK = 1 << 20  # how much of a pipe or a file is read at a time
MAX_PARTIAL_LINE = 8 << 20  # a longer unterminated line is written out as it is
TAIL_LINES = 20
TAIL_BYTES = 64 * 1024  # how far back the failure summary looks for its last lines


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` written to ``fd`` (a blocking file or pipe takes it in several writes)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def prefixed(prefix: bytes, lines: bytes) -> bytes:
    """``lines`` (ending in a newline) with ``prefix`` before each."""
    return prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


class LineBuffer:
    """Cuts a byte stream into whole lines; keeps the unfinished last one for later. A line
    redrawn in place (``\r``: a progress bar) counts as its last state, as a terminal shows it:
    only that is kept, and given."""

    def __init__(self) -> None:
        self.partial = b""

    def feed(self, data: bytes) -> bytes:
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) > MAX_PARTIAL_LINE:
            cut, data = len(data) + 1, data + b"\n"
        self.partial = _unfinished(data[cut:])
        return last_states(data[:cut])

    def take(self, data, end: Optional[int] = None) -> tuple:
        """``feed`` for a source that can be read again from the end of its last whole line (a
        file), of ``data[:end]`` (a buffer read into again and again): (the whole lines, how many
        bytes at the end to read again). The lines are a view of ``data``, not a copy, when no
        unfinished line comes before them and no line is redrawn (``\r``): a log file's megabytes
        reach the console without being copied on the way; the view is good until ``data`` is
        read into again."""
        end = len(data) if end is None else end
        cut = data.rfind(b"\n", 0, end) + 1
        if self.partial or cut == 0 or end - cut > CHUNK // 2 or data.find(b"\r", 0, end) >= 0:
            return self.feed(bytes(data[:end])), 0
        return memoryview(data)[:cut], end - cut

    def progress(self) -> Optional[bytes]:
        """The latest state of the unfinished line when it is being redrawn; else None."""
        if b"\r" not in self.partial:
            return None
        return _last_state(self.partial).rstrip(b"\r") or None

    def rest(self) -> bytes:
        rest, self.partial = self.partial, b""
        return last_states(rest + b"\n") if rest else b""


def _last_state(line: bytes) -> bytes:
    """What follows the last ``\r`` of ``line`` (trailing ones aside: ``\r\n`` stays as it is)."""
    return line[line.rstrip(b"\r").rfind(b"\r") + 1:]


def last_states(lines: bytes) -> bytes:
    """Each of ``lines`` as a terminal would leave it: its last state."""
    if b"\r" not in lines:
        return lines
    return b"\n".join(_last_state(line) for line in lines.split(b"\n"))


def _unfinished(partial: bytes) -> bytes:
    """An unfinished line without the states it has drawn over (its last ``\r`` kept, as a mark)."""
    at = partial.rstrip(b"\r").rfind(b"\r")
    return partial[at:] if at > 0 else partial



def last_lines_of(data: bytes, n: int, cut: bool = False) -> list:
    """The last ``n`` lines of ``data`` (the end of a longer text when ``cut``), none of them cut."""
    if len(data) > TAIL_BYTES:
        data, cut = data[-TAIL_BYTES:], True
    if cut:
        data = data[data.find(b"\n") + 1:]
    return last_states(data).decode(errors="replace").splitlines()[-n:]
