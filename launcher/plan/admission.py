"""Whether a node is fit to take part in a job, as node 0 judges it: node 0's verdict on a checkup that came in a
hello (its own findings and the comparison of its facts with node 0's), and each node's verdict in a line for the
pages. Pure: the checkups and the times are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from launcher.plan.health import FAILED, Checkup, Facts, HealthSettings, compare, first_failure, sentence
from launcher.plan.policy import one_line

HEALTH = "health"  # the kind of the cause a job is refused with, and the cause a member leaves with
UNHEALTHY = "unhealthy"  # how the membership names a member taken out by its checks (events, metrics)


@dataclass(frozen=True)
class Verdict:
    """What node 0 made of one node's checkup: every finding (the node's own, then the comparison's), and the
    sentence it is refused with (None: fit)."""

    findings: Tuple = ()
    refusal: Optional[str] = None

    @property
    def fit(self) -> bool:
        return self.refusal is None


def own(node: str, checkup: Checkup) -> Verdict:
    """Node 0's verdict on itself (or a node's on itself): its own findings only."""
    failed = first_failure(checkup.findings)
    return Verdict(checkup.findings, sentence(node, failed) if failed is not None else None)


def judge(node: str, offered, node0: Facts, received_at: float, settings: HealthSettings) -> Verdict:
    """Node 0's verdict on the checkup ``offered`` off the wire by ``node`` (its label), its hello received at
    ``received_at`` on node 0's wall clock; what is not a checkup is a refusal, never an exception."""
    if offered is None:
        return Verdict((), f"{node} sent no health checkup (a launcher older than node 0's): run the same launcher "
                           "version on every node")
    checkup = Checkup.from_wire(offered)
    if checkup is None:
        return Verdict((), f"{node} sent a health checkup that is not one (a field missing or of a wrong type): run "
                           "the same launcher version on every node")
    findings = checkup.findings + compare(checkup.facts, node0, received_at, settings)
    failed = first_failure(findings)
    return Verdict(findings, one_line(sentence(node, failed), 600) if failed is not None else None)


def states(verdict: Verdict) -> dict:
    """check -> (state, reason) of each finding, the first of each check: for the pages and the metrics."""
    out: dict = {}
    for f in verdict.findings:
        out.setdefault(f.check, (f.state, f.reason))
    return out


def lines(judged: dict, most: int = 100) -> tuple:
    """Each node whose last checkup failed, in a line (``node -> states``), for ``launcher status``: its first failed
    check and why; at most ``most`` nodes (the nodes that passed are on the pages and /metrics)."""
    out = []
    for node, found in judged.items():
        failed = next(((check, why) for check, (state, why) in found.items() if state == FAILED), None)
        if failed is not None:
            out.append(one_line(f"health of node {node}: failed {failed[0]}: {failed[1]}", 1000))
    return tuple(out[:most])
