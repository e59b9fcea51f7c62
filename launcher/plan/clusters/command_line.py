"""The cluster source ``cli``: the nodes of --cluster_node_ips, this one --node_ip (Paddle 1.8), or --rank where
nodes share a host (an address listed more than once). Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from launcher.plan.clusters.source import (DEFAULT_NODES, MULTI_NODE_PORT, MULTI_NODE_START, Cluster, Request, Source,
                                           worker_ports)
from launcher.plan.parsing import node_rank_of, parse_node_list

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "cli"


def _cli_given(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    return opts.cluster_node_ips != DEFAULT_NODES


def _cli(req: Request) -> Cluster:
    opts = req.opts
    node_ips = parse_node_list(opts.cluster_node_ips, "--cluster_node_ips")
    node_rank = node_rank_of(node_ips, opts.node_ip, "--node_ip", "--cluster_node_ips", opts.node_rank)
    ports = worker_ports(req, MULTI_NODE_PORT if len(node_ips) > 1 else None, MULTI_NODE_START)
    given = ("--cluster_node_ips", "--node_ip") if opts.node_rank is None else ("--cluster_node_ips", "--rank")
    return Cluster(NAME, node_ips, node_rank, ports, given)


SOURCE = Source(NAME, "the command line", _cli_given, _cli, "give --cluster_node_ips and --node_ip", replaces_cli_nodes=False)
