"""A host's end of the lifeline of ``--hostfile``'s command (``launcher.plan.over_ssh``): its ssh session's stdin,
read line by line with a deadline, and watched on a thread of its own once the job runs. A ``stop`` line, the end of
the stream (the command, its ssh or its machine gone) or ``SILENT_AFTER`` seconds with no line (the network lost)
stop this launcher's workers as the signal would: the launcher signals itself."""

from __future__ import annotations

import os
import select
import signal
import threading
from typing import Callable, Optional

from launcher.plan import over_ssh

EOF = object()  # what ``LineReader.next`` gives once the stream has ended


class LineReader:
    """Lines of a file descriptor, each up to ``over_ssh.MAX_LINE`` bytes (a longer one ends the stream)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.ended = False

    def next(self, timeout: Optional[float] = None):
        """The next line (bytes, its newline kept); None when ``timeout`` passed first; EOF once the stream ended."""
        while b"\n" not in self.buffer:
            if self.ended or len(self.buffer) > over_ssh.MAX_LINE:
                return EOF
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            self.ended = not chunk
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"


def watch(reader: LineReader, stop: Callable[[int], None] = lambda sig: os.kill(os.getpid(), sig),
          silent_after: float = over_ssh.SILENT_AFTER) -> threading.Thread:
    """A daemon thread that calls ``stop(signal)`` once: the signal of a ``stop`` line, else SIGTERM when the stream
    ends or stays silent for ``silent_after`` seconds."""
    thread = threading.Thread(target=lambda: stop(_stop_signal(reader, silent_after)), name="lifeline", daemon=True)
    thread.start()
    return thread


def _stop_signal(reader: LineReader, silent_after: float) -> int:
    while True:
        line = reader.next(silent_after)
        if line is None or line is EOF:
            return signal.SIGTERM
        fields = over_ssh.read_line(line) or {}
        sig = fields.get("stop")
        if isinstance(sig, int) and not isinstance(sig, bool) and sig in signal.valid_signals():
            return sig
