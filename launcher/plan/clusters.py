"""Where the nodes of a job come from: the command line, or a scheduler's environment. Pure.

``SOURCES`` maps each name of ``--cluster_env`` to a ``Source``, in the order ``auto`` tries them:
``detect(env, opts)`` says whether this environment comes from that scheduler, ``resolve(request)``
gives the ``Cluster`` (nodes in rank order, this node's index, its ports, the variables read),
``devices(env)`` the option defaults the scheduler sets (its GPUs, its processes per node). No
I/O here: a file a scheduler names (LSF's rank file) is read by preflight into
``HostFacts.env_files``, this machine's name comes in ``HostFacts.hostname``, and the node list of
an MPI job, gathered over the network (``gather``, what ``gathering`` asks for), in
``HostFacts.gathered_nodes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional

from launcher.plan import hostlist
from launcher.plan import collective as pl
from launcher.errors import LaunchError

AUTO = "auto"
DEFAULT_NODES = "127.0.0.1"  # --cluster_node_ips when not given
JOB_PORT_BASE = 20000  # SLURM and LSF: start port 20000 + job id % 20000, the same on every node
JOB_PORT_SPAN = 20000
FILE_VARIABLES = ("LSB_DJOB_RANKFILE",)  # variables naming a file a source reads (by preflight)


@dataclass(frozen=True)
class Cluster:
    source: str  # the name in SOURCES
    node_ips: tuple  # every node, in node-rank order
    node_rank: int  # this node's index
    ports: Optional[tuple]  # this node's worker ports; None: free ports are to be found
    variables: tuple = ()  # what it was read from, for the plan table
    notes: tuple = ()  # warnings for the user
    job_id: Optional[str] = None  # the scheduler's name of the job, the same on every node
    detail: str = ""  # how else the nodes were found, for the plan table

    @property
    def description(self) -> str:
        """``slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)``."""
        detail = f"; {self.detail}" if self.detail else ""
        return f"{self.source} ({', '.join(self.variables)}{detail})" if self.variables else self.source


@dataclass(frozen=True)
class Request:
    """What a source resolves from: the environment, the options, the host, the workers per node."""

    source: str
    env: Mapping[str, str]
    opts: pl.LaunchOptions
    host: pl.HostFacts
    nper: int
    chosen_by: str  # how messages name the choice: "--cluster_env slurm", "--use_paddlecloud", ...


def _no_devices(env: Mapping[str, str]) -> Mapping[str, object]:
    return {}


@dataclass(frozen=True)
class Source:
    label: str  # how messages name the scheduler
    detect: Callable[[Mapping[str, str], pl.LaunchOptions], bool]
    resolve: Callable[[Request], Cluster]
    fix: str  # what to do when one of its variables is missing
    devices: Callable[[Mapping[str, str]], Mapping[str, object]] = field(default=_no_devices)


# ---------------------------------------------------------------- choosing and resolving


def choose(opts: pl.LaunchOptions, env: Mapping[str, str]):
    """(source name, how it was chosen): --use_paddlecloud, --cluster_env NAME, or the first found."""
    wanted = opts.cluster_env or AUTO
    if wanted != AUTO and wanted not in SOURCES:
        raise LaunchError(f"--cluster_env {wanted} is not a cluster source; choose one of {', '.join(names())}.")
    if opts.use_paddlecloud:
        if wanted not in (AUTO, "paddlecloud"):
            raise LaunchError(f"--use_paddlecloud and --cluster_env {wanted} name two different cluster sources; give only one of them.")
        return "paddlecloud", "--use_paddlecloud"
    if wanted != AUTO:
        return wanted, f"--cluster_env {wanted}"
    for name, source in SOURCES.items():
        if source.detect(env, opts):
            return name, f"--cluster_env auto (found {source.label})"
    return "cli", "--cluster_env auto"


def names() -> tuple:
    return (AUTO, *SOURCES)


def device_defaults(name: str, env: Mapping[str, str]) -> Mapping[str, object]:
    """Option values the scheduler gives (selected_gpus, nproc_per_node), for options not given."""
    return SOURCES[name].devices(env)


def resolve(request: Request) -> Cluster:
    cluster = SOURCES[request.source].resolve(request)
    return _with_override_notes(request, cluster)


def _with_override_notes(req: Request, cluster: Cluster) -> Cluster:
    """A scheduler's nodes replace --cluster_node_ips and --node_ip: say so where they differ."""
    if cluster.source in ("cli", "paddlecloud", "torchrun"):
        return cluster
    notes = list(cluster.notes)
    label = SOURCES[cluster.source].label
    nodes = ",".join(cluster.node_ips)
    if req.opts.cluster_node_ips not in (DEFAULT_NODES, nodes):
        notes.append(f"{label}: using the nodes {_short_list(cluster.node_ips)} instead of --cluster_node_ips {req.opts.cluster_node_ips}.")
    if req.opts.node_ip not in (DEFAULT_NODES, cluster.node_ips[cluster.node_rank]):
        notes.append(f"{label}: this is node {cluster.node_rank} ({cluster.node_ips[cluster.node_rank]}), not --node_ip {req.opts.node_ip}.")
    return replace(cluster, notes=tuple(notes))


def _short_list(nodes: tuple) -> str:
    return ",".join(nodes[:4]) + (f",... ({len(nodes)} nodes)" if len(nodes) > 4 else "")


def sbatch_note(env: Mapping[str, str]) -> tuple:
    """A SLURM job of several nodes whose batch shell runs the launcher itself, not under srun."""
    nodes = env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "")).strip()
    if env.get("SLURM_JOB_ID") and not env.get("SLURM_STEP_ID") and nodes.isdigit() and int(nodes) > 1:
        return (f"SLURM job {env['SLURM_JOB_ID']} has {nodes} nodes, but the launcher runs in its batch shell, "
                f"not in an srun step: only this node is used; start it with srun --ntasks-per-node=1 to use every node.",)
    return ()


# ---------------------------------------------------------------- shared helpers


def _fail(req: Request, sentence: str) -> LaunchError:
    return LaunchError(f"{req.chosen_by}: {sentence}")


def _var(req: Request, name: str) -> str:
    value = req.env.get(name, "").strip()
    if not value:
        raise LaunchError(f"{req.chosen_by} needs the variable {name}, which is not set; {SOURCES[req.source].fix}.")
    return value


def _first_var(req: Request, *names: str) -> str:
    """The first of ``names`` that is set (the name); the first one is named when none is."""
    for name in names:
        if req.env.get(name, "").strip():
            return name
    _var(req, names[0])  # raises, naming the first
    return names[0]


def _int(req: Request, name: str, default: Optional[int] = None, optional: bool = False):
    """The whole number in ``name``; ``default`` (or None when ``optional``) when it is unset or empty."""
    if (default is not None or optional) and not req.env.get(name, "").strip():
        return default
    value = _var(req, name)
    if not pl._INTEGER.fullmatch(value):
        raise _fail(req, f"{name}={value} is not a whole number; fix the variable.")
    return int(value)


def _index(req: Request, name: str, count: int, of: str) -> int:
    rank = _int(req, name)
    if not 0 <= rank < count:
        raise _fail(req, f"{name}={rank} is not a node of the {count} in {of}; fix the variable (0 to {count - 1}).")
    return rank


def _ports(req: Request, start: Optional[int], given_as: str) -> Optional[tuple]:
    """--started_port when given, else ``start`` (None: free ports, one node only)."""
    if req.opts.started_port is not None:
        return pl._port_range(req.opts.started_port, req.nper, f"--started_port {req.opts.started_port}")
    return None if start is None else pl._port_range(start, req.nper, given_as)


def _job_port(job: int) -> int:
    """A start port derived from a job id: the same on every node of the job, different between jobs."""
    return JOB_PORT_BASE + job % JOB_PORT_SPAN


def _hosts(req: Request, hosts, name: str, text: str) -> tuple:
    """Host names checked as --cluster_node_ips is: well-formed, each once."""
    for h in hosts:
        if not pl.is_valid_host(h):
            raise _fail(req, f"{name}={text} has a malformed host name {h!r}; fix the variable.")
    dup = pl._first_duplicate(hosts)
    if dup is not None:
        raise _fail(req, f"{name}={text} lists {dup} twice; each node must appear once.")
    return tuple(hosts)


def _same_host(a: str, b: str) -> bool:
    """Host names compared as schedulers write them: with or without the domain."""
    return a == b or a.split(".")[0] == b.split(".")[0]


def _own_index(req: Request, hosts: tuple, where: str) -> int:
    """This machine's place in ``hosts``, found by its host name."""
    me = req.host.hostname
    found = [i for i, h in enumerate(hosts) if me and _same_host(h, me)]
    if not found:
        raise _fail(req, f"this machine ({me or 'no host name'}) is not among the hosts of {where} ({_short_list(hosts)}); "
                         f"start one launcher on each of those hosts.")
    return found[0]


def _gpu_devices(*names: str):
    """devices(): --selected_gpus from the first of ``names`` set, unless CUDA_VISIBLE_DEVICES already narrows the GPUs."""
    def devices(env: Mapping[str, str]) -> Mapping[str, object]:
        if env.get("CUDA_VISIBLE_DEVICES") is not None:
            return {}
        for name in names:
            if env.get(name, "").strip():
                return {"selected_gpus": env[name].strip()}
        return {}
    return devices


# ---------------------------------------------------------------- the command line


def _cli_given(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    return opts.cluster_node_ips != DEFAULT_NODES


def _cli(req: Request) -> Cluster:
    opts = req.opts
    node_ips = pl.parse_node_list(opts.cluster_node_ips, "--cluster_node_ips")
    node_rank = pl._node_rank(node_ips, opts.node_ip, "--node_ip", "--cluster_node_ips")
    if opts.started_port is not None:
        ports = pl._port_range(opts.started_port, req.nper, f"--started_port {opts.started_port}")
    elif len(node_ips) > 1:
        ports = pl._port_range(pl.MULTI_NODE_PORT, req.nper, f"the default start port {pl.MULTI_NODE_PORT} (several nodes)")
    else:
        ports = None
    return Cluster("cli", node_ips, node_rank, ports, ("--cluster_node_ips", "--node_ip"))


# ---------------------------------------------------------------- torchrun's --nnodes (launcher.cli.torchrun)


def _torchrun_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    return opts.nnodes is not None


def _torchrun_world(opts: pl.LaunchOptions) -> tuple:
    """(nodes, this node's rank), checked."""
    if opts.nnodes is None:
        raise LaunchError("--cluster_env torchrun needs torchrun's --nnodes; give it, or choose another --cluster_env.")
    if not 0 <= opts.node_rank < opts.nnodes:
        raise LaunchError(f"--node-rank {opts.node_rank} is not a rank of --nnodes {opts.nnodes}; give 0 to {opts.nnodes - 1}.")
    return opts.nnodes, opts.node_rank


def _torchrun(req: Request) -> Cluster:
    nodes, rank = _torchrun_world(req.opts)
    given = ("--nnodes", "--node-rank") if nodes > 1 else ("--nnodes",)
    port = req.opts.started_port
    if nodes == 1:
        return Cluster("torchrun", (req.opts.node_ip,), 0, _ports(req, port, f"--master-port {port}"), given)
    gathered = _hosts(req, tuple(req.host.gathered_nodes), "the gathered node list", ",".join(req.host.gathered_nodes))
    if len(gathered) != nodes:
        raise _fail(req, f"--nnodes {nodes}, but {len(gathered)} nodes were gathered; give every node the same --nnodes.")
    return Cluster("torchrun", gathered, rank, _ports(req, port, f"--master-port {port}"), given + ("--master-addr",),
                   detail=f"node list gathered at {req.opts.master_addr}, port {port - 1}")


def _torchrun_gathering(opts: pl.LaunchOptions):
    """Several nodes: every node's address, gathered at node 0 (launcher.nodes.gather) on the store port minus one."""
    nodes, rank = _torchrun_world(opts)
    if nodes == 1:
        return None
    from launcher.nodes.gather import Spec

    port = opts.control_port if opts.control_port is not None else opts.started_port - 1
    return Spec(rank, nodes, opts.master_addr, port, f"--master-port {opts.started_port} minus one")


# ---------------------------------------------------------------- PaddleCloud (Paddle 1.8)


PADDLECLOUD_VARS = ("PADDLE_TRAINERS", "POD_IP", "PADDLE_TRAINER_ID")


def _paddlecloud_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    """Its three variables, and PADDLE_TRAINERS_NUM saying several trainers (as --use_paddlecloud needs)."""
    trainers = env.get("PADDLE_TRAINERS_NUM", "").strip()
    return all(env.get(v, "").strip() for v in PADDLECLOUD_VARS) and trainers not in ("", "1")


def _paddlecloud(req: Request) -> Cluster:
    if _int(req, "PADDLE_TRAINERS_NUM", default=1) == 1:
        return _cli(req)  # Paddle 1.8: a single trainer ignores the cloud's variables
    env, opts = req.env, req.opts
    node_ips = pl.parse_node_list(_var(req, "PADDLE_TRAINERS"), "PADDLE_TRAINERS")
    pod_ip = _var(req, "POD_IP")
    node_rank = _int(req, "PADDLE_TRAINER_ID")
    if not 0 <= node_rank < len(node_ips) or node_ips[node_rank] != pod_ip:
        raise LaunchError(f"PADDLE_TRAINER_ID={node_rank} does not point at POD_IP={pod_ip} in PADDLE_TRAINERS={','.join(node_ips)}; fix the PaddleCloud environment.")
    notes = []
    if opts.node_ip not in (DEFAULT_NODES, pod_ip):
        notes.append(f"{req.chosen_by}: using POD_IP={pod_ip} instead of --node_ip {opts.node_ip}.")
    if opts.cluster_node_ips not in (DEFAULT_NODES, ",".join(node_ips)):
        notes.append(f"{req.chosen_by}: using PADDLE_TRAINERS={','.join(node_ips)} instead of --cluster_node_ips {opts.cluster_node_ips}.")
    explicit = env.get("DISTRIBUTED_TRAINER_ENDPOINTS", "").strip()
    if explicit:
        ports = _ports_from_endpoints(explicit, node_ips, node_rank, req.nper)
        return Cluster("paddlecloud", node_ips, node_rank, ports, PADDLECLOUD_VARS + ("DISTRIBUTED_TRAINER_ENDPOINTS",), tuple(notes))
    port, given_as, used = _paddlecloud_start_port(req, len(node_ips))
    return Cluster("paddlecloud", node_ips, node_rank, pl._port_range(port, req.nper, given_as), PADDLECLOUD_VARS + used, tuple(notes))


def _paddlecloud_start_port(req: Request, nodes: int):
    """PADDLE_PORT (several nodes, enough TRAINER_PORTS_NUM), else --started_port, else 6170, as Paddle 1.8.

    Both variables are optional: Paddle 1.8 falls back when either is unset.
    """
    paddle_port = _int(req, "PADDLE_PORT", optional=True)
    ports_num = _int(req, "TRAINER_PORTS_NUM", optional=True)
    if nodes > 1 and paddle_port is not None and ports_num is not None and ports_num >= req.nper:
        return paddle_port, f"PADDLE_PORT={paddle_port}", ("PADDLE_PORT", "TRAINER_PORTS_NUM")
    if req.opts.started_port is not None:
        return req.opts.started_port, f"--started_port {req.opts.started_port}", ()
    return pl.PADDLECLOUD_PORT, f"the PaddleCloud default start port {pl.PADDLECLOUD_PORT}", ()


def _ports_from_endpoints(text: str, node_ips: tuple, node_rank: int, nper: int) -> tuple:
    name = "DISTRIBUTED_TRAINER_ENDPOINTS"
    endpoints = [e.strip() for e in text.split(",")]
    if len(endpoints) != nper * len(node_ips):
        raise LaunchError(f"{name} has {len(endpoints)} endpoints, but {len(node_ips)} nodes of {nper} workers need {nper * len(node_ips)}.")
    parsed = [pl._endpoint(e, name) for e in endpoints]
    dup = pl._first_duplicate([f"{pl._host_part(h)}:{p}" for h, p in parsed])
    if dup is not None:
        raise LaunchError(f"{name} lists the endpoint {dup} twice; give every worker an endpoint of its own.")
    mine = range(node_rank * nper, (node_rank + 1) * nper)
    for i in mine:
        if parsed[i][0] != node_ips[node_rank]:
            raise LaunchError(f"{name} has {endpoints[i]!r} where an endpoint of {node_ips[node_rank]} (host:port) belongs.")
    return tuple(parsed[i][1] for i in mine)


# ---------------------------------------------------------------- Kubeflow (PyTorchJob, TrainJob) and torchrun's PET_*


# PyTorchJob (training-operator v1): pods <job>-master-0 and <job>-worker-0..N-2, MASTER_ADDR=<job>-master-0.
_PYTORCHJOB_MASTER = re.compile(r"(?P<job>.+)-master-0(?P<domain>\..+)?")
# TrainJob (Kubeflow Trainer v2, a JobSet): pods <job>-node-0-0..N-1, PET_MASTER_ADDR=<job>-node-0-0.<job>.
_JOBSET_FIRST = re.compile(r"(?P<prefix>.+-[0-9]+)-0(?P<domain>\..+)?")


def _kubeflow_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    """torchrun's PET_* variables (MASTER_ADDR and RANK alone are what every torch worker sees)."""
    return bool(env.get("PET_NNODES", "").strip() or env.get("PET_NODE_RANK", "").strip())


def _kubeflow(req: Request) -> Cluster:
    nodes_var = _first_var(req, "PET_NNODES", "WORLD_SIZE")
    rank_var = _first_var(req, "PET_NODE_RANK", "RANK")
    nnodes = _nnodes(req, nodes_var)
    rank = _index(req, rank_var, nnodes, f"{nodes_var}={nnodes}")
    used = (nodes_var, rank_var)
    if nnodes == 1:
        return Cluster("kubeflow", (DEFAULT_NODES,), 0, _ports(req, None, ""), used)
    addr_var = _first_var(req, "PET_MASTER_ADDR", "MASTER_ADDR")
    port_var = _first_var(req, "PET_MASTER_PORT", "MASTER_PORT")
    hosts = _pod_names(req, addr_var, _var(req, addr_var), nnodes)
    port = _int(req, port_var)
    return Cluster("kubeflow", hosts, rank, _ports(req, port, f"{port_var}={port}"), used + (addr_var, port_var))


def _nnodes(req: Request, name: str) -> int:
    value = _var(req, name)
    low, colon, high = value.partition(":")
    if colon and low == high:
        value = low  # "2:2": an elastic policy with min = max
    elif colon:
        raise _fail(req, f"{name}={value} is an elastic range of nodes; this launcher runs a fixed number: give the job minReplicas = maxReplicas.")
    if not pl._DIGITS.fullmatch(value) or int(value) < 1:
        raise _fail(req, f"{name}={value} is not a number of nodes; fix the variable.")
    return int(value)


def _pod_names(req: Request, name: str, master: str, count: int) -> tuple:
    """Every pod of the job in rank order, from the first one's predictable name."""
    m = _PYTORCHJOB_MASTER.fullmatch(master)
    if m:
        domain = m.group("domain") or ""
        return (master, *(f"{m.group('job')}-worker-{i}{domain}" for i in range(count - 1)))
    m = _JOBSET_FIRST.fullmatch(master)
    if m:
        domain = m.group("domain") or ""
        return tuple(f"{m.group('prefix')}-{i}{domain}" for i in range(count))
    raise _fail(req, f"{name}={master} is not the name of a PyTorchJob's master pod (<job>-master-0) or of a TrainJob's "
                     f"first node (<job>-node-0-0.<job>), so the other nodes' names are unknown; give --cluster_node_ips and --node_ip instead.")


def _kubeflow_devices(env: Mapping[str, str]) -> Mapping[str, object]:
    for name in ("PET_NPROC_PER_NODE", "PET_N_PROC_PER_NODE"):  # the second: training-operator's older spelling
        value = env.get(name, "").strip()
        if pl._DIGITS.fullmatch(value) and int(value) > 0:
            return {"nproc_per_node": int(value)}
    return {}  # unset, or torchrun's "auto", "gpu", "cpu": the launcher's own rule


# ---------------------------------------------------------------- SLURM (srun, one task per node)


def _slurm_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    """Inside an srun step; a batch shell (sbatch, salloc) is not a launch across nodes."""
    return bool(env.get("SLURM_STEP_ID", "").strip() and env.get("SLURM_NODEID", "").strip())


def _slurm(req: Request) -> Cluster:
    _var(req, "SLURM_STEP_ID")
    _refuse_several_tasks_per_node(req)
    list_var = _first_var(req, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    text = _var(req, list_var)
    try:
        hosts = _hosts(req, hostlist.expand(text), list_var, text)
    except hostlist.HostListError as e:
        raise _fail(req, f"{list_var}={text} is not a Slurm host list ({e}); fix the variable.") from None
    count_var = "SLURM_STEP_NUM_NODES" if req.env.get("SLURM_STEP_NUM_NODES", "").strip() else "SLURM_NNODES"
    count = _int(req, count_var, optional=True)
    if count is not None and count != len(hosts):
        raise _fail(req, f"{count_var}={count} disagrees with {list_var}={text} ({len(hosts)} nodes); fix the job's variables.")
    rank = _index(req, "SLURM_NODEID", len(hosts), list_var)
    job = _int(req, "SLURM_JOB_ID")
    port = _job_port(job)
    used = (list_var, "SLURM_NODEID", "SLURM_JOB_ID")
    used += tuple(v for v in ("SLURM_STEP_GPUS",) if _gpu_devices(v)(req.env))
    ports = _ports(req, port, f"the start port {port} derived from SLURM_JOB_ID={job}")
    return Cluster("slurm", hosts, rank, ports, used, job_id=f"slurm-{job}.{req.env['SLURM_STEP_ID'].strip()}")


def _refuse_several_tasks_per_node(req: Request) -> None:
    """One launcher per node: it starts every worker of its node itself."""
    fix = "run srun with --ntasks-per-node=1 (the launcher starts the workers of its node itself)."
    tasks = _int(req, "SLURM_STEP_NUM_TASKS", optional=True)
    nodes = _int(req, "SLURM_STEP_NUM_NODES", optional=True)
    if tasks is not None and nodes is not None:
        if tasks > nodes:
            raise _fail(req, f"SLURM_STEP_NUM_TASKS={tasks} on SLURM_STEP_NUM_NODES={nodes} starts several launchers per node; {fix}")
        return
    per_node = _int(req, "SLURM_NTASKS_PER_NODE", optional=True)
    if per_node is not None and per_node > 1:
        raise _fail(req, f"SLURM_NTASKS_PER_NODE={per_node} starts several launchers per node; {fix}")


# ---------------------------------------------------------------- Volcano (the svc and env plugins)


_VOLCANO_HOSTS = re.compile(r"VC_(?P<task>[A-Z0-9_]+)_HOSTS")
_FIRST_TASKS = ("MASTER", "CHIEF")  # their pods come first, as node 0


def _volcano_tasks(env: Mapping[str, str]) -> list:
    """The task names of the job, as in VC_<TASK>_HOSTS: master/chief first, then by name."""
    tasks = [m.group("task") for m in map(_VOLCANO_HOSTS.fullmatch, env) if m and env[m.group(0)].strip()]
    return sorted(tasks, key=lambda t: (t not in _FIRST_TASKS, t))


def _volcano_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    index = env.get("VC_TASK_INDEX", "").strip() or env.get("VK_TASK_INDEX", "").strip()
    return bool(index and _volcano_tasks(env))


def _volcano(req: Request) -> Cluster:
    index_var = _first_var(req, "VC_TASK_INDEX", "VK_TASK_INDEX")
    tasks = _volcano_tasks(req.env)
    if not tasks:
        _var(req, "VC_<TASK>_HOSTS")
    offsets, hosts, used = {}, [], [index_var]
    for task in tasks:
        name = f"VC_{task}_HOSTS"
        text = req.env[name].strip()
        listed = [h.strip() for h in text.split(",")]
        count = _int(req, f"VC_{task}_NUM", optional=True)
        if count is not None and count != len(listed):
            raise _fail(req, f"VC_{task}_NUM={count} disagrees with {name}={text} ({len(listed)} hosts); fix the job's variables.")
        offsets[task] = (len(hosts), len(listed), name)
        hosts += listed
        used.append(name)
    hosts = _hosts(req, hosts, "+".join(f"VC_{t}_HOSTS" for t in tasks), ",".join(hosts))
    task = tasks[0] if len(tasks) == 1 else _own_task(req, hosts, offsets)
    start, count, name = offsets[task]
    index = _index(req, index_var, count, name)
    port = _int(req, "MASTER_PORT", optional=True)
    given_as = f"MASTER_PORT={port}" if port is not None else f"the default start port {pl.MULTI_NODE_PORT} (several nodes)"
    start_port = port if port is not None else pl.MULTI_NODE_PORT if len(hosts) > 1 else None
    return Cluster("volcano", hosts, start + index, _ports(req, start_port, given_as), tuple(used))


def _own_task(req: Request, hosts: tuple, offsets: dict) -> str:
    """Several tasks: this pod's task is the one whose host list holds this machine's name."""
    mine = _own_index(req, hosts, "the Volcano job")
    return next(t for t, (start, count, _) in offsets.items() if start <= mine < start + count)


# ---------------------------------------------------------------- MPI (mpirun, one launcher per node)


_MPI_SIZES = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), ("PMI_SIZE", "PMI_RANK"), ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))


def _mpi_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    return any(env.get(size, "").strip() for size, _ in _MPI_SIZES)


GATHER_PORT = pl.MULTI_NODE_PORT - 1  # the gathering port without --control_port, MASTER_PORT, --started_port


def _mpi_world(req: Request):
    """(size variable, rank variable, size, rank), one launcher per node."""
    size_var = _first_var(req, *(size for size, _ in _MPI_SIZES))
    rank_var = dict(_MPI_SIZES)[size_var]
    size = _int(req, size_var)
    rank = _index(req, rank_var, max(size, 1), f"{size_var}={size}")
    local = _int(req, "OMPI_COMM_WORLD_LOCAL_SIZE", optional=True)
    if local is not None and local > 1:
        raise _fail(req, f"OMPI_COMM_WORLD_LOCAL_SIZE={local} starts several launchers per node; run mpirun with --map-by ppr:1:node (the launcher starts the workers of its node itself).")
    return size_var, rank_var, size, rank


def _gather_port(req: Request):
    """(port, how messages name it): --control_port, MASTER_PORT, --started_port - 1, else 6069."""
    opts = req.opts
    if opts.control_port is not None:
        return opts.control_port, f"--control_port {opts.control_port}"
    port = _int(req, "MASTER_PORT", optional=True)
    if port is not None:
        given_as = f"MASTER_PORT={port}"
    elif opts.started_port is not None:
        port, given_as = opts.started_port - 1, f"--started_port {opts.started_port} minus one"
    else:
        port, given_as = GATHER_PORT, f"the default gathering port {GATHER_PORT}"
    if not 1 <= port <= 65535:
        raise _fail(req, f"{given_as} is not a port (1-65535) to gather the node list on; give one with --control_port.")
    return port, given_as


def gathering(opts: pl.LaunchOptions, env: Mapping[str, str]):
    """What an MPI job of several ranks must gather before planning (a ``gather.Spec``), else None."""
    source, chosen_by = choose(opts, env)
    if source == "torchrun" and not opts.parameter_server:
        return _torchrun_gathering(opts)
    if source != "mpi" or opts.parameter_server:
        return None
    req = Request(source, env, opts, None, 1, chosen_by)
    _, _, size, rank = _mpi_world(req)
    if size <= 1:
        return None
    from launcher.nodes.gather import Spec

    return Spec(rank, size, _mpi_master(req, size), *_gather_port(req))


def _mpi_master(req: Request, size: int) -> str:
    """Node 0's address, where the other ranks gather: MASTER_ADDR, which mpirun -x passes on."""
    master = req.env.get("MASTER_ADDR", "").strip()
    if not master:
        raise _fail(req, f"{size} MPI ranks need node 0's address in MASTER_ADDR to gather the node list; "
                         f"run mpirun -x MASTER_ADDR=<address of the first host>.")
    if not pl.is_valid_host(master):
        raise _fail(req, f"MASTER_ADDR={master} is not an address or host name; run mpirun -x MASTER_ADDR=<address of the first host>.")
    return master


def _mpi(req: Request) -> Cluster:
    size_var, rank_var, size, rank = _mpi_world(req)
    if size <= 1:
        return Cluster("mpi", (DEFAULT_NODES,), rank, _ports(req, None, ""), (size_var, rank_var))
    _mpi_master(req, size)
    nodes = tuple(req.host.gathered_nodes)
    if len(nodes) != size:
        raise _fail(req, f"{size_var}={size}, but {len(nodes)} nodes were gathered; start every rank with the same mpirun.")
    nodes = _hosts(req, nodes, "the gathered node list", ",".join(nodes))
    port, _ = _gather_port(req)
    ports = _ports(req, pl.MULTI_NODE_PORT, f"the default start port {pl.MULTI_NODE_PORT} (several nodes)")
    return Cluster("mpi", nodes, rank, ports, (size_var, rank_var, "MASTER_ADDR"), detail=f"node list gathered over port {port}")


# ---------------------------------------------------------------- LSF (bsub; one launcher per host with jsrun or blaunch)


def _lsf_found(env: Mapping[str, str], opts: pl.LaunchOptions) -> bool:
    return bool(env.get("LSB_JOBID", "").strip())


def _lsf(req: Request) -> Cluster:
    job = _int(req, "LSB_JOBID")
    slots, list_var = _lsf_slots(req)
    hosts = _hosts(req, [h for h, _ in slots], list_var, ",".join(h for h, _ in slots))
    notes = ()
    if _is_launch_node(slots):
        notes = (f"LSF: leaving out {hosts[0]}, the job's launch node (one slot, while every other host has more).",)
        hosts = hosts[1:]
    rank = 0 if len(hosts) == 1 else _own_index(req, hosts, f"LSF job {job}")
    port = _job_port(job)
    ports = _ports(req, port, f"the start port {port} derived from LSB_JOBID={job}")
    return Cluster("lsf", hosts, rank, ports, (list_var, "LSB_JOBID"), notes, job_id=f"lsf-{job}")


def _lsf_slots(req: Request):
    """[(host, slots)] in order, from the rank file (one line per slot) or LSB_MCPU_HOSTS (host n host n)."""
    files = dict(req.host.env_files)
    path = req.env.get("LSB_DJOB_RANKFILE", "").strip()
    if path and path in files:
        lines = [line.strip() for line in files[path].splitlines() if line.strip()]
        if not lines:
            raise _fail(req, f"LSB_DJOB_RANKFILE={path} lists no host; fix the file, or unset the variable to use LSB_MCPU_HOSTS.")
        order = list(dict.fromkeys(lines))
        return [(h, lines.count(h)) for h in order], "LSB_DJOB_RANKFILE"
    if path:
        raise _fail(req, f"LSB_DJOB_RANKFILE={path} cannot be read; check the file, or unset the variable to use LSB_MCPU_HOSTS.")
    text = _var(req, "LSB_MCPU_HOSTS")
    words = text.split()
    if len(words) % 2 or not all(pl._DIGITS.fullmatch(n) for n in words[1::2]):
        raise _fail(req, f"LSB_MCPU_HOSTS={text} is not pairs of a host and its slots (host1 4 host2 4); fix the variable.")
    return [(h, int(n)) for h, n in zip(words[::2], words[1::2])], "LSB_MCPU_HOSTS"


def _is_launch_node(slots: list) -> bool:
    """CSM/jsrun systems list the launch node first, with one slot; it runs no worker."""
    return len(slots) > 1 and slots[0][1] == 1 and all(n > 1 for _, n in slots[1:])


# ---------------------------------------------------------------- the registry, in the order auto tries it


SOURCES = {
    "cli": Source("the command line", _cli_given, _cli, "give --cluster_node_ips and --node_ip"),
    "torchrun": Source("torchrun's options", _torchrun_found, _torchrun, "give --nnodes, --node-rank and --master-addr"),
    "paddlecloud": Source("PaddleCloud", _paddlecloud_found, _paddlecloud, "set it or drop --use_paddlecloud"),
    "kubeflow": Source("Kubeflow", _kubeflow_found, _kubeflow,
                       "run it in a PyTorchJob or TrainJob pod, or choose another --cluster_env", devices=_kubeflow_devices),
    "slurm": Source("SLURM", _slurm_found, _slurm,
                    "start the launcher with srun --ntasks-per-node=1, or choose another --cluster_env",
                    devices=_gpu_devices("SLURM_STEP_GPUS")),
    "volcano": Source("Volcano", _volcano_found, _volcano,
                      "run it in a Volcano job with the svc and env plugins, or choose another --cluster_env"),
    "mpi": Source("MPI", _mpi_found, _mpi, "start the launcher with mpirun, or choose another --cluster_env"),
    "lsf": Source("LSF", _lsf_found, _lsf, "run it in an LSF job (bsub), or choose another --cluster_env"),
}
