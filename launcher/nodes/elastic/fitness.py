"""What every backend's link does with the health checks: the keeper's verdicts on each launcher's checkups against
its own facts (``Judge``), a launcher's own checks again every interval while it is kept out (``Recheck``), and
its checkups made beside the link's thread (``Checker``), which goes on with its heartbeats meanwhile."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Optional

from launcher.nodes.elastic.link import Health
from launcher.output.messages import log
from launcher.plan import admission


class KeptOut(Exception):
    """Node 0 did not admit this launcher: its health checks failed (the sentence)."""


class Judge:
    """The keeper's verdicts on each launcher's health checkups, against its own facts (``health`` None: none is
    judged, every launcher passes)."""

    def __init__(self, health: Optional[Health]) -> None:
        self.health = health
        self.facts = None  # its own, made once, as it first judges (its checks may take a while: the user's own)
        self.verdicts: dict = {}  # node id -> the verdict on its last checkup (for the pages)

    def unfit(self, node_id: str, label: str, offered, given: bool = True) -> Optional[str]:
        """Why the checkup ``offered`` by ``node_id`` (``label``: how the sentence names it) fails; None: it passes. A
        checkup not sent counts as one only where one is due (``given``: a hello, a re-check; an older launcher's
        failure report has none)."""
        if self.health is None or (offered is None and not given):
            return None
        self.facts = self.facts or self.health.facts()  # its facts only: its own checks are not run in its thread
        verdict = self.health.judge(label, offered, self.facts)
        self.verdicts[node_id] = verdict
        return verdict.refusal

    def states(self) -> dict:
        """node id -> {check: (state, reason)} of each launcher's last checkup judged here (from any thread)."""
        return {node: admission.states(v) for node, v in list(self.verdicts.items())}


class Recheck:
    """A launcher kept out by its health checks: it says why (once for each reason), and checks itself again every
    interval (``due``)."""

    def __init__(self, health: Optional[Health]) -> None:
        self.health = health
        self.next_check: Optional[float] = None
        self.said = ""

    def kept_out(self, reason: Optional[str], now: float) -> bool:
        """Node 0 keeps this launcher out (``reason``; None: it waits as a standby): whether a check is newly due."""
        if self.health is None or self.next_check is not None:
            return False
        said, self.said = self.said, reason or ""
        if reason is not None:
            log.log(logging.WARNING if said != reason else logging.DEBUG, "elastic job: this launcher is kept out: %s; "
                    "it checks itself again every %g s", reason, self.health.settings.interval)
        self.next_check = now + self.health.settings.interval
        return True

    def due(self, now: float) -> bool:
        """Whether it is time to check again (then it is not due again until kept out again)."""
        if self.next_check is None or now < self.next_check:
            return False
        self.next_check = None
        return True


@dataclass(frozen=True)
class CheckedUp:
    """A checkup made in the checker's thread, back in the link's: ``after`` is the failure's report it was made
    for (None: a check again while kept out or waiting)."""

    after: object
    checkup: Optional[dict]


class Checker:
    """This launcher's checkups, each made in a thread of its own (the user's --health_check may run for minutes,
    longer than a heartbeat timeout), each put back in the link's ``waker`` as a ``CheckedUp``."""

    def __init__(self, health: Optional[Health], waker) -> None:
        self.health, self.waker = health, waker
        self.threads: list = []
        self.held: Optional[list] = None  # what the event loop said after a failure whose checkup is under way

    def holds(self, item) -> bool:
        """Whether ``item`` waits (kept, in order) for the checkup of the failure reported before it: a failure's
        report goes first, its stop and end after it."""
        if self.held is None or isinstance(item, CheckedUp):
            return False
        self.held.append(item)
        return True

    def released(self) -> list:
        """What waited for a failure's checkup, now that it came (to be handled in order)."""
        held, self.held = self.held or [], None
        return held

    @property
    def busy(self) -> bool:
        """Whether a checkup is under way."""
        self.threads = [t for t in self.threads if t.is_alive()]
        return bool(self.threads)

    def ask(self, after=None) -> None:
        if after is not None:
            self.held = self.held or []
        thread = threading.Thread(target=lambda: self.waker.put(CheckedUp(after, self.health.offer(after is not None))),
                                  name="launcher-health-check", daemon=True)
        self.threads.append(thread)
        thread.start()
