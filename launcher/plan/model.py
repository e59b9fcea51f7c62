"""What flows between the layers: the options, the host facts, the plan and its worker specs. Pure data.

The launcher's vocabulary, shared by the plan, the host probes, the nodes and the run: frozen dataclasses
and the limits the options are checked against. No I/O here but the current folder a HostFacts defaults to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from launcher import addresses, envvars as ev
from launcher.plan.agent_store import StoreSpec
from launcher.plan.health import INTERVAL, USER_TIMEOUT, HealthSettings
from launcher.plan.parsing import node_endpoints
from launcher.plan.roles import WORKER, Role, role_named
from launcher.plan.streams import NONE, StreamChoice, StreamRoute
from launcher.plan.torchrun_values import DEFAULT_STOP_SIGNALS

NUMA_MODES = ("node", "socket", "exclusive", "core-complex")  # torch/numa/binding.py's AffinityMode
STRAGGLER_POLICIES = ("off", "warn", "leave")  # --straggler_policy (launcher.plan.stragglers)
MAX_WORKERS_PER_NODE = 65535  # each worker needs a port of its own
MAX_SHUTDOWN_TIMEOUT = 24 * 3600.0  # seconds; anything longer is a mistake, not a grace period


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
    cluster_env: str = "auto"  # where the nodes come from: a name of clusters.registry.SOURCES, or auto
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
    report_log: bool = False  # --report_log: the workers' reports kept in LOG_DIR/reports.nodeN.jsonl
    straggler_policy: str = "warn"  # --straggler_policy: off, warn or leave (launcher.plan.stragglers)
    warm_start: bool = False  # --warm_start: an elastic job's workers started before the node joins (launcher.run.warm)
    monitor_port: Optional[int] = None  # --monitor_port: serve /metrics, /healthz, /status.json and the live page
    monitor_host: Optional[str] = None  # where it listens (default: this node's address)
    role: str = ev.DEFAULT_ROLE  # torchrun's --role: the workers' ROLE_NAME
    agent_store: str = "auto"  # who hosts the rendezvous store: node 0's launcher (on), rank 0 (off), auto (launcher.plan.agent_store)
    # a node's health checks (launcher.plan.health): the user's own, its timeout, those turned off, the interval
    health_check: Optional[str] = None
    health_check_timeout: float = USER_TIMEOUT
    skip_health_checks: tuple = ()  # names of launcher.plan.health.CHECKS
    health_interval: float = INTERVAL
    # torchrun's nodes (launcher.cli.torchrun): a fixed count, this node's rank, node 0's address
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None  # also Paddle's --rank with --cluster_node_ips; None: not given
    master_addr: Optional[str] = None
    node_workers: tuple = ()  # an elastic round's: each node's number of workers, by node rank; (): this node's on each
    stream_choice: Optional[StreamChoice] = None  # torchrun's --redirects, --tee, --local-ranks-filter
    # torchrun 2.13's options (launcher.cli wires them; their text is read by launcher.plan.torchrun_values)
    virtual_local_rank: bool = False  # every worker LOCAL_RANK=0, a GPU worker seeing only its own GPU
    duplicate_stdout_filters: tuple = ()  # teed stdout lines holding any of these: also in filtered_stdout.log
    duplicate_stderr_filters: tuple = ()  # the same for stderr, in filtered_stderr.log
    signals_to_handle: Optional[tuple] = None  # signal numbers that stop the job (passed on first); None: the default
    event_log_handler: str = "null"  # torchrun's event handler: "console" also shows each event on stderr
    # where the workers run (launcher.plan.placement): torchrun's --numa-binding mode, DeepSpeed's core binding
    numa_binding: Optional[str] = None  # node, socket, exclusive, core-complex: the CPUs near each worker's GPU
    bind_cores_to_rank: bool = False  # each worker its own cores, OMP_NUM_THREADS and MKL_NUM_THREADS to match
    bind_core_list: Optional[str] = None  # the CPUs to share out ("0-15,32-47"); implies bind_cores_to_rank
    # parameter-server mode: any of these chooses it
    server_num: Optional[int] = None
    worker_num: Optional[int] = None
    servers: Optional[str] = None  # ip:port,... of every server of the job
    workers: Optional[str] = None  # ip:port,... of every trainer of the job
    gloo_port: Optional[int] = None  # parameter-server mode: fleet's gloo rendezvous on server 0's host
    with_gloo: str = "1"  # PADDLE_WITH_GLOO: 0 none, 1 among trainers, 2 among all

    @property
    def places_workers(self) -> bool:
        """Whether a placement option is given (launcher.plan.binding; the machine's topology must then be read)."""
        return bool(self.numa_binding or self.bind_cores_to_rank or self.bind_core_list)

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
    env_files: tuple = ()  # (path, text) of the files a scheduler's variables name (clusters.registry.FILE_VARIABLES)
    gathered_nodes: tuple = ()  # an MPI job's nodes in rank order, gathered from every rank (launcher.nodes.static.gather)
    importable: frozenset = frozenset()  # of torch and paddle, those the launcher's own interpreter finds (not imported)
    torch_version: Optional[str] = None  # of that torch, from its package metadata ("2.13.0+cpu"), None if not found
    topology: Optional[object] = None  # launcher.plan.topology.Topology, read only when a placement option asks


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    local_rank: int
    endpoint: str
    gpu: Optional[str]  # the value of FLAGS_selected_gpus (--virtual-local-rank: the worker's is 0); None for a CPU worker
    cmd: tuple
    env: Mapping[str, str]  # what the launcher sets, on top of Plan.base_env
    log_file: Optional[str]
    role: str = WORKER.name  # a name of roles.ROLES: parameter-server mode's "server" or "trainer" (``rank`` is then only a key)
    role_index: int = 0  # the server's or trainer's id
    route: Optional[StreamRoute] = None  # torchrun's choice of streams; None: the launcher's layout
    duplicated: int = NONE  # the streams (streams.OUT, ERR) whose lines the plan's ``duplicates`` filter into copies
    cpus: Optional[frozenset] = None  # the CPUs it is bound to (launcher.plan.placement); None: the launcher's own

    @property
    def cpu_list(self) -> Optional[str]:
        """Its CPUs as the plan and the state file show them ("0-3,8"); None when it is not bound."""
        if self.cpus is None:
            return None
        from launcher.plan.topology import format_cpu_list  # only for a job that places its workers

        return format_cpu_list(self.cpus)

    @property
    def kind(self) -> Role:
        """Its row of the roles table."""
        return role_named(self.role)

    @property
    def label(self) -> str:
        """How messages name this process: "rank 3", "server 0", "trainer 1"."""
        return self.kind.label_of(self.rank if self.kind.by_rank else self.role_index)


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
    ports: tuple  # this node's worker ports
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
    report_log: bool = False  # the workers' reports kept in LOG_DIR/reports.nodeN.jsonl (launcher.output.report_log)
    straggler_policy: str = "warn"  # off: no straggler looked for; leave: an elastic node named one leaves the job
    monitor: Optional[tuple] = None  # (host, port) the monitor listens on (port 0: a free one)
    servers: tuple = ()  # parameter-server mode: every server's and every trainer's endpoint
    trainers: tuple = ()
    cluster: str = ""  # where the nodes came from: "slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)"
    error_file: Optional[str] = None  # the launcher's own TORCHELASTIC_ERROR_FILE: the job's root cause goes there
    agent_store: Optional[StoreSpec] = None  # node 0's launcher serves the rendezvous store (TORCHELASTIC_USE_AGENT_STORE)
    node_ports: tuple = ()  # every node's worker ports, by node rank (launcher.plan.node_ports); (): every node's are ``ports``
    elastic_round: Optional[str] = None  # an elastic job: its round, in a line, as each worker's log header shows it
    stop_signals: tuple = tuple(int(s) for s in DEFAULT_STOP_SIGNALS)  # --signals-to-handle: those that stop the job
    duplicates: tuple = ()  # streams.Duplicate: torchrun's --duplicate-stdout/stderr-filters, one per filtered stream
    events_to_console: bool = False  # --event-log-handler console: each event also a line on stderr
    health: HealthSettings = HealthSettings()  # the node's health checks (launcher.plan.health)

    @property
    def node_ip(self) -> str:
        return self.node_ips[self.node_rank]

    @property
    def places_workers(self) -> bool:
        """Whether a placement option is given (launcher.plan.binding; the machine's topology must then be read)."""
        return bool(self.numa_binding or self.bind_cores_to_rank or self.bind_core_list)

    @property
    def parameter_server(self) -> bool:
        return bool(self.servers)

    @property
    def store_port(self) -> Optional[int]:
        """The port this node holds for the job's rendezvous store (rank 0's, or server 0's), if it hosts it."""
        if self.node_rank != 0:
            return None
        return addresses.split(self.servers[0])[1] if self.servers else self.ports[0]

    @property
    def job_ports(self) -> tuple:
        """The ports of the whole job, the same on every node (part of its identity): node 0's, which every
        other node's follow from."""
        if self.servers:
            return tuple(addresses.split(e)[1] for e in self.servers + self.trainers)
        return self.node_ports[0] if self.node_ports else self.ports

    @property
    def endpoints(self) -> list:
        """Every worker's endpoint, in rank order."""
        return node_endpoints(self.node_ips, self.node_ports or (self.ports,) * len(self.node_ips))



def _current_dir() -> str:
    """The launcher's folder, read once when the host facts are gathered (not by the plan)."""
    try:
        return os.getcwd()
    except OSError:  # removed from under us: a relative path stays relative
        return ""
