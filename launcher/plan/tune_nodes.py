"""Where ``launcher tune`` of a job of several nodes, started on each node (the same command on every one), has its
leading tuner, pure: on node 0's address (the nodes' ``--master_addr`` or first ``--cluster_node_ips``; an elastic
job's rendezvous host) at the tune port, and how many other nodes' tuners it waits for before the first trial (a
fixed job's other nodes; an elastic job's minimum but one, the others joining when they come). None for a job of one
node, or one that ``--hostfile`` starts whole (its trials need no other tuner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.errors import LaunchError

TUNE_PORT = 29600  # the default --tune_port: beside torchrun's 29500 and c10d's 29400


@dataclass(frozen=True)
class TuneNodes:
    address: str  # node 0's: where the leading tuner listens
    port: int
    followers: int  # the other nodes' tuners to wait for before the first trial
    elastic: bool  # whether more may join later


def tune_nodes(options, elastic, nodes_expected: Optional[int], port: int, whole: bool) -> Optional[TuneNodes]:
    """The tune link of the launch given to tune (``options``, ``elastic``, ``nodes_expected``: its request's;
    ``whole``: started whole by one command, --hostfile or --hosts)."""
    if whole:
        return None
    if elastic is not None:
        if not elastic.backend_row.has_node_0:
            raise LaunchError(f"launcher tune on the nodes of an elastic job needs a rendezvous with a node 0 (c10d: "
                              f"--rdzv_endpoint HOST:PORT), not {elastic.backend}; or start the trials whole with "
                              "--hostfile.")
        return TuneNodes(elastic.host, port, max(0, elastic.min_nodes - 1), True)
    ips = [ip for ip in (options.cluster_node_ips or "").split(",") if ip]
    count = nodes_expected or len(ips)
    if count <= 1:
        return None
    return TuneNodes(options.master_addr or ips[0], port, count - 1, False)
