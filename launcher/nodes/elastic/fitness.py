"""What every backend's link does with the health checks: the keeper's verdicts on each launcher's checkups against
its own facts (``Judge``), and a launcher's own checks again every interval while it is kept out (``Recheck``)."""

from __future__ import annotations

import logging
from typing import Optional

from launcher.nodes.elastic.link import Health
from launcher.output.messages import log
from launcher.plan import admission


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
        self.facts = self.facts or self.health.check(False).facts
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
