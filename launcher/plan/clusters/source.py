"""What a cluster source is (``Source``), what it resolves from (``Request``) and to (``Cluster``), and the
helpers every source reads its variables with. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from launcher.errors import LaunchError
from launcher.plan.parsing import INTEGER, first_duplicate, is_valid_host, port_range

if TYPE_CHECKING:  # annotations only: the sources load without the model, so that --help stays fast
    from launcher.plan.model import HostFacts, LaunchOptions


AUTO = "auto"
DEFAULT_NODES = "127.0.0.1"  # --cluster_node_ips when not given
JOB_PORT_BASE = 20000  # SLURM and LSF: start port 20000 + job id % 20000, the same on every node
JOB_PORT_SPAN = 20000
MULTI_NODE_PORT = 6070  # Paddle 1.8's default start port when several nodes are given
MULTI_NODE_START = f"the default start port {MULTI_NODE_PORT} (several nodes)"  # how messages name it


@dataclass(frozen=True)
class Cluster:
    source: str  # the name in registry.SOURCES
    node_ips: tuple  # every node, in node-rank order
    node_rank: int  # this node's index
    ports: Optional[tuple]  # the worker ports of the first node at each address; None: free ports are to be found
    variables: tuple = ()  # what it was read from, for the plan table
    notes: tuple = ()  # warnings for the user
    job_id: Optional[str] = None  # the scheduler's name of the job, the same on every node
    detail: str = ""  # how else the nodes were found, for the plan table
    node_ports: Optional[tuple] = None  # every node's ports, by node rank, where the source gives them; else node_ports.every_node

    @property
    def description(self) -> str:
        """``slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)``."""
        detail = f"; {self.detail}" if self.detail else ""
        return f"{self.source} ({', '.join(self.variables)}{detail})" if self.variables else self.source


@dataclass(frozen=True)
class GatherSpec:
    """What a source must gather before planning (Source.gathering, registry.gathering()): this rank, the number
    of ranks, node 0's address, the port. launcher.nodes.static.gather does the gathering."""

    rank: int
    size: int
    master: str  # MASTER_ADDR
    port: int
    given_as: str  # how messages name the port: "--control_port 7000", "MASTER_PORT=7000", ...


@dataclass(frozen=True)
class Request:
    """What a source resolves from: the environment, the options, the host, the workers per node."""

    source: str
    env: Mapping[str, str]
    opts: LaunchOptions
    host: HostFacts
    nper: int
    chosen_by: str  # how messages name the choice: "--cluster_env slurm", "--use_paddlecloud", ...
    fix: str = ""  # what to do when a variable the source needs is missing (its Source's fix)


def _no_devices(env: Mapping[str, str]) -> Mapping[str, object]:
    return {}


def _no_gathering(req: Request) -> Optional[GatherSpec]:
    return None


@dataclass(frozen=True)
class Source:
    """One row of the registry: where a scheduler's nodes come from, and how to read them."""

    name: str  # its --cluster_env name, and Cluster.source
    label: str  # how messages name the scheduler
    detect: Callable[[Mapping[str, str], LaunchOptions], bool]  # whether this environment comes from it
    resolve: Callable[[Request], Cluster]
    fix: str  # what to do when one of its variables is missing
    devices: Callable[[Mapping[str, str]], Mapping[str, object]] = field(default=_no_devices)  # option defaults it sets
    gathering: Callable[[Request], Optional[GatherSpec]] = field(default=_no_gathering)  # nodes to gather first, if any
    files: tuple = ()  # variables naming a file it reads (preflight reads them into HostFacts.env_files)
    replaces_cli_nodes: bool = True  # its nodes replace --cluster_node_ips and --node_ip, with a note where they differ


# ---------------------------------------------------------------- helpers for the sources


def fail(req: Request, sentence: str) -> LaunchError:
    return LaunchError(f"{req.chosen_by}: {sentence}")


def var(req: Request, name: str) -> str:
    value = req.env.get(name, "").strip()
    if not value:
        raise LaunchError(f"{req.chosen_by} needs the variable {name}, which is not set; {req.fix}.")
    return value


def first_var(req: Request, *names: str) -> str:
    """The first of ``names`` that is set (the name); the first one is named when none is."""
    for name in names:
        if req.env.get(name, "").strip():
            return name
    var(req, names[0])  # raises, naming the first
    return names[0]


def int_var(req: Request, name: str, default: Optional[int] = None, optional: bool = False):
    """The whole number in ``name``; ``default`` (or None when ``optional``) when it is unset or empty."""
    if (default is not None or optional) and not req.env.get(name, "").strip():
        return default
    value = var(req, name)
    if not INTEGER.fullmatch(value):
        raise fail(req, f"{name}={value} is not a whole number; fix the variable.")
    return int(value)


def index_var(req: Request, name: str, count: int, of: str) -> int:
    rank = int_var(req, name)
    if not 0 <= rank < count:
        raise fail(req, f"{name}={rank} is not a node of the {count} in {of}; fix the variable (0 to {count - 1}).")
    return rank


def worker_ports(req: Request, start: Optional[int], given_as: str) -> Optional[tuple]:
    """--started_port when given, else ``start`` (None: free ports, one node only)."""
    if req.opts.started_port is not None:
        return port_range(req.opts.started_port, req.nper, f"--started_port {req.opts.started_port}")
    return None if start is None else port_range(start, req.nper, given_as)


def job_port(job: int) -> int:
    """A start port derived from a job id: the same on every node of the job, different between jobs."""
    return JOB_PORT_BASE + job % JOB_PORT_SPAN


def well_formed_hosts(req: Request, hosts, name: str, text: str) -> tuple:
    """Host names checked as --cluster_node_ips is; one listed twice is nodes that share a host."""
    for h in hosts:
        if not is_valid_host(h):
            raise fail(req, f"{name}={text} has a malformed host name {h!r}; fix the variable.")
    return tuple(hosts)


def checked_hosts(req: Request, hosts, name: str, text: str) -> tuple:
    """Host names well-formed, each once: a source that finds this node by its host name cannot tell apart two nodes
    of one host."""
    well_formed_hosts(req, hosts, name, text)
    dup = first_duplicate(hosts)
    if dup is not None:
        raise fail(req, f"{name}={text} lists {dup} twice; each node must appear once.")
    return tuple(hosts)


def _same_host(a: str, b: str) -> bool:
    """Host names compared as schedulers write them: with or without the domain."""
    return a == b or a.split(".")[0] == b.split(".")[0]


def own_index(req: Request, hosts: tuple, where: str) -> int:
    """This machine's place in ``hosts``, found by its host name."""
    me = req.host.hostname
    found = [i for i, h in enumerate(hosts) if me and _same_host(h, me)]
    if not found:
        raise fail(req, f"this machine ({me or 'no host name'}) is not among the hosts of {where} ({short_list(hosts)}); "
                         f"start one launcher on each of those hosts.")
    return found[0]


def gpu_devices(*names: str):
    """devices(): --selected_gpus from the first of ``names`` set, unless CUDA_VISIBLE_DEVICES already narrows the GPUs."""
    def devices(env: Mapping[str, str]) -> Mapping[str, object]:
        if env.get("CUDA_VISIBLE_DEVICES") is not None:
            return {}
        for name in names:
            if env.get(name, "").strip():
                return {"selected_gpus": env[name].strip()}
        return {}
    return devices


def short_list(nodes: tuple) -> str:
    return ",".join(nodes[:4]) + (f",... ({len(nodes)} nodes)" if len(nodes) > 4 else "")
