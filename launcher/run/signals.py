"""Signal intake: every signal the launcher handles arrives through one wakeup pipe, in order,
for the event loop to read (no work is done in a handler).

The signals that stop the job are the plan's (torchrun's --signals-to-handle; by default SIGTERM,
SIGINT, SIGHUP and SIGQUIT): each is passed on to the workers, then the stop sequence follows.
SIGUSR1 and SIGUSR2, unless they are among them, are passed on without a stop. A default stop signal
left out of the set is not handled: it does to the launcher what it does to any process (SIGTERM,
SIGINT, SIGHUP end it at once, SIGQUIT with a core dump), unless it was ignored when the launcher
started; the workers then get SIGTERM from the kernel (PR_SET_PDEATHSIG, ``launcher.run.child``)
and the launcher's watchdog (``launcher.run.watchdog``) stops the rest of the job, SIGKILL after
the grace time, so that nothing is left running. SIGINT gets the default action too (not Python's
KeyboardInterrupt, which could stop the launcher anywhere in its loop).
"""

from __future__ import annotations

import os
import signal

from launcher.output.messages import log
from launcher.plan.torchrun_values import DEFAULT_STOP_SIGNALS

STOPPING_SIGNALS = DEFAULT_STOP_SIGNALS
# Ignored when the launcher starts (nohup, a shell's background job): left ignored, as every program
# does, so the workers inherit that too. SIGTERM, a scheduler's way to stop a job, is handled whenever it is a stop
# signal (it is but where --signals-to-handle leaves it out).
KEPT_IGNORED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PASSED_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class SignalIntake:
    def __init__(self, stopping: tuple = STOPPING_SIGNALS) -> None:
        self.fd, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # fd: the end the loop waits on
        self._old_handlers: dict = {}
        self.stopping = frozenset(signal.Signals(s) for s in stopping)  # the job stops on these
        self.passed_on = frozenset(s for s in PASSED_ON_SIGNALS if s not in self.stopping)  # passed on, no stop

    def install(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in sorted(self.stopping | self.passed_on) + [signal.SIGCHLD]:
            if sig in KEPT_IGNORED and signal.getsignal(sig) == signal.SIG_IGN:
                log.debug("%s was ignored when the launcher started: it stays ignored, for the workers too", sig.name)
                continue
            self._old_handlers[sig] = signal.signal(sig, _note_signal)
        if signal.SIGINT not in self.stopping and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_DFL)

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
