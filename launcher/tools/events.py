"""``launcher logs --events``: the job's event log (``LOG_DIR/events.jsonl``, launcher.output.event_log) in a line per
event; with ``-f``, new events as they are written, until the job has ended. Reads the file alone."""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from launcher.errors import LaunchError
from launcher.output import event_log

POLL = 0.25  # seconds between two looks at the file while following


def show(log_dir: str, follow: bool, pattern, write: Callable[[bytes, bool], None],
         running: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
    """Every event of ``log_dir``'s log that ``pattern`` (compiled bytes regex, or None) matches, given to
    ``write(data, flush)``; with ``follow``, then each new one until ``running()`` says the job has ended."""
    path = event_log.path_in(log_dir)
    if not os.path.isfile(path):
        raise LaunchError(f"no {event_log.NAME} in {log_dir}; give the --log_dir of the job (the launcher keeps one there).")
    offset = _show_new(path, 0, pattern, write)
    while follow:
        ended = not running()  # looked at before the file: the job's last events are shown
        sleep(POLL)
        offset = _show_new(path, offset, pattern, write)
        if ended:
            return


def _show_new(path: str, offset: int, pattern, write) -> int:
    """The whole lines of ``path`` from ``offset`` on, shown; the offset after the last whole line."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(event_log.READ_LIMIT)
    except OSError as e:
        raise LaunchError(f"cannot read {path} ({e.strerror}).") from None
    whole = data[:data.rfind(b"\n") + 1]
    shown = []
    for line in whole.split(b"\n"):
        event = event_log.decode(line)
        if event is None:
            continue
        text = event_log.describe(event).encode(errors="replace")
        if pattern is None or pattern.search(text):
            shown.append(text + b"\n")
    write(b"".join(shown), True)
    return offset + len(whole)
