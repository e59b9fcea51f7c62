"""``launcher tune`` on node 0 of a job whose nodes are started on their own: the leading tuner's side of each trial.
Before it: every other node's tuner (``launcher.nodes.tune``) ordered the trial's point and the trial's job id. While
it runs: their report lines written beside this node's, in the trial's folder (``reports.nodeN.relayed.jsonl``),
where the rate is read from; a node whose part fails (its launcher's exit code) fails the trial at once, with that
node's reason. After it: their trials stopped and waited for. A fixed job cannot go on without a node
whose tuner left; an elastic one goes on with the nodes it has."""

from __future__ import annotations

import secrets
import time
from typing import Optional

from launcher.errors import LaunchError
from launcher.nodes.tune.leader import Followers, is_taken
from launcher.output import report_log
from launcher.plan.tune_nodes import TuneNodes
from launcher.run.tune_trial import GRACE

ENDS_WITHIN = GRACE + 10.0  # seconds the other nodes' trials have to end after the stop


class NodesLost(LaunchError):
    exit_code = 1


class PartFailed(Exception):
    """Another node's part of the running trial failed (its launcher ended with an exit code): the trial has."""


def try_to_lead(nodes: TuneNodes, token: Optional[str]) -> Optional["Lead"]:
    """The lead of the tuning, if this node holds node 0's address and no other tuner listens at the tune port there;
    None: this node follows."""
    try:
        return Lead(nodes, Followers.bind(nodes.address, nodes.port, token))
    except OSError as e:
        if is_taken(e):
            return None
        raise LaunchError(f"the tuner cannot listen at {nodes.address}:{nodes.port} ({e.strerror}); give another "
                          "--tune_port, the same on every node.") from None


class Lead:
    def __init__(self, nodes: TuneNodes, followers: Followers) -> None:
        self.nodes, self.followers = nodes, followers
        self.session = secrets.token_hex(4)
        self.where = f"{nodes.address}:{nodes.port}"

    def gather(self, join_timeout: float) -> None:
        self.followers.wait(self.nodes.followers, time.monotonic() + join_timeout, self.where)

    def order(self, number: int, point: tuple) -> str:
        """Trial ``number`` ordered to every other node's tuner; its job id, the same on every node."""
        job_id = f"tune-{self.session}-{number}"
        self.followers.order(number, point, job_id)
        return job_id

    def waiting(self, folder: str) -> "Waiting":
        return Waiting(self.followers, folder)

    def stop(self, number: int, waiting: "Waiting") -> None:
        """The other nodes' trials stopped and waited for (at most ENDS_WITHIN seconds); NodesLost when a fixed job
        lost a node's tuner."""
        self.followers.stop(number)
        deadline = time.monotonic() + ENDS_WITHIN
        while not self.followers.ended(number) and time.monotonic() < deadline:
            waiting(0.2)
        self.followers.drop_unended(number, ENDS_WITHIN)
        waiting.close()
        if self.followers.lost and not self.nodes.elastic:
            raise NodesLost(f"{self.followers.lost[0]}; a fixed job cannot run its trials without that node, so the "
                            "tuning stops here.")

    def close(self, reason: Optional[str] = None) -> None:
        self.followers.close(reason)


class Waiting:
    """What the trial's loop waits with: the other nodes' lines taken meanwhile, each node's written to
    ``reports.nodeN.relayed.jsonl`` in the trial's folder (only lines that are one JSON object each)."""

    def __init__(self, followers: Followers, folder: str) -> None:
        self.followers, self.folder, self.logs = followers, folder, {}

    def __call__(self, seconds: float) -> None:
        self.followers.pump(seconds, self.write)
        if self.followers.failed:
            raise PartFailed(self.followers.failed[0])

    def write(self, follower: int, node: int, lines: list) -> None:
        if 0 <= node < 1 << 31:
            log_file = self.logs.setdefault(node, report_log.ReportLog(self.folder, node, relayed=True))
            log_file.relay(lines)

    def close(self) -> None:
        for log_file in self.logs.values():
            log_file.close(0.0)
