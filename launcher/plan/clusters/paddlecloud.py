"""The cluster source ``paddlecloud`` (Paddle 1.8's --use_paddlecloud): PADDLE_TRAINERS, POD_IP, PADDLE_TRAINER_ID. Pure.

PADDLE_TRAINER_ID tells the nodes apart, so PADDLE_TRAINERS may list a host more than once (pods that share a
host): each gets its own ports, those of DISTRIBUTED_TRAINER_ENDPOINTS, else the next ones after the pods before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from launcher.addresses import joined
from launcher.errors import LaunchError
from launcher.plan.clusters import command_line
from launcher.plan.clusters.source import DEFAULT_NODES, Cluster, Request, Source, int_var, var
from launcher.plan.parsing import first_duplicate, parse_endpoint, parse_node_list, port_range

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "paddlecloud"
PADDLECLOUD_PORT = 6170  # Paddle 1.8's default under --use_paddlecloud
PADDLECLOUD_VARS = ("PADDLE_TRAINERS", "POD_IP", "PADDLE_TRAINER_ID")


def _paddlecloud_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    """Its three variables, and PADDLE_TRAINERS_NUM saying several trainers (as --use_paddlecloud needs)."""
    trainers = env.get("PADDLE_TRAINERS_NUM", "").strip()
    return all(env.get(v, "").strip() for v in PADDLECLOUD_VARS) and trainers not in ("", "1")


def _paddlecloud(req: Request) -> Cluster:
    if int_var(req, "PADDLE_TRAINERS_NUM", default=1) == 1:
        return command_line.SOURCE.resolve(req)  # Paddle 1.8: a single trainer ignores the cloud's variables
    env, opts = req.env, req.opts
    node_ips = parse_node_list(var(req, "PADDLE_TRAINERS"), "PADDLE_TRAINERS")
    pod_ip = var(req, "POD_IP")
    node_rank = int_var(req, "PADDLE_TRAINER_ID")
    if not 0 <= node_rank < len(node_ips) or node_ips[node_rank] != pod_ip:
        raise LaunchError(f"PADDLE_TRAINER_ID={node_rank} does not point at POD_IP={pod_ip} in PADDLE_TRAINERS={','.join(node_ips)}; fix the PaddleCloud environment.")
    notes = []
    if opts.node_ip not in (DEFAULT_NODES, pod_ip):
        notes.append(f"{req.chosen_by}: using POD_IP={pod_ip} instead of --node_ip {opts.node_ip}.")
    if opts.cluster_node_ips not in (DEFAULT_NODES, ",".join(node_ips)):
        notes.append(f"{req.chosen_by}: using PADDLE_TRAINERS={','.join(node_ips)} instead of --cluster_node_ips {opts.cluster_node_ips}.")
    explicit = env.get("DISTRIBUTED_TRAINER_ENDPOINTS", "").strip()
    if explicit:
        every = _ports_from_endpoints(explicit, node_ips, node_rank, req.nper)
        return Cluster(NAME, node_ips, node_rank, every[node_rank], PADDLECLOUD_VARS + ("DISTRIBUTED_TRAINER_ENDPOINTS",),
                       tuple(notes), node_ports=every)
    port, given_as, used = _paddlecloud_start_port(req, len(node_ips))
    return Cluster(NAME, node_ips, node_rank, port_range(port, req.nper, given_as), PADDLECLOUD_VARS + used, tuple(notes))


def _paddlecloud_start_port(req: Request, nodes: int):
    """PADDLE_PORT (several nodes, enough TRAINER_PORTS_NUM), else --started_port, else 6170, as Paddle 1.8.

    Both variables are optional: Paddle 1.8 falls back when either is unset.
    """
    paddle_port = int_var(req, "PADDLE_PORT", optional=True)
    ports_num = int_var(req, "TRAINER_PORTS_NUM", optional=True)
    if nodes > 1 and paddle_port is not None and ports_num is not None and ports_num >= req.nper:
        return paddle_port, f"PADDLE_PORT={paddle_port}", ("PADDLE_PORT", "TRAINER_PORTS_NUM")
    if req.opts.started_port is not None:
        return req.opts.started_port, f"--started_port {req.opts.started_port}", ()
    return PADDLECLOUD_PORT, f"the PaddleCloud default start port {PADDLECLOUD_PORT}", ()


def _ports_from_endpoints(text: str, node_ips: tuple, node_rank: int, nper: int) -> tuple:
    """Every node's ports, by node rank, as DISTRIBUTED_TRAINER_ENDPOINTS gives them (nodes of one host each their own)."""
    name = "DISTRIBUTED_TRAINER_ENDPOINTS"
    endpoints = [e.strip() for e in text.split(",")]
    if len(endpoints) != nper * len(node_ips):
        raise LaunchError(f"{name} has {len(endpoints)} endpoints, but {len(node_ips)} nodes of {nper} workers need {nper * len(node_ips)}.")
    parsed = [parse_endpoint(e, name) for e in endpoints]
    dup = first_duplicate([joined(h, p) for h, p in parsed])
    if dup is not None:
        raise LaunchError(f"{name} lists the endpoint {dup} twice; give every worker an endpoint of its own.")
    mine = range(node_rank * nper, (node_rank + 1) * nper)
    for i in mine:
        if parsed[i][0] != node_ips[node_rank]:
            raise LaunchError(f"{name} has {endpoints[i]!r} where an endpoint of {node_ips[node_rank]} (host:port) belongs.")
    return tuple(tuple(port for _, port in parsed[n * nper:(n + 1) * nper]) for n in range(len(node_ips)))


SOURCE = Source(NAME, "PaddleCloud", _paddlecloud_found, _paddlecloud, "set it or drop --use_paddlecloud", replaces_cli_nodes=False)
