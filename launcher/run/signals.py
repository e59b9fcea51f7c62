"""Signal intake: every signal the launcher handles arrives through one wakeup pipe, in order,
for the event loop to read (no work is done in a handler)."""

from __future__ import annotations

import os
import signal

from launcher.output.messages import log

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Ignored when the launcher starts (nohup, a shell's background job): left ignored, as every program
# does, so the workers inherit that too. SIGTERM, a scheduler's way to stop a job, is always handled.
KEPT_IGNORED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PASSED_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
HANDLED_SIGNALS = STOPPING_SIGNALS + PASSED_ON_SIGNALS + (signal.SIGCHLD,)


class SignalIntake:
    def __init__(self) -> None:
        self.fd, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # fd: the end the loop waits on
        self._old_handlers: dict = {}

    def install(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            if sig in KEPT_IGNORED and signal.getsignal(sig) == signal.SIG_IGN:
                log.debug("%s was ignored when the launcher started: it stays ignored, for the workers too", sig.name)
                continue
            self._old_handlers[sig] = signal.signal(sig, _note_signal)

    def received(self) -> list:
        """Every signal received since the last call, in order (none is dropped)."""
        received = []
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return received
            if not data:
                return received
            received += [signal.Signals(n) for n in data]

    def restore(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        if self._old_handlers:
            signal.set_wakeup_fd(-1)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._wake_w)


def _note_signal(signum, frame) -> None:
    """The work is done in the event loop, which the wakeup pipe tells of the signal."""
