"""The values of torchrun 2.13's --duplicate-stdout/stderr-filters, --signals-to-handle and --event-log-handler,
read from their text as torchrun reads them (torch/distributed/run.py, torch/distributed/elastic/multiprocessing/api.py,
torch/distributed/elastic/events/handlers.py). Pure: text in, values out; a bad value raises LaunchError in one
sentence.
"""

from __future__ import annotations

import signal
from typing import Optional

from launcher.errors import LaunchError

# torchrun's default --signals-to-handle: the signals that stop the job, each passed on to the workers first
DEFAULT_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# the kernel lets no process catch these
UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})
# raised by a fault of the launcher's own code: a handler would return to the faulting instruction, and hang it
FAULTS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGSYS, signal.SIGTRAP})
# torch/distributed/elastic/events/handlers.py: console logs each event on stderr; the other two drop them
EVENT_LOG_HANDLERS = ("null", "console", "dynamic_rendezvous")
_ESCAPED_COMMA = "\0"  # torchrun's placeholder for ",,": no option text holds a NUL byte


def parse_filters(text: Optional[str]) -> tuple:
    """torchrun's ``comma_separated_list``: "apple,orange" as ("apple", "orange"), ",," standing for a comma in a
    filter ("a,,b" is the one filter "a,b"). An empty filter (the text "", or a trailing comma) is kept, as torchrun
    keeps it: it is in every line, so every line is copied. None (the option not given): no filter."""
    if text is None:
        return ()
    items = text.replace(",,", _ESCAPED_COMMA).split(",")
    return tuple(item.replace(_ESCAPED_COMMA, ",") for item in items)


def parse_signals(text: str, option: str = "--signals-to-handle") -> tuple:
    """The signal numbers of "SIGTERM,SIGINT,..." in their order, once each. A signal is named as torchrun names
    it (SIGUSR1), or without its SIG prefix, in any case (usr1), or by its number (10); empty items are skipped
    (torchrun skips what it cannot find), so "" is no signal at all. Refused: a name that is no signal, and a signal
    the launcher cannot handle (SIGKILL, SIGSTOP, SIGCHLD, a fault such as SIGSEGV)."""
    found = []
    for item in text.split(","):
        word = item.strip()
        if not word:
            continue
        sig = _signal_of(word, text, option)
        if sig not in found:
            found.append(sig)
    return tuple(int(s) for s in found)


def _signal_of(word: str, text: str, option: str) -> signal.Signals:
    if word.isdigit():
        try:
            sig = signal.Signals(int(word))
        except ValueError:
            raise LaunchError(f"{option} {text}: {word} is not the number of a signal the launcher can name; "
                              f"give signal names such as SIGTERM,SIGUSR1.") from None
    else:
        name = word.upper()
        sig = signal.Signals.__members__.get(name) or signal.Signals.__members__.get("SIG" + name)
        if sig is None:
            raise LaunchError(f"{option} {text}: {word} is not a signal name; give names such as SIGTERM,SIGUSR1.")
    if sig in UNCATCHABLE:
        raise LaunchError(f"{option} {text}: {sig.name} cannot be caught by any process; leave it out.")
    if sig == signal.SIGCHLD:
        raise LaunchError(f"{option} {text}: SIGCHLD is how the launcher learns that a worker ended, not a stop; "
                          f"leave it out.")
    if sig in FAULTS:
        raise LaunchError(f"{option} {text}: {sig.name} reports a fault of the launcher's own code, which a handler "
                          f"would turn into a hang; leave it out.")
    return sig


def parse_event_log_handler(text: str) -> str:
    """One of torchrun's event handlers by name (``EVENT_LOG_HANDLERS``), spelled as torchrun spells it."""
    name = text.strip()
    if name not in EVENT_LOG_HANDLERS:
        raise LaunchError(f"--event-log-handler {text!r} is not an event handler; give one of "
                          f"{', '.join(EVENT_LOG_HANDLERS)}.")
    return name
