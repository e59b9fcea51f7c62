"""The plan of a parameter-server job (Paddle 1.8's ``launch_ps``): servers and trainers, pure.

Two ways to describe the job:

- counts, one node: ``--server_num N --worker_num M`` (a missing one is 2, as in Paddle); servers
  take ports ``--started_port`` to ``+N-1`` and trainers the next ``M`` (free ports when unset);
- lists, any number of nodes: ``--servers ip:port,...`` and ``--workers ip:port,...``; each node
  starts the endpoints whose address is its own (``--node_ip``, or any address of this machine).

Processes are keyed in the plan (``WorkerSpec.rank``) by their place in the job: servers 0 to
N-1, then trainers N to N+M-1; ``role`` and ``role_index`` say what each one is. Locally the
trainers come first, so that the console shows the first trainer's output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from launcher import envvars as ev
from launcher.addresses import joined
from launcher.errors import LaunchError
from launcher.plan.common import (check_run_options, command, control_spec, endpoint_vars, error_file_of, node_vars,
                                  python_of, run_fields)
from launcher.plan.model import MAX_WORKERS_PER_NODE, HostFacts, LaunchOptions, Plan, WorkerSpec
from launcher.plan.parsing import first_duplicate, is_valid_host, parse_endpoint, port_range
from launcher.plan.roles import SERVER, TRAINER, Role

DEFAULT_COUNT = 2  # Paddle 1.8's launch_ps starts 2 servers and 2 trainers unless told otherwise
GLOO_PORT = 6767  # Paddle 2.6/3.x's --gloo_port default, for jobs described by --servers/--workers
HTTP_RENDEZVOUS = "3"  # PADDLE_GLOO_RENDEZVOUS: fleet's role maker on server 0 serves a KV store over HTTP

# Collective variables of the launcher's own environment that would mislead a server or trainer
_COLLECTIVE_VARS = (ev.RANK, ev.WORLD_SIZE, ev.LOCAL_RANK, ev.LOCAL_WORLD_SIZE, ev.GROUP_RANK, ev.GROUP_WORLD_SIZE,
                    ev.MASTER_ADDR, ev.MASTER_PORT, ev.TRAINER_ID, ev.PSERVER_ID, ev.TRAINING_ROLE, ev.SELECTED_GPUS,
                    ev.PADDLE_ROLE, ev.PADDLE_MASTER, ev.GLOBAL_SIZE, ev.LOCAL_SIZE, ev.GLOBAL_RANK, ev.PADDLE_LOCAL_RANK,
                    ev.RANK_IN_NODE, ev.DISTRI_BACKEND)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return joined(self.host, self.port)


@dataclass(frozen=True)
class Layout:
    servers: tuple  # Endpoint, by server id
    trainers: tuple  # Endpoint, by trainer id
    node_ips: tuple  # every host, servers' first, in order of appearance
    node_rank: int
    gloo: Endpoint  # where server 0's fleet serves the gloo rendezvous (fleet.util.all_reduce and barriers)


def make_ps_plan(
    opts: LaunchOptions,
    env: Mapping[str, str],
    host: HostFacts,
    find_free_ports: Callable[[str, int], Sequence[int]],
) -> Plan:
    _refuse_collective_options(opts)
    check_run_options(opts)
    if opts.servers is not None or opts.workers is not None:
        layout = _listed_layout(opts, host)
    else:
        layout = _counted_layout(opts, find_free_ports)
    base_env = {k: v for k, v in {**env, **dict(opts.extra_env)}.items() if k not in _COLLECTIVE_VARS}
    return _assemble(opts, host, base_env, layout)


def _refuse_collective_options(opts: LaunchOptions) -> None:
    given = [name for name, value, default in (
        ("--selected_gpus", opts.selected_gpus, None),
        ("--nproc_per_node", opts.nproc_per_node, None),
        ("--cluster_node_ips", opts.cluster_node_ips, "127.0.0.1"),
        ("--nnodes", opts.nnodes, None),
        ("--use_paddlecloud", opts.use_paddlecloud, False),
    ) if value != default]
    if opts.cluster_env not in ("auto", "cli"):
        raise LaunchError(f"--cluster_env {opts.cluster_env} is not supported in parameter-server mode, whose nodes come from "
                          f"--servers and --workers; drop --cluster_env.")
    if given:
        raise LaunchError(f"{given[0]} belongs to collective training, but --server_num/--worker_num/--servers/--workers "
                          f"ask for parameter-server mode; drop {given[0]}, or drop the parameter-server options.")


# ---------------------------------------------------------------- the two ways to describe the job


def _counted_layout(opts: LaunchOptions, find_free_ports) -> Layout:
    servers = _count(opts.server_num, "--server_num")
    trainers = _count(opts.worker_num, "--worker_num")
    ip = opts.node_ip
    count = servers + trainers + (opts.gloo_port is None)  # and the gloo rendezvous's, after the trainers'
    if opts.started_port is not None:
        ports = port_range(opts.started_port, count,
                           f"--started_port {opts.started_port} ({servers} servers, {trainers} trainers and fleet's gloo port)")
    else:
        ports = tuple(find_free_ports(ip, count))
        if len(ports) != count:
            raise LaunchError(f"could not find {count} free ports on {ip}; give --started_port.")
    ends = tuple(Endpoint(ip, p) for p in ports)
    gloo = Endpoint(ip, opts.gloo_port if opts.gloo_port is not None else ports[-1])
    _check_gloo(gloo, ends[:servers + trainers])
    return Layout(ends[:servers], ends[servers:servers + trainers], (ip,), 0, gloo)


def _check_gloo(gloo: Endpoint, endpoints: tuple) -> None:
    if not 1 <= gloo.port <= 65535:
        raise LaunchError(f"--gloo_port {gloo.port} is outside 1-65535; give a free port of server 0's host.")
    if gloo in endpoints:
        raise LaunchError(f"--gloo_port {gloo.port} is also the port of a server or trainer on {gloo.host}; choose another one.")


def _count(value: Optional[int], name: str) -> int:
    if value is None:
        return DEFAULT_COUNT
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchError(f"{name} {value!r} is not a positive whole number; give at least 1.")
    if value > MAX_WORKERS_PER_NODE:
        raise LaunchError(f"{name} {value} is more processes than a node has ports; give at most {MAX_WORKERS_PER_NODE}.")
    return value


def _listed_layout(opts: LaunchOptions, host: HostFacts) -> Layout:
    if opts.servers is None or opts.workers is None:
        missing = "--workers" if opts.workers is None else "--servers"
        raise LaunchError(f"{missing} is missing: a parameter-server job described by endpoints needs both --servers "
                          f"and --workers (ip:port,...), or give --server_num/--worker_num for one node.")
    if opts.started_port is not None:
        raise LaunchError("--started_port has no meaning with --servers/--workers, whose endpoints carry the ports; drop it.")
    servers = _endpoints(opts.servers, "--servers")
    trainers = _endpoints(opts.workers, "--workers")
    for name, count, listed in (("--server_num", opts.server_num, servers), ("--worker_num", opts.worker_num, trainers)):
        if count is not None and count != len(listed):
            flag = "--servers" if listed is servers else "--workers"
            raise LaunchError(f"{name} {count} disagrees with {flag}, which lists {len(listed)}; drop {name} or make them match.")
    dup = first_duplicate([str(e) for e in servers + trainers])
    if dup is not None:
        raise LaunchError(f"--servers/--workers list the endpoint {dup} twice; give every server and trainer an endpoint of its own.")
    node_ips = tuple(dict.fromkeys(e.host for e in servers + trainers))
    node_ip = _this_node(opts.node_ip, node_ips, host)
    gloo = Endpoint(servers[0].host, opts.gloo_port if opts.gloo_port is not None else GLOO_PORT)
    _check_gloo(gloo, servers + trainers)
    return Layout(servers, trainers, node_ips, node_ips.index(node_ip), gloo)


def _endpoints(text: str, name: str) -> tuple:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(items):
        raise LaunchError(f"{name}={text!r} has an empty endpoint; give comma-separated ip:port pairs such as 10.0.0.1:6170.")
    ends = []
    for item in items:
        h, p = parse_endpoint(item, name)
        if not is_valid_host(h):
            raise LaunchError(f"{name} has the endpoint {item!r}, whose address {h!r} is malformed; give an IP or a host name.")
        ends.append(Endpoint(h, p))
    return tuple(ends)


def _this_node(node_ip: str, node_ips: tuple, host: HostFacts) -> str:
    """--node_ip when it is one of the job's hosts; else the one host of the lists that is an address here."""
    if node_ip in node_ips:
        return node_ip
    local = [ip for ip in node_ips if ip in {i.address for i in host.interfaces}]
    if node_ip == "127.0.0.1" and len(local) == 1:  # --node_ip left at its default
        return local[0]
    hosts = ",".join(node_ips)
    if node_ip != "127.0.0.1":
        raise LaunchError(f"--node_ip {node_ip} hosts none of the --servers/--workers endpoints (hosts {hosts}); "
                          "give this node's address as it appears in those lists.")
    found = f"several of them are addresses of this machine ({','.join(local)})" if local else "none of them is an address of this machine"
    raise LaunchError(f"--servers/--workers name the hosts {hosts}, and {found}; give --node_ip with this node's address from those lists.")


# ---------------------------------------------------------------- the plan


def _assemble(opts: LaunchOptions, host: HostFacts, base_env: dict, layout: Layout) -> Plan:
    node_ip = layout.node_ips[layout.node_rank]
    mine_t = [(j, e) for j, e in enumerate(layout.trainers) if e.host == node_ip]
    mine_s = [(i, e) for i, e in enumerate(layout.servers) if e.host == node_ip]
    servers = ",".join(map(str, layout.servers))
    files, trainer_vars = endpoint_vars(",".join(map(str, layout.trainers)), host, base_env)
    shared = {
        ev.PSERVERS_IP_PORT_LIST: servers,
        ev.TRAINERS_NUM: str(len(layout.trainers)),
        ev.RUN_ID: host.run_id,
        **trainer_vars,
        **gloo_vars(opts, host, layout.gloo),
    }
    shared.update(node_vars(base_env, host, node_ip, len(mine_t) + len(mine_s), (ev.GLOO_SOCKET_IFNAME, ev.TP_SOCKET_IFNAME)))
    cmd = command(opts, python_of(base_env, host))
    specs = []
    for j, e in mine_t:
        own = {ev.TRAINING_ROLE: TRAINER.paddle_role, ev.PADDLE_ROLE: TRAINER.paddle_role, ev.TRAINER_ID: str(j), ev.CURRENT_ENDPOINT: str(e),
               ev.PORT: str(e.port), ev.POD_IP: e.host, ev.ERROR_FILE: error_file_of(host, len(layout.servers) + j)}
        specs.append(_spec(opts, len(layout.servers) + j, len(specs), e, cmd, {**shared, **own}, TRAINER, j))
    for i, e in mine_s:
        own = {ev.TRAINING_ROLE: SERVER.paddle_role, ev.PADDLE_ROLE: SERVER.paddle_role, ev.PSERVER_ID: str(i), ev.PORT: str(e.port), ev.POD_IP: e.host,
               ev.CURRENT_ENDPOINT: str(e), ev.ERROR_FILE: error_file_of(host, i)}
        specs.append(_spec(opts, i, len(specs), e, cmd, {**shared, **own}, SERVER, i))
    node0 = tuple(e.port for e in layout.servers + layout.trainers if e.host == layout.node_ips[0])
    return Plan(
        node_ips=layout.node_ips,
        node_rank=layout.node_rank,
        world_size=len(layout.servers) + len(layout.trainers),
        ports=tuple(e.port for _, e in mine_t + mine_s),
        device="cpu",
        workers=tuple(specs),
        control=control_spec(opts, base_env, layout.node_ips, node0, cmd),
        servers=tuple(map(str, layout.servers)),
        trainers=tuple(map(str, layout.trainers)),
        **run_fields(opts, base_env, files, node_ip),
    )


def held_by(plan) -> tuple:
    """Per node of a parameter-server plan, by node rank: (its server ids, its trainer ids), those whose
    endpoint's address is that node's."""
    rank = {ip: n for n, ip in enumerate(plan.node_ips)}
    held = [([], []) for _ in plan.node_ips]
    for kind, ends in enumerate((plan.servers, plan.trainers)):
        for i, e in enumerate(ends):
            held[rank[parse_endpoint(e, "the plan")[0]]][kind].append(i)
    return tuple((tuple(s), tuple(t)) for s, t in held)


def gloo_vars(opts: LaunchOptions, host: HostFacts, gloo: Endpoint) -> dict:
    """Fleet's gloo rendezvous, as Paddle 2.6/3.x's launcher gives it: over HTTP, served by server 0's role maker."""
    if opts.with_gloo not in ("0", "1", "2"):
        raise LaunchError(f"--with_gloo {opts.with_gloo!r} is not 0, 1 or 2; give 1 (gloo among trainers, the default), "
                          "2 (among all) or 0 (none).")
    folder = os.path.join(host.temp_dir, f"launcher-{host.run_id}", "gloo")
    return {ev.WITH_GLOO: opts.with_gloo, ev.GLOO_RENDEZVOUS: HTTP_RENDEZVOUS, ev.GLOO_HTTP_ENDPOINT: str(gloo),
            ev.GLOO_FS_PATH: folder}


def _spec(opts, key: int, local: int, endpoint: Endpoint, cmd: tuple, env: dict, role: Role, index: int) -> WorkerSpec:
    log_file = os.path.join(opts.log_dir, role.log_name_of(index)) if opts.log_dir else None
    return WorkerSpec(key, local, str(endpoint), None, cmd, env, log_file, role=role.name, role_index=index)
