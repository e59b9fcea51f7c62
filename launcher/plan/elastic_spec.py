"""An elastic job's model: the ``ElasticSpec`` (how many nodes, around which node 0, with which
backend) and its ``Rendezvous`` settings, each with its bounds and default. Pure; the command lines
that make one are ``launcher.plan.elastic``'s.

The rendezvous settings, with this launcher's meanings (torchrun's ``--rdzv-conf`` keys; node 0's
launcher keeps the membership on its control channel, ``launcher.nodes.elastic.membership``):

- ``join_timeout`` (default 600 s, torchrun's): how long node 0 waits for MIN nodes, at the start and
  whenever losses leave fewer than MIN; then the job ends non-zero, naming the nodes lost. Another
  node's launcher tries to reach node 0 for as long. ``timeout`` (the static rendezvous's key) is
  the same setting.
- ``last_call_timeout`` (default 1 s; torchrun's is 30 s): once MIN nodes are in and no round runs,
  how long node 0 waits for more before it starts the round; MAX nodes start it at once. Short,
  because the launchers of one job start together and reach node 0 within milliseconds on a LAN,
  while a node later than the window is not lost: it joins the running job, which re-forms at once
  (one worker start). torchrun's 30 s delays every start for a node that may never come.
- ``close_timeout`` (default 30 s): at a re-form, how long node 0 waits for a member to report its
  workers stopped; a member that has not by then counts as lost.
- ``heartbeat_timeout`` (default 3 s): how long node 0 hears nothing from a node before it counts
  it as lost (torchrun's is how long one keep-alive write may take). Not given: ``keep_alive_interval``
  times ``keep_alive_max_attempt`` (torchrun's rule for a dead node) when either is given, else 3 s;
  10 s with etcd (torchrun's etcd lease), which outlasts the election of etcd's next leader.
- ``read_timeout`` (default 60 s, torchrun's): how long a launcher waits for node 0's answer to a
  request on the control channel (its join) before it drops that connection and connects again
  (within ``join_timeout``); node 0 holds a new connection that has not said hello as long.
- ``keep_alive_interval`` (default 1 s): how often each launcher sends node 0 a heartbeat.
- ``keep_alive_max_attempt`` (default 3): the heartbeats a node may miss before it is lost, when
  ``heartbeat_timeout`` is not given.
- ``is_host`` (torchrun's, a boolean): accepted, no effect: node 0 is the launcher that listens on
  the endpoint.

A membership change never spends a restart: ``max_restarts`` counts worker failures only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from launcher.plan.elastic_backends import Backend, backend_named

if TYPE_CHECKING:  # launcher.plan.etcd is imported by an elastic job's line only: every launch would pay its 2 ms
    from launcher.plan.etcd import EtcdSpec

REFORM_MARGIN = 5.0  # seconds past the loss's detection that a re-entering worker still waits for it


@dataclass(frozen=True)
class Setting:
    """One rendezvous setting: its bounds and default (seconds, or a count when ``whole``)."""

    name: str
    low: float
    high: float
    default: float
    whole: bool = False


SETTINGS = (
    Setting("join_timeout", 0.5, 86400, 600.0),
    Setting("last_call_timeout", 0, 3600, 1.0),
    Setting("close_timeout", 0.5, 86400, 30.0),
    Setting("heartbeat_timeout", 0.5, 3600, 3.0),
    Setting("read_timeout", 0.5, 3600, 60.0),
    Setting("keep_alive_interval", 0.05, 600, 1.0),
    Setting("keep_alive_max_attempt", 1, 1000, 3, whole=True),
)
SETTING = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Rendezvous:
    """The rendezvous settings, in seconds but ``keep_alive_max_attempt`` (see the module's docstring)."""

    join_timeout: float = SETTING["join_timeout"].default
    last_call_timeout: float = SETTING["last_call_timeout"].default
    close_timeout: float = SETTING["close_timeout"].default
    heartbeat_timeout: float = SETTING["heartbeat_timeout"].default
    read_timeout: float = SETTING["read_timeout"].default
    keep_alive_interval: float = SETTING["keep_alive_interval"].default
    keep_alive_max_attempt: int = int(SETTING["keep_alive_max_attempt"].default)
    given: frozenset = field(default=frozenset(), compare=False)  # the settings the user gave (or made from them)


@dataclass(frozen=True)
class ElasticSpec:
    """How many nodes a job runs on and how they meet: MIN to MAX nodes (elastic when they differ),
    around node 0's launcher at ``host``:``port`` (None: the launcher's default)."""

    min_nodes: int
    max_nodes: int
    backend: str  # the canonical name of its backend's row (``launcher.plan.elastic_backends``): what it means
    host: Optional[str] = None
    port: Optional[int] = None
    job_id: Optional[str] = None  # None: the launcher's default job id
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    max_restarts: int = 0  # worker failures the job may restart after; membership changes spend none
    failed_node_leaves: bool = False  # Paddle 3.x's --elastic_level 0: a worker failure takes its node out
    node_hosts: tuple = ()  # a static node list that came with the range: every node that may join
    etcd: Optional[EtcdSpec] = None  # the etcd cluster of an etcd rendezvous

    @property
    def nodes(self) -> str:
        """The number of nodes as the command line writes it: ``N`` (a fixed count) or ``MIN:MAX``."""
        return count_text(self.min_nodes, self.max_nodes)

    @property
    def backend_row(self) -> Backend:
        """Its backend's row: its names, whether it has a node 0, how it forms."""
        return backend_named(self.backend)

    @property
    def elastic(self) -> bool:
        """Whether the job's membership may change: a range of nodes, or any job on a backend whose fixed count
        is elastic too (etcd's: a lost node's place may be taken)."""
        return self.min_nodes < self.max_nodes or self.backend_row.fixed_count_elastic

    @property
    def failure_grace(self) -> float:
        """How long the membership's verdict on a worker failure waits for a loss that would explain it: a
        backend that finds a crashed node only when its lease expires (etcd) waits that long, and its lag
        in deleting an expired lease's keys; one that sees a connection close at once (c10d) does not wait."""
        return self.backend_row.failure_grace(self.rendezvous.heartbeat_timeout)

    @property
    def reform_wait(self) -> float:
        """How long a worker that re-enters in place (``launcher.runtime.elastic``) waits, once a collective failed,
        for the word that its round is over: the longest this backend takes to find a lost node, and a margin
        for a busy machine. Past it, the failure is the worker's own, and it fails as usual."""
        return self.rendezvous.heartbeat_timeout + self.failure_grace + REFORM_MARGIN


def count_text(low: int, high: int) -> str:
    """A number of nodes as written: ``N`` (a fixed count) or ``MIN:MAX``."""
    return str(low) if low == high else f"{low}:{high}"
