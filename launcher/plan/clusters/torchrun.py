"""The cluster source ``torchrun``: torchrun's --nnodes and --node-rank, the node list gathered at --master-addr. Pure.

Nodes are told apart by their --node-rank, so an address may be gathered more than once (nodes that share a host).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from launcher.errors import LaunchError
from launcher.plan.clusters.source import Cluster, GatherSpec, Request, Source, fail, well_formed_hosts, worker_ports

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "torchrun"


def _torchrun_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    return opts.nnodes is not None


def _torchrun_world(opts: LaunchOptions) -> tuple:
    """(nodes, this node's rank), checked."""
    if opts.nnodes is None:
        raise LaunchError("--cluster_env torchrun needs torchrun's --nnodes; give it, or choose another --cluster_env.")
    rank = opts.node_rank or 0  # torchrun's default
    if not 0 <= rank < opts.nnodes:
        raise LaunchError(f"--node-rank {rank} is not a rank of --nnodes {opts.nnodes}; give 0 to {opts.nnodes - 1}.")
    return opts.nnodes, rank


def _torchrun(req: Request) -> Cluster:
    nodes, rank = _torchrun_world(req.opts)
    given = ("--nnodes", "--node-rank") if nodes > 1 else ("--nnodes",)
    port = req.opts.started_port
    if nodes == 1:
        return Cluster(NAME, (req.opts.node_ip,), 0, worker_ports(req, port, f"--master-port {port}"), given)
    gathered = well_formed_hosts(req, tuple(req.host.gathered_nodes), "the gathered node list", ",".join(req.host.gathered_nodes))
    if len(gathered) != nodes:
        raise fail(req, f"--nnodes {nodes}, but {len(gathered)} nodes were gathered; give every node the same --nnodes.")
    return Cluster(NAME, gathered, rank, worker_ports(req, port, f"--master-port {port}"), given + ("--master-addr",),
                   detail=f"node list gathered at {req.opts.master_addr}, port {port - 1}")


def _torchrun_gathering(req: Request) -> Optional[GatherSpec]:
    """Several nodes: every node's address, gathered at node 0 (launcher.nodes.static.gather) on the store port minus one."""
    opts = req.opts
    nodes, rank = _torchrun_world(opts)
    if nodes == 1:
        return None
    if opts.control_port is not None:
        return GatherSpec(rank, nodes, opts.master_addr, opts.control_port, f"--control_port {opts.control_port}")
    if opts.started_port < 2:  # port 1 is a port (launcher.addresses), with none below it to gather on
        raise fail(req, f"--master-port {opts.started_port} leaves no port below it to gather the node list on; give "
                        "one with --control_port.")
    return GatherSpec(rank, nodes, opts.master_addr, opts.started_port - 1, f"--master-port {opts.started_port} minus one")


SOURCE = Source(NAME, "torchrun's options", _torchrun_found, _torchrun, "give --nnodes, --node-rank and --master-addr",
                gathering=_torchrun_gathering, replaces_cli_nodes=False)
