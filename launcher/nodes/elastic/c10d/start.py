"""Forming a c10d elastic job's link: which launcher keeps the membership, and the others' links to it.

Every launcher of the job runs the same command line (``--nnodes MIN:MAX`` with a rendezvous
endpoint HOST:PORT, no node rank). Each first tries to listen on the endpoint: the one that can is
node 0 (as torchrun's c10d, where the first to bind hosts the rendezvous) and keeps the membership
(``elastic_keeper``); the others connect to it, retrying every 0.2 s within ``join_timeout``. A
joining launcher says hello with an id of its own, its host (its end of the connection) and its
number of workers; both ends then send a heartbeat every ``keep_alive_interval``, and each counts
the other gone when its connection closes or it is silent for ``heartbeat_timeout``.

``form`` returns once this launcher's first round started (a standby waits until it takes a lost
member's place); from then on the link's thread (``serve``) passes node 0's orders (stop the
round's workers, the next round, the job's end) to the event loop's ``Inbox`` and node 0 what
happened here. Node 0's launcher leaving ends the job on every node (exit 1, saying so).

Messages are framed as the control channel frames them (``wire``), and each connection shakes hands
as every link between launchers does (``handshake``): node 0's challenge, the launcher's hello (with a
job token (LAUNCHER_JOB_TOKEN), its proof on node 0's nonce), node 0's welcome (its proof on the
launcher's) or refusal. From the welcome on, every message both ways (node 0's admission first) is
sealed in that member's session: a message forged, replayed, reordered or sealed for another member
loses the connection (node 0 counts the member lost; the member, node 0 gone). Without a token the
channel is open, as the static one is. Every wait is bounded.
"""

from __future__ import annotations

import errno
import socket
import time
from typing import Callable, Optional

from launcher.errors import LaunchError
from launcher.nodes.elastic import membership as mb
from launcher.nodes.elastic.c10d.keeper import Keeper
from launcher.nodes.elastic.c10d.member import MemberLink
from launcher.nodes.elastic.link import Health, Link, StartFailed, own_id
from launcher.nodes.transport.listener import bind
from launcher.plan.elastic import ElasticSpec
from launcher.plan.health import first_failure, sentence


def form(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic, health: Optional[Health] = None) -> Link:
    """This launcher's link to the job's membership once its first round started (node 0's when it can
    listen on the endpoint); ``token``: the job token (LAUNCHER_JOB_TOKEN), which every joining launcher
    proves on node 0's nonce, and which seals their channel from the welcome on. Its ``first`` is that
    round (None: a standby whose job ended with 0). ``health``: node 0 judges each launcher's checks by it (each
    launcher's checkup comes in its hello, and again after its worker failures and while it waits aside)."""
    listener = listen(spec.host, spec.port)
    if listener is None:
        return join(spec, job_id, workers, token, clock, health)
    return lead(listener, spec, job_id, workers, token, clock, health)


def lead(listener: socket.socket, spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic, health: Optional[Health] = None) -> Keeper:
    """Node 0's link, once the first round started on ``listener`` (the endpoint's); StartFailed if it cannot, and
    LaunchError (exit 2) if node 0 fails its own health checks: it cannot leave the job it keeps."""
    failed = first_failure(health.check(False).findings) if health is not None else None
    if failed is not None:
        listener.close()
        raise LaunchError(sentence(f"node 0 ({spec.host})", failed))
    keeper = Keeper(listener, spec, job_id, mb.Node(own_id(), spec.host, workers), token, clock, health)
    if keeper.first_round() is None:
        keeper.close()
        raise StartFailed(f"the elastic job did not start: {keeper.failed_start[1]}.")
    return keeper


def join(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic, health: Optional[Health] = None) -> MemberLink:
    """Another launcher's link, once its first round started."""
    return MemberLink(spec, job_id, workers, token, clock, health).join()


def listen(host: str, port: int) -> Optional[socket.socket]:
    """A listener on the endpoint, or None when another launcher holds it (or the host is not this machine's)."""
    try:
        return bind(host, port)
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            return None
        raise LaunchError(f"cannot listen on the rendezvous endpoint {host}:{port} ({e.strerror}); "
                          "give another --rdzv-endpoint (the same on every node).") from None
