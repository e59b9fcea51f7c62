"""Seconds this worker waited in collectives, counted where the gradients' all-reduce is waited for
(``launcher.fleet``'s gradient sync, ``launcher.runtime.timed_allreduce_hook``), so that ``report`` can tell a step's own
work (its compute time: the step's time less that wait) from the wait for the slowest rank. The last rank to arrive
waits least. Imports no torch; a wait counted is a float added under a lock.

On CUDA with NCCL, waiting on a collective's Work makes the GPU's stream wait, not the host: what is counted is the
host's wait, near zero, and the GPU's wait shows up in whatever waits for the GPU next (``loss.item()``), which counts
as compute. The comparison is then of whole steps, as without this."""

from __future__ import annotations

import threading
from typing import Optional


class Waits:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0.0  # seconds, since the worker started
        self.since = 0.0  # seconds, since the last ``take``
        self.measured = False  # something counted a wait (else ``take`` gives None: nothing is known)

    def add(self, seconds: float) -> None:
        with self.lock:
            self.total += seconds
            self.since += seconds
            self.measured = True

    def take(self) -> Optional[float]:
        """The seconds waited since the last take; None while nothing ever counted a wait."""
        with self.lock:
            taken, self.since = self.since, 0.0
            return taken if self.measured else None


waits = Waits()


def add_wait(seconds: float) -> None:
    """Count ``seconds`` this worker spent waiting in a collective."""
    waits.add(max(0.0, seconds))


def waited() -> float:
    """Seconds this worker has waited in collectives in all (as counted by fleet's sync and the timed hook)."""
    return waits.total

