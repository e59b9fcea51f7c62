"""The launch plan: options, environment values and host facts in, frozen worker specs out.

Everything here is pure: no I/O, no ``os.environ``. Bad input raises LaunchError.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from launcher import envvars as ev
from launcher.errors import LaunchError

DEFAULT_CPU_WORKERS = 2
MULTI_NODE_PORT = 6070  # Paddle 1.8's default when several nodes are given
PADDLECLOUD_PORT = 6170  # Paddle 1.8's default under --use_paddlecloud
# Linux refuses a single "NAME=value" string longer than MAX_ARG_STRLEN (32 pages).
MAX_ENV_STRING = 128 * 1024

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked for, after command line and config file are merged."""

    training_script: str
    training_script_args: tuple = ()
    cluster_node_ips: str = "127.0.0.1"
    node_ip: str = "127.0.0.1"
    started_port: Optional[int] = None
    selected_gpus: Optional[str] = None
    nproc_per_node: Optional[int] = None
    log_dir: Optional[str] = None
    use_paddlecloud: bool = False
    module: bool = False
    no_python: bool = False
    shutdown_timeout: float = 10.0
    extra_env: tuple = ()  # (name, value) pairs from the config file's `env`


@dataclass(frozen=True)
class Interface:
    name: str
    address: str
    netmask: Optional[str]


@dataclass(frozen=True)
class HostFacts:
    """What the launcher found out about this machine before planning."""

    gpu_count: Optional[int]  # None: no GPU can be detected at all
    cpu_count: int
    interfaces: tuple = ()  # Interface, one per address
    python: str = "python3"
    run_id: str = "run"
    temp_dir: str = "/tmp"


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    local_rank: int
    endpoint: str
    gpu: Optional[str]  # the value of FLAGS_selected_gpus; None for a CPU worker
    cmd: tuple
    env: Mapping[str, str]  # what the launcher sets, on top of Plan.base_env
    log_file: Optional[str]


@dataclass(frozen=True)
class Plan:
    node_ips: tuple
    node_rank: int
    world_size: int
    ports: tuple
    device: str  # "gpu" or "cpu"
    workers: tuple  # WorkerSpec, local ones only, by local rank
    base_env: Mapping[str, str]
    log_dir: Optional[str]
    shutdown_timeout: float
    files: Mapping[str, str] = field(default_factory=dict)  # path -> text, written before start
    notes: tuple = ()  # warnings for the user, in plain sentences
    cpu_default: bool = False  # no GPU and no --nproc_per_node: the default number of CPU workers

    @property
    def node_ip(self) -> str:
        return self.node_ips[self.node_rank]

    @property
    def endpoints(self) -> tuple:
        return endpoint_list(self.node_ips, self.ports)


@dataclass(frozen=True)
class _Cluster:
    node_ips: tuple
    node_rank: int
    ports: Optional[tuple]  # None: free ports are to be found on this node
    notes: tuple = ()


# ---------------------------------------------------------------- entry point


def make_plan(
    opts: LaunchOptions,
    env: Mapping[str, str],
    host: HostFacts,
    find_free_ports: Callable[[str, int], Sequence[int]] = lambda ip, n: (),
) -> Plan:
    """Resolve devices, nodes, ranks, endpoints and each local worker's environment.

    ``find_free_ports(ip, n)`` is called only when one node runs without --started_port.
    """
    if opts.nproc_per_node is not None and opts.nproc_per_node < 1:
        raise LaunchError(f"--nproc_per_node {opts.nproc_per_node} is below 1; give at least 1 worker per node.")
    if opts.module and opts.no_python:
        raise LaunchError("--module and --no_python exclude each other; give only one of them.")
    base_env = {**env, **dict(opts.extra_env)}
    gpus, gpu_notes = _select_gpus(opts, base_env, host.gpu_count)
    nper = len(gpus) if gpus is not None else (opts.nproc_per_node or DEFAULT_CPU_WORKERS)
    cluster = _paddlecloud_cluster(opts, env, nper) if _uses_paddlecloud(opts, env) else _cli_cluster(opts, nper)
    ports = cluster.ports
    if ports is None:
        ports = tuple(find_free_ports(cluster.node_ips[cluster.node_rank], nper))
        if len(ports) != nper:
            raise LaunchError(f"could not find {nper} free ports on {cluster.node_ips[cluster.node_rank]}; give --started_port.")
    notes = tuple(gpu_notes) + cluster.notes
    if gpus is None:
        base_env.pop(ev.SELECTED_GPUS, None)
    return _assemble(opts, host, base_env, cluster, ports, gpus, notes)


def _assemble(opts, host, base_env, cluster, ports, gpus, notes) -> Plan:
    nper = len(ports)
    world = nper * len(cluster.node_ips)
    endpoints = endpoint_list(cluster.node_ips, ports)
    files, endpoint_vars = _endpoint_vars(",".join(endpoints), host)
    node_ip = cluster.node_ips[cluster.node_rank]
    shared = {
        ev.TRAINERS_NUM: str(world),
        ev.WORLD_SIZE: str(world),
        ev.LOCAL_WORLD_SIZE: str(nper),
        ev.GROUP_RANK: str(cluster.node_rank),
        ev.GROUP_WORLD_SIZE: str(len(cluster.node_ips)),
        ev.MASTER_ADDR: cluster.node_ips[0],
        ev.MASTER_PORT: str(ports[0]),
        ev.RUN_ID: host.run_id,
        **endpoint_vars,
    }
    if ev.OMP_NUM_THREADS not in base_env:
        shared[ev.OMP_NUM_THREADS] = str(max(1, host.cpu_count // nper))
    iface = interface_of(node_ip, host.interfaces)
    if iface and ev.GLOO_SOCKET_IFNAME not in base_env:
        shared[ev.GLOO_SOCKET_IFNAME] = iface
    cmd = _command(opts, host.python)
    workers = []
    for local in range(nper):
        rank = cluster.node_rank * nper + local
        own = {
            ev.TRAINER_ID: str(rank),
            ev.RANK: str(rank),
            ev.LOCAL_RANK: str(local),
            ev.CURRENT_ENDPOINT: endpoints[rank],
        }
        gpu = gpus[local] if gpus is not None else None
        if gpu is not None:
            own[ev.SELECTED_GPUS] = gpu
        log_file = os.path.join(opts.log_dir, f"workerlog.{rank}") if opts.log_dir else None
        workers.append(WorkerSpec(rank, local, endpoints[rank], gpu, cmd, {**shared, **own}, log_file))
    return Plan(
        node_ips=cluster.node_ips,
        node_rank=cluster.node_rank,
        world_size=world,
        ports=ports,
        device="gpu" if gpus is not None else "cpu",
        workers=tuple(workers),
        base_env=base_env,
        log_dir=opts.log_dir,
        shutdown_timeout=opts.shutdown_timeout,
        files=files,
        notes=notes,
        cpu_default=gpus is None and opts.nproc_per_node is None,
    )


# ---------------------------------------------------------------- devices


def _select_gpus(opts: LaunchOptions, env: Mapping[str, str], gpu_count: Optional[int]):
    """The FLAGS_selected_gpus value of each local worker, or None for CPU workers."""
    visible = _visible_devices(env)
    if opts.selected_gpus is None:
        available = visible if visible is not None else [str(i) for i in range(gpu_count or 0)]
        if not available or (visible is not None and not gpu_count):
            return None, ()
        n = opts.nproc_per_node or len(available)
        if n > len(available):
            raise LaunchError(f"--nproc_per_node {n} asks for more GPUs than the {len(available)} available ({','.join(available)}); give at most {len(available)}.")
        return tuple(_gpu_flag(g, visible) for g in available[:n]), ()
    ids = _parse_gpu_ids(opts.selected_gpus, visible)
    if opts.nproc_per_node is not None and opts.nproc_per_node != len(ids):
        raise LaunchError(f"--nproc_per_node {opts.nproc_per_node} disagrees with --selected_gpus={opts.selected_gpus} ({len(ids)} GPUs); give one of them, or make them match.")
    if visible is not None:
        missing = [g for g in ids if g not in visible]
        if missing:
            raise LaunchError(f"GPU {missing[0]} of --selected_gpus={opts.selected_gpus} is not in CUDA_VISIBLE_DEVICES={','.join(visible)}; choose among those.")
    elif gpu_count is not None:
        missing = [g for g in ids if int(g) >= gpu_count]
        if missing:
            raise LaunchError(f"GPU {missing[0]} of --selected_gpus={opts.selected_gpus} does not exist: this machine has {gpu_count} GPU(s), ids 0 to {gpu_count - 1}.")
    notes = ()
    if not gpu_count:
        notes = (f"no GPU detected on this machine: passing --selected_gpus={opts.selected_gpus} on to the workers as given.",)
    return tuple(_gpu_flag(g, visible) for g in ids), notes


def _visible_devices(env: Mapping[str, str]):
    value = env.get(ev.CUDA_VISIBLE_DEVICES)
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_gpu_ids(text: str, visible) -> list:
    ids = [g.strip() for g in text.split(",")]
    for g in ids:
        named = visible is not None and g in visible
        if not (g.isdigit() or named):
            raise LaunchError(f"--selected_gpus={text} has a malformed GPU id {g!r}; give comma-separated ids such as 0,1,2,3.")
    dup = _first_duplicate(ids)
    if dup is not None:
        raise LaunchError(f"--selected_gpus={text} names GPU {dup} twice; give each GPU once.")
    return ids


def _gpu_flag(gpu: str, visible) -> str:
    """A GPU id as the worker sees it: its index in CUDA_VISIBLE_DEVICES when that is set."""
    return str(visible.index(gpu)) if visible is not None else gpu


# ---------------------------------------------------------------- nodes and ports


def _cli_cluster(opts: LaunchOptions, nper: int) -> _Cluster:
    node_ips = parse_node_list(opts.cluster_node_ips, "--cluster_node_ips")
    node_rank = _node_rank(node_ips, opts.node_ip, "--node_ip", "--cluster_node_ips")
    port = opts.started_port
    if port is None and len(node_ips) > 1:
        port = MULTI_NODE_PORT
    return _Cluster(node_ips, node_rank, None if port is None else _port_range(port, nper, "--started_port"))


def _uses_paddlecloud(opts: LaunchOptions, env: Mapping[str, str]) -> bool:
    if not opts.use_paddlecloud:
        return False
    return _int_var(env, "PADDLE_TRAINERS_NUM", default=1) != 1


def _paddlecloud_cluster(opts: LaunchOptions, env: Mapping[str, str], nper: int) -> _Cluster:
    node_ips = parse_node_list(_need_var(env, "PADDLE_TRAINERS"), "PADDLE_TRAINERS")
    pod_ip = _need_var(env, "POD_IP")
    node_rank = _int_var(env, "PADDLE_TRAINER_ID")
    ports_num = _int_var(env, "TRAINER_PORTS_NUM")
    if not 0 <= node_rank < len(node_ips) or node_ips[node_rank] != pod_ip:
        raise LaunchError(f"PADDLE_TRAINER_ID={node_rank} does not point at POD_IP={pod_ip} in PADDLE_TRAINERS={','.join(node_ips)}; fix the PaddleCloud environment.")
    notes = []
    if opts.node_ip not in ("127.0.0.1", pod_ip):
        notes.append(f"--use_paddlecloud: using POD_IP={pod_ip} instead of --node_ip {opts.node_ip}.")
    if opts.cluster_node_ips not in ("127.0.0.1", ",".join(node_ips)):
        notes.append(f"--use_paddlecloud: using PADDLE_TRAINERS={','.join(node_ips)} instead of --cluster_node_ips {opts.cluster_node_ips}.")
    explicit = env.get("DISTRIBUTED_TRAINER_ENDPOINTS")
    if explicit:
        ports = _ports_from_endpoints(explicit, node_ips, node_rank, nper)
        return _Cluster(node_ips, node_rank, ports, tuple(notes))
    port = opts.started_port
    if len(node_ips) > 1 and ports_num >= nper:
        port = _int_var(env, "PADDLE_PORT")
    return _Cluster(node_ips, node_rank, _port_range(port or PADDLECLOUD_PORT, nper, "the start port"), tuple(notes))


def _ports_from_endpoints(text: str, node_ips: tuple, node_rank: int, nper: int) -> tuple:
    endpoints = [e.strip() for e in text.split(",")]
    if len(endpoints) != nper * len(node_ips):
        raise LaunchError(f"DISTRIBUTED_TRAINER_ENDPOINTS has {len(endpoints)} endpoints, but {len(node_ips)} nodes of {nper} workers need {nper * len(node_ips)}.")
    mine = endpoints[node_rank * nper:(node_rank + 1) * nper]
    ports = []
    for e in mine:
        host, _, port = e.rpartition(":")
        if host.strip("[]") != node_ips[node_rank] or not port.isdigit():
            raise LaunchError(f"DISTRIBUTED_TRAINER_ENDPOINTS has {e!r} where an endpoint of {node_ips[node_rank]} (host:port) belongs.")
        ports.append(int(port))
    return tuple(ports)


def _port_range(first: int, count: int, name: str) -> tuple:
    if not 1 <= first or first + count - 1 > 65535:
        raise LaunchError(f"{name} {first} with {count} workers needs ports {first} to {first + count - 1}, outside 1-65535; choose a start port between 1024 and {65535 - count + 1}.")
    return tuple(range(first, first + count))


def parse_node_list(text: str, name: str) -> tuple:
    nodes = tuple(n.strip() for n in text.split(","))
    for n in nodes:
        if not is_valid_host(n):
            raise LaunchError(f"{name}={text} has a malformed address {n!r}; give comma-separated IPs or host names, such as 192.168.0.1,192.168.0.2.")
    dup = _first_duplicate(nodes)
    if dup is not None:
        raise LaunchError(f"{name}={text} lists {dup} twice; give each node once, in node-rank order.")
    return nodes


def is_valid_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(text)) and not text.replace(".", "").isdigit()


def _node_rank(node_ips: tuple, node_ip: str, name: str, list_name: str) -> int:
    if node_ip not in node_ips:
        raise LaunchError(f"{name} {node_ip} is not in {list_name} {','.join(node_ips)}; give this node's address as it appears in that list.")
    return node_ips.index(node_ip)


def endpoint_list(node_ips: Sequence[str], ports: Sequence[int]) -> list:
    return [f"{_host_part(ip)}:{p}" for ip in node_ips for p in ports]


def _host_part(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _endpoint_vars(endpoints: str, host: HostFacts):
    """PADDLE_TRAINER_ENDPOINTS, or a file naming them when the variable would be too long."""
    if len(ev.TRAINER_ENDPOINTS) + len(endpoints) + 2 <= MAX_ENV_STRING:
        return {}, {ev.TRAINER_ENDPOINTS: endpoints}
    path = os.path.join(host.temp_dir, f"launcher-{host.run_id}", "trainer_endpoints")
    return {path: endpoints}, {ev.TRAINER_ENDPOINTS_FILE: path}


def interface_of(ip: str, interfaces: Sequence[Interface]) -> Optional[str]:
    """The interface that holds or reaches ``ip`` directly, or None."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    for iface in interfaces:
        if iface.address == ip:
            return iface.name
    for iface in interfaces:
        try:
            net = ipaddress.ip_network(f"{iface.address}/{iface.netmask}", strict=False)
        except (ValueError, TypeError):
            continue
        if addr in net and net.prefixlen < net.max_prefixlen:
            return iface.name
    return None


# ---------------------------------------------------------------- helpers


def _command(opts: LaunchOptions, python: str) -> tuple:
    args = tuple(opts.training_script_args)
    if opts.no_python:
        return (opts.training_script, *args)
    if opts.module:
        return (python, "-u", "-m", opts.training_script, *args)
    return (python, "-u", opts.training_script, *args)


def _need_var(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise LaunchError(f"--use_paddlecloud needs the variable {name}, which is not set; set it or drop --use_paddlecloud.")
    return value


def _int_var(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    if default is not None and not env.get(name, "").strip():
        return default
    value = _need_var(env, name)
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"--use_paddlecloud: {name}={value} is not a whole number; fix the variable.") from None


def _first_duplicate(items: Sequence[str]):
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None
