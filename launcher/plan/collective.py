"""The launch plan: options, environment values and host facts in, frozen worker specs out.

Everything here is pure: no I/O, no ``os.environ``. Bad input raises LaunchError.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan import streams

DEFAULT_CPU_WORKERS = 2
MULTI_NODE_PORT = 6070  # Paddle 1.8's default when several nodes are given
PADDLECLOUD_PORT = 6170  # Paddle 1.8's default under --use_paddlecloud
MAX_WORKERS_PER_NODE = 65535  # each worker needs a port of its own
MAX_SHUTDOWN_TIMEOUT = 24 * 3600.0  # seconds; anything longer is a mistake, not a grace period
# Linux refuses a single "NAME=value" string longer than MAX_ARG_STRLEN (32 pages).
MAX_ENV_STRING = 128 * 1024
FR_BUFFER_ENTRIES = "2000"  # collectives torch's flight recorder keeps when the launcher switches it on

_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only (fullmatch): "²".isdigit() is true, but int("²") fails
_INTEGER = re.compile(r"-?[0-9]+")
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
    nproc_per_node: Optional[int] = None  # or torchrun's "auto", "gpu", "cpu" (resolved by the plan)
    log_dir: Optional[str] = None
    use_paddlecloud: bool = False
    cluster_env: str = "auto"  # where the nodes come from: a name of clusters.SOURCES, or auto
    module: bool = False
    no_python: bool = False
    shutdown_timeout: float = 10.0
    extra_env: tuple = ()  # (name, value) pairs from the config file's `env`
    max_restarts: int = 0
    control_port: Optional[int] = None
    heartbeat_timeout: float = 3.0
    join_timeout: float = 300.0
    job_id: Optional[str] = None
    hang_timeout: Optional[float] = None
    dump_stacks: bool = False
    role: str = ev.DEFAULT_ROLE  # torchrun's --role: the workers' ROLE_NAME
    # torchrun's nodes (launcher.cli.torchrun): a fixed count, this node's rank, node 0's address
    nnodes: Optional[int] = None
    node_rank: int = 0
    master_addr: Optional[str] = None
    stream_choice: Optional[streams.StreamChoice] = None  # torchrun's --redirects, --tee, --local-ranks-filter
    # parameter-server mode: any of these chooses it
    server_num: Optional[int] = None
    worker_num: Optional[int] = None
    servers: Optional[str] = None  # ip:port,... of every server of the job
    workers: Optional[str] = None  # ip:port,... of every trainer of the job
    gloo_port: Optional[int] = None  # parameter-server mode: fleet's gloo rendezvous on server 0's host
    with_gloo: str = "1"  # PADDLE_WITH_GLOO: 0 none, 1 among trainers, 2 among all

    @property
    def parameter_server(self) -> bool:
        return any(v is not None for v in (self.server_num, self.worker_num, self.servers, self.workers))


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
    cwd: str = field(default_factory=lambda: _current_dir())  # where a relative --log_dir starts
    hostname: str = ""  # this machine's name, as schedulers list it
    env_files: tuple = ()  # (path, text) of the files a scheduler's variables name (clusters.FILE_VARIABLES)
    gathered_nodes: tuple = ()  # an MPI job's nodes in rank order, gathered from every rank (launcher.nodes.gather)


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    local_rank: int
    endpoint: str
    gpu: Optional[str]  # the value of FLAGS_selected_gpus; None for a CPU worker
    cmd: tuple
    env: Mapping[str, str]  # what the launcher sets, on top of Plan.base_env
    log_file: Optional[str]
    role: str = ""  # parameter-server mode: "server" or "trainer" (``rank`` is then only a key)
    role_index: int = 0  # the server's or trainer's id
    route: Optional[streams.StreamRoute] = None  # torchrun's choice of streams; None: the launcher's layout

    @property
    def label(self) -> str:
        """How messages name this process: "rank 3", "server 0", "trainer 1"."""
        return f"{self.role} {self.role_index}" if self.role else f"rank {self.rank}"


@dataclass(frozen=True)
class ControlSpec:
    """The control channel of a job of several nodes: node 0 listens on ``port``."""

    port: int
    heartbeat_timeout: float
    join_timeout: float
    job_id: str
    token: Optional[str]  # LAUNCHER_JOB_TOKEN: peers prove they know it


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
    gpus_not_found: bool = False  # no GPU detected: the --selected_gpus ids are passed on as given
    max_restarts: int = 0
    control: Optional[ControlSpec] = None  # None: one node, no channel
    hang_timeout: Optional[float] = None
    dump_stacks: bool = False
    servers: tuple = ()  # parameter-server mode: every server's and every trainer's endpoint
    trainers: tuple = ()
    cluster: str = ""  # where the nodes came from: "slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)"
    error_file: Optional[str] = None  # the launcher's own TORCHELASTIC_ERROR_FILE: the job's root cause goes there

    @property
    def node_ip(self) -> str:
        return self.node_ips[self.node_rank]

    @property
    def parameter_server(self) -> bool:
        return bool(self.servers)

    @property
    def store_port(self) -> Optional[int]:
        """The port this node holds for the job's rendezvous store (rank 0's, or server 0's), if it hosts it."""
        if self.node_rank != 0:
            return None
        return int(self.servers[0].rpartition(":")[2]) if self.servers else self.ports[0]

    @property
    def job_ports(self) -> tuple:
        """The ports of the whole job, the same on every node (part of its identity)."""
        if self.servers:
            return tuple(int(e.rpartition(":")[2]) for e in self.servers + self.trainers)
        return self.ports

    @property
    def endpoints(self) -> tuple:
        return endpoint_list(self.node_ips, self.ports)


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
    if opts.parameter_server:
        if opts.stream_choice:
            raise LaunchError("--redirects, --tee and --local-ranks-filter are torchrun's, for collective jobs; "
                              "in parameter-server mode --log_dir writes serverlog.N and workerlog.N.")
        from launcher.plan import ps as ps_plan

        return ps_plan.make_ps_plan(opts, env, host, find_free_ports)
    opts = _with_nproc_word(opts, host)
    _check_nproc(opts.nproc_per_node)
    _check_shutdown_timeout(opts.shutdown_timeout)
    if opts.module and opts.no_python:
        raise LaunchError("--module and --no_python exclude each other; give only one of them.")
    if opts.max_restarts < 0:
        raise LaunchError(f"--max_restarts {opts.max_restarts} is below 0; give 0 (no restart) or more.")
    from launcher.plan import clusters

    source, chosen_by = clusters.choose(opts, env)
    opts = _with_defaults(opts, clusters.device_defaults(source, env))
    base_env = {**env, **dict(opts.extra_env)}
    gpus, gpu_notes = _select_gpus(opts, base_env, host.gpu_count)
    nper = len(gpus) if gpus is not None else (opts.nproc_per_node or DEFAULT_CPU_WORKERS)
    cluster = clusters.resolve(clusters.Request(source, env, opts, host, nper, chosen_by))
    if source == "cli" and chosen_by == "--cluster_env auto":
        cluster = dataclasses.replace(cluster, notes=cluster.notes + clusters.sbatch_note(env))
    ports = cluster.ports
    if ports is None:
        ports = tuple(find_free_ports(cluster.node_ips[cluster.node_rank], nper))
        if len(ports) != nper:
            raise LaunchError(f"could not find {nper} free ports on {cluster.node_ips[cluster.node_rank]}; give --started_port.")
    notes = tuple(gpu_notes) + cluster.notes
    if gpus is None:
        base_env.pop(ev.SELECTED_GPUS, None)
    return _assemble(opts, host, base_env, cluster, ports, gpus, notes)


def _with_defaults(opts: LaunchOptions, defaults: Mapping[str, object]) -> LaunchOptions:
    """A scheduler's values (its GPUs, its processes per node) for the options the user left unset."""
    unset = {k: v for k, v in defaults.items() if getattr(opts, k) is None}
    return dataclasses.replace(opts, **unset) if unset else opts


def _with_nproc_word(opts: LaunchOptions, host: HostFacts) -> LaunchOptions:
    """torchrun's --nproc-per-node auto (every GPU, else a worker per CPU core), gpu (every GPU), cpu (a worker per core)."""
    word = opts.nproc_per_node
    if word not in ("auto", "gpu", "cpu"):
        return opts
    if word == "gpu" and not host.gpu_count:
        raise LaunchError("--nproc_per_node gpu, but this machine has no GPU that can be found; give a number of CPU workers.")
    n = None if word != "cpu" and host.gpu_count else host.cpu_count
    return dataclasses.replace(opts, nproc_per_node=n)


def _check_nproc(n) -> None:
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int):
        raise LaunchError(f"--nproc_per_node {n!r} is not a whole number; give a count of workers such as 2.")
    if n < 1:
        raise LaunchError(f"--nproc_per_node {n} is below 1; give at least 1 worker per node.")
    if n > MAX_WORKERS_PER_NODE:
        raise LaunchError(f"--nproc_per_node {n} is more workers than a node has ports; give at most {MAX_WORKERS_PER_NODE}.")


def _check_shutdown_timeout(seconds) -> None:
    """A grace period the stop sequence can wait for: a finite number of seconds, up to one day."""
    ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds)
    if not ok or not 0 <= seconds <= MAX_SHUTDOWN_TIMEOUT:
        raise LaunchError(f"--shutdown_timeout {seconds} is not a grace period the launcher can wait for; "
                          f"give a number of seconds from 0 to {MAX_SHUTDOWN_TIMEOUT:.0f} (one day).")


def _assemble(opts, host, base_env, cluster, ports, gpus, notes) -> Plan:
    nper = len(ports)
    world = nper * len(cluster.node_ips)
    endpoints = endpoint_list(cluster.node_ips, ports)
    files, endpoint_vars = _endpoint_vars(",".join(endpoints), host)
    if ev.TRAINER_ENDPOINTS not in endpoint_vars:  # in a file: the launcher's own value would be stale
        base_env.pop(ev.TRAINER_ENDPOINTS, None)
    node_ip = cluster.node_ips[cluster.node_rank]
    cmd = _command(opts, python_of(base_env, host))
    control = control_spec(opts, base_env, cluster.node_ips, ports, cmd, cluster.job_id)
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
        **paddle_collective_vars(endpoints[0], world, nper, len(cluster.node_ips), gpus, opts.log_dir, host, base_env),
        **torchrun_vars(opts, base_env, world, control.job_id if control else opts.job_id or host.run_id),
    }
    if ev.OMP_NUM_THREADS not in base_env:
        shared[ev.OMP_NUM_THREADS] = str(max(1, host.cpu_count // nper))
    iface = interface_of(node_ip, host.interfaces)
    if iface and ev.GLOO_SOCKET_IFNAME not in base_env:
        shared[ev.GLOO_SOCKET_IFNAME] = iface
    if opts.log_dir:  # a GPU hang leaves its trace next to the logs
        shared.update(flight_recorder_vars(opts, base_env, host.cwd))
    if opts.stream_choice and opts.stream_choice.needs_files and not opts.log_dir:
        raise LaunchError("--redirects and --tee write log files; give --log-dir too.")
    workers = []
    for local in range(nper):
        rank = cluster.node_rank * nper + local
        own = {
            ev.TRAINER_ID: str(rank),
            ev.RANK: str(rank),
            ev.LOCAL_RANK: str(local),
            ev.CURRENT_ENDPOINT: endpoints[rank],
            ev.ROLE_RANK: str(rank),
            ev.ERROR_FILE: error_file_of(host, rank),
        }
        own.update(paddle_worker_vars(rank, local))
        gpu = gpus[local] if gpus is not None else None
        if gpu is not None:
            own.update({ev.SELECTED_GPUS: gpu, ev.SELECTED_ACCELERATORS: gpu, ev.LOCAL_DEVICE_IDS: gpu})
        route = streams.route(opts.stream_choice, local, bool(opts.log_dir)) if opts.stream_choice else None
        log_file = os.path.join(opts.log_dir, f"workerlog.{rank}") if opts.log_dir and (route is None or route.to_file) else None
        workers.append(WorkerSpec(rank, local, endpoints[rank], gpu, cmd, {**shared, **own}, log_file, route=route))
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
        gpus_not_found=gpus is not None and not host.gpu_count,
        max_restarts=opts.max_restarts,
        control=control,
        hang_timeout=opts.hang_timeout,
        dump_stacks=opts.dump_stacks,
        cluster=cluster.description,
        error_file=base_env.get(ev.ERROR_FILE) or None,
    )


def flight_recorder_vars(opts: LaunchOptions, env: Mapping[str, str], cwd: str) -> dict:
    """Where torch's NCCL flight recorder writes its dumps (next to the logs) and, when a stop takes stacks
    (--hang_timeout, --dump_stacks), the recorder switched on with the pipe the launcher pokes for a dump.
    A variable the user set is kept."""
    stem = os.path.normpath(os.path.join(cwd, opts.log_dir, "nccl_trace_rank_"))
    wanted = {ev.FR_DUMP_TEMP_FILE: stem, ev.FR_DUMP_TEMP_FILE_OLD: env.get(ev.FR_DUMP_TEMP_FILE, stem)}
    if opts.hang_timeout is not None or opts.dump_stacks:
        wanted[ev.FR_PIPE_FILE] = stem
        if ev.FR_BUFFER_SIZE not in env and ev.FR_BUFFER_SIZE_OLD not in env:
            wanted[ev.FR_BUFFER_SIZE] = wanted[ev.FR_BUFFER_SIZE_OLD] = FR_BUFFER_ENTRIES
    return {name: value for name, value in wanted.items() if name not in env}


def paddle_collective_vars(master: str, world: int, nper: int, nnodes: int, gpus, log_dir, host: HostFacts,
                           env: Mapping[str, str]) -> dict:
    """What Paddle 2.6/3.x's launcher gives every collective worker of a node, beyond Paddle 1.8's variables."""
    out = {ev.PADDLE_MASTER: master, ev.GLOBAL_SIZE: str(world), ev.LOCAL_SIZE: str(nper), ev.NNODES: str(nnodes)}
    if gpus is None and ev.DISTRI_BACKEND not in env:
        out[ev.DISTRI_BACKEND] = "gloo"  # as Paddle's launcher: with "auto", a CPU build of Paddle creates no group
    if gpus is not None:  # every node runs the same GPUs
        out[ev.WORLD_DEVICE_IDS] = ",".join([":".join(gpus)] * nnodes)
    if log_dir:
        out[ev.LOG_DIR] = os.path.normpath(os.path.join(host.cwd, log_dir))
    return out


def paddle_worker_vars(rank: int, local: int) -> dict:
    return {ev.GLOBAL_RANK: str(rank), ev.PADDLE_LOCAL_RANK: str(local), ev.RANK_IN_NODE: str(local)}


def torchrun_vars(opts: LaunchOptions, env: Mapping[str, str], world: int, run_id: str) -> dict:
    """What torchrun's agent gives every worker besides RANK and the like: one role, all ranks in it.
    The store is rank 0's (TORCHELASTIC_USE_AGENT_STORE=False), as under torchrun's own env:// rule."""
    return {
        ev.ROLE_NAME: opts.role,
        ev.ROLE_WORLD_SIZE: str(world),
        ev.ELASTIC_RUN_ID: run_id,
        ev.ELASTIC_MAX_RESTARTS: str(opts.max_restarts),
        ev.ELASTIC_USE_AGENT_STORE: "False",
        ev.NCCL_ASYNC_ERROR_HANDLING: env.get(ev.NCCL_ASYNC_ERROR_HANDLING, "1"),
    }


def error_file_of(host: HostFacts, rank: int) -> str:
    """Where a worker's @record writes its exception: a file of its own, in the launch's temporary folder."""
    return os.path.join(host.temp_dir, f"launcher-{host.run_id}", f"error.{rank}.json")


def control_spec(opts: LaunchOptions, env: Mapping[str, str], node_ips: tuple, ports: tuple, cmd: tuple,
                 scheduler_job: Optional[str] = None):
    """The control channel of a job of several nodes (None for one); ``ports``: node 0's, the first one's neighbour is
    the default. The job id: --job_id, LAUNCHER_JOB_ID, the scheduler's job, or a digest of the job."""
    if len(node_ips) == 1:
        return None
    port = opts.control_port if opts.control_port is not None else ports[0] - 1
    if not 1 <= port <= 65535:
        raise LaunchError(f"--control_port {port} is outside 1-65535; give a free port of node 0 with --control_port.")
    if port in ports:
        raise LaunchError(f"--control_port {port} is also the port of a process on node 0; choose another one.")
    for name, value in (("--heartbeat_timeout", opts.heartbeat_timeout), ("--join_timeout", opts.join_timeout)):
        if not 0.5 <= value <= MAX_SHUTDOWN_TIMEOUT:
            raise LaunchError(f"{name} {value} is not a number of seconds from 0.5 to {MAX_SHUTDOWN_TIMEOUT:.0f}; give a sensible timeout.")
    job_id = opts.job_id or env.get(ev.JOB_ID) or scheduler_job or default_job_id(node_ips, ports, cmd)
    return ControlSpec(port, opts.heartbeat_timeout, opts.join_timeout, job_id, env.get(ev.JOB_TOKEN) or None)


def default_job_id(node_ips, ports, cmd) -> str:
    """The same on every node of one job: a digest of the nodes, the ports and the command."""
    import hashlib
    import json

    text = json.dumps([list(node_ips), list(ports), list(cmd[1:])])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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
        missing = [g for g in ids if _gpu_key(g) not in map(_gpu_key, visible)]
        if missing:
            raise LaunchError(f"GPU {missing[0]} of --selected_gpus={opts.selected_gpus} is not in CUDA_VISIBLE_DEVICES={','.join(visible)}; choose among those.")
    elif gpu_count is not None:
        missing = [g for g in ids if int(g) >= gpu_count]
        if missing:
            raise LaunchError(f"GPU {missing[0]} of --selected_gpus={opts.selected_gpus} does not exist: this machine has {gpu_count} GPU(s), ids 0 to {gpu_count - 1}.")
    notes = ()
    if not gpu_count:
        notes = (f"no GPU detected on this machine: passing --selected_gpus={opts.selected_gpus} on to the workers "
                 f"as given (FLAGS_selected_gpus); they run on a GPU only if CUDA finds one in the worker.",)
    return tuple(_gpu_flag(g, visible) for g in ids), notes


def _visible_devices(env: Mapping[str, str]):
    value = env.get(ev.CUDA_VISIBLE_DEVICES)
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_gpu_ids(text: str, visible) -> list:
    ids = [g.strip() for g in text.split(",")]
    named = {_gpu_key(v) for v in visible or ()}
    for g in ids:
        if not (_DIGITS.fullmatch(g) or _gpu_key(g) in named):
            raise LaunchError(f"--selected_gpus={text} has a malformed GPU id {g!r}; give comma-separated ids such as 0,1,2,3.")
    keys = [_gpu_key(g) for g in ids]
    dup = _first_duplicate(keys)
    if dup is not None:
        same = [g for g, k in zip(ids, keys) if k == dup]
        spelled = f" ({' and '.join(same)})" if len(set(same)) > 1 else ""
        raise LaunchError(f"--selected_gpus={text} names GPU {dup} twice{spelled}; give each GPU once.")
    return ids


def _gpu_key(gpu: str) -> str:
    """A GPU id as a device is known: a number without leading zeros (00 is GPU 0), or a name such as a UUID."""
    return str(int(gpu)) if _DIGITS.fullmatch(gpu) else gpu


def _gpu_flag(gpu: str, visible) -> str:
    """A GPU id as the worker sees it: its index in CUDA_VISIBLE_DEVICES when that is set."""
    if visible is None:
        return _gpu_key(gpu)
    return str([_gpu_key(v) for v in visible].index(_gpu_key(gpu)))


# ---------------------------------------------------------------- nodes and ports


def _endpoint(text: str, name: str):
    """``host:port`` (``[v6]:port``) as (host, port), the port within 1-65535."""
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not _DIGITS.fullmatch(port):
        raise LaunchError(f"{name} has a malformed endpoint {text!r}; give comma-separated host:port pairs such as 10.0.0.1:6170.")
    if not 1 <= int(port) <= 65535:
        raise LaunchError(f"{name} has the endpoint {text!r}, whose port {port} is outside 1-65535; give a port in that range.")
    return host, int(port)


def _port_range(first: int, count: int, given_as: str) -> tuple:
    """Ports ``first`` to ``first + count - 1``; ``given_as`` names the start port as the user gave it."""
    if not 1 <= first or first + count - 1 > 65535:
        raise LaunchError(f"{given_as} with {count} workers needs ports {first} to {first + count - 1}, outside 1-65535; choose a start port between 1024 and {65535 - count + 1}.")
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
    """PADDLE_TRAINER_ENDPOINTS, or files holding them when the variable would be too long: one that
    PADDLE_TRAINER_ENDPOINTS_FILE names (this project's runtime), and Paddle's own, a JSON object of
    variables that PADDLE_BACKUP_ENV_PATH names (read by Paddle's role maker and ParallelEnv)."""
    if len(ev.TRAINER_ENDPOINTS) + len(endpoints) + 2 <= MAX_ENV_STRING:
        return {}, {ev.TRAINER_ENDPOINTS: endpoints}
    import json

    folder = os.path.join(host.temp_dir, f"launcher-{host.run_id}")
    path, backup = os.path.join(folder, "trainer_endpoints"), os.path.join(folder, "backup_env.json")
    files = {path: endpoints, backup: json.dumps({ev.TRAINER_ENDPOINTS: endpoints})}
    return files, {ev.TRAINER_ENDPOINTS_FILE: path, ev.BACKUP_ENV_PATH: backup}


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


def python_of(env: Mapping[str, str], host: HostFacts) -> str:
    """The interpreter of Python workers: torchrun's PYTHON_EXEC when set, else the launcher's own."""
    return env.get(ev.PYTHON_EXEC) or host.python


def _command(opts: LaunchOptions, python: str) -> tuple:
    args = tuple(opts.training_script_args)
    if opts.no_python:
        return (opts.training_script, *args)
    if opts.module:
        return (python, "-u", "-m", opts.training_script, *args)
    return (python, "-u", opts.training_script, *args)


def _current_dir() -> str:
    """The launcher's folder, read once when the host facts are gathered (not by the plan)."""
    try:
        return os.getcwd()
    except OSError:  # removed from under us: a relative path stays relative
        return ""


def _first_duplicate(items: Sequence[str]):
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None
