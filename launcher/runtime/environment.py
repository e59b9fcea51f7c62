"""What the launcher told this worker: its variables (docs/options.md), read into a WorkerEnv.

Pure: a mapping of variables in, a frozen WorkerEnv out. No torch, no os.environ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from launcher import addresses, envvars as ev


class WorkerEnvError(ValueError):
    """A launcher variable is missing, malformed or contradicts another one."""


@dataclass(frozen=True)
class WorkerEnv:
    """This worker's place in the job, as the launcher (or a role maker) describes it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    node_count: int = 1
    endpoints: tuple = ()  # "ip:port" of every rank, in rank order; () when unknown
    master_addr: Optional[str] = None  # where rank 0 hosts the store; None: a world of one
    master_port: Optional[int] = None
    selected_gpus: Optional[str] = None  # FLAGS_selected_gpus; None on CPU workers
    agent_store: bool = False  # TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store, rank 0 is a client

    @property
    def alone(self) -> bool:
        return self.world_size == 1 and self.master_addr is None

    def endpoint_of(self, rank: int) -> str:
        return self.endpoints[rank] if rank < len(self.endpoints) else "endpoint unknown"


def read_worker_env(environ: Mapping[str, str], read_file: Callable[[str], str] = None) -> WorkerEnv:
    """The WorkerEnv described by ``environ``; a world of one when no launcher variable is set."""
    rank = int_var(environ, ev.TRAINER_ID, ev.RANK)
    world = int_var(environ, ev.TRAINERS_NUM, ev.WORLD_SIZE)
    if rank is None and world is None:
        return WorkerEnv(selected_gpus=_gpus(environ))
    if rank is None or world is None:
        missing = f"{ev.TRAINER_ID} (or {ev.RANK})" if rank is None else f"{ev.TRAINERS_NUM} (or {ev.WORLD_SIZE})"
        raise WorkerEnvError(f"{missing} is not set, but the other half of the rank/world pair is.")
    if not 0 <= rank < world:
        raise WorkerEnvError(f"rank {rank} is outside a world of {world} workers.")
    endpoints = _endpoints(environ, read_file or _read_text)
    if endpoints and len(endpoints) != world:
        raise WorkerEnvError(f"{ev.TRAINER_ENDPOINTS} lists {len(endpoints)} endpoints for a world of {world} workers.")
    addr, port = _master(environ, endpoints)
    local_rank, local_world = _local(environ, rank, world, endpoints)
    node_rank = int_var(environ, ev.GROUP_RANK)
    node_count = int_var(environ, ev.GROUP_WORLD_SIZE)
    return WorkerEnv(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=rank // local_world if node_rank is None else node_rank,
        node_count=max(1, world // local_world) if node_count is None else node_count,
        endpoints=endpoints,
        master_addr=addr,
        master_port=port,
        selected_gpus=_gpus(environ),
        agent_store=environ.get(ev.ELASTIC_USE_AGENT_STORE) == "True",  # torch's own test of the value
    )


def env_from_endpoints(current_id: int, endpoints: Sequence[str], selected_gpus: Optional[str] = None) -> WorkerEnv:
    """The WorkerEnv of rank ``current_id`` among ``endpoints`` (UserDefinedRoleMaker)."""
    endpoints = tuple(e.strip() for e in endpoints)
    if not endpoints:
        raise WorkerEnvError("worker_endpoints is empty: give every worker's ip:port, in rank order.")
    if not 0 <= current_id < len(endpoints):
        raise WorkerEnvError(f"current_id {current_id} is outside the {len(endpoints)} worker_endpoints.")
    addr, port = split_endpoint(endpoints[0], "worker_endpoints[0]")
    local_rank, local_world = _same_host(current_id, endpoints)
    hosts = list(dict.fromkeys(split_endpoint(e, "worker_endpoints")[0] for e in endpoints))
    host = split_endpoint(endpoints[current_id], "worker_endpoints")[0]
    return WorkerEnv(
        rank=current_id,
        world_size=len(endpoints),
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=hosts.index(host),
        node_count=len(hosts),
        endpoints=endpoints,
        master_addr=addr,
        master_port=port,
        selected_gpus=selected_gpus,
    )


def choose_backend(selected_gpus: Optional[str], cuda_available: bool, requested: Optional[str] = None) -> str:
    """NCCL for a worker with a GPU (FLAGS_selected_gpus set and CUDA available), gloo otherwise."""
    if requested is not None:
        if requested == "nccl" and not cuda_available:
            raise WorkerEnvError("backend 'nccl' needs CUDA, which this worker does not have; use 'gloo'.")
        return requested
    return "nccl" if selected_gpus and cuda_available else "gloo"


def gpu_index(selected_gpus: Optional[str]) -> Optional[int]:
    """The worker's GPU (the first id of FLAGS_selected_gpus), or None."""
    if not selected_gpus:
        return None
    first = selected_gpus.split(",")[0].strip()
    if not first.isdigit():
        raise WorkerEnvError(f"{ev.SELECTED_GPUS}={selected_gpus!r} is not a GPU id.")
    return int(first)


# ---------------------------------------------------------------- helpers


def int_var(environ: Mapping[str, str], *names: str) -> Optional[int]:
    """The value of the first of ``names`` that is set; all that are set must agree."""
    values = {}
    for name in names:
        text = environ.get(name, "").strip()
        if not text:
            continue
        try:
            values[name] = int(text)
        except ValueError:
            raise WorkerEnvError(f"{name}={text!r} is not a whole number.") from None
    if len(set(values.values())) > 1:
        raise WorkerEnvError("these variables disagree: " + ", ".join(f"{k}={v}" for k, v in values.items()) + ".")
    return next(iter(values.values()), None)


def _endpoints(environ: Mapping[str, str], read_file: Callable[[str], str]) -> tuple:
    text = environ.get(ev.TRAINER_ENDPOINTS, "").strip()
    path = environ.get(ev.TRAINER_ENDPOINTS_FILE, "").strip()
    if not text and path:
        try:
            text = read_file(path).strip()
        except OSError as e:
            raise WorkerEnvError(f"{ev.TRAINER_ENDPOINTS_FILE}={path!r} cannot be read: {e.strerror}.") from None
    return parse_endpoints(text.replace("\n", ","), ev.TRAINER_ENDPOINTS)


def parse_endpoints(text: str, name: str) -> tuple:
    """The ``ip:port`` endpoints of a comma-separated list, each checked (a WorkerEnvError naming ``name``)."""
    endpoints = tuple(e.strip() for e in text.split(",") if e.strip())
    for e in endpoints:
        split_endpoint(e, name)
    return endpoints


def _master(environ: Mapping[str, str], endpoints: tuple) -> tuple:
    addr = environ.get(ev.MASTER_ADDR, "").strip()
    port = int_var(environ, ev.MASTER_PORT)
    if addr and port is not None:
        return addr, port
    if endpoints:
        return split_endpoint(endpoints[0], ev.TRAINER_ENDPOINTS)
    raise WorkerEnvError(f"{ev.MASTER_ADDR}/{ev.MASTER_PORT} are not set and there is no {ev.TRAINER_ENDPOINTS} to find rank 0 in.")


def _local(environ: Mapping[str, str], rank: int, world: int, endpoints: tuple) -> tuple:
    local_rank = int_var(environ, ev.LOCAL_RANK)
    local_world = int_var(environ, ev.LOCAL_WORLD_SIZE)
    if local_rank is None or local_world is None:
        guess_rank, guess_world = _same_host(rank, endpoints) if endpoints else (rank, world)
        local_rank = guess_rank if local_rank is None else local_rank
        local_world = guess_world if local_world is None else local_world
    if not 0 <= local_rank < local_world:
        raise WorkerEnvError(f"{ev.LOCAL_RANK}={local_rank} is outside {ev.LOCAL_WORLD_SIZE}={local_world}.")
    return local_rank, local_world


def _same_host(rank: int, endpoints: tuple) -> tuple:
    hosts = [split_endpoint(e, "endpoints")[0] for e in endpoints]
    mine = hosts[rank]
    return hosts[:rank].count(mine), hosts.count(mine)


def split_endpoint(endpoint: str, name: str) -> tuple:
    """``ip:port`` (``[v6]:port``) as (ip, port), read as the launcher reads it (``launcher.addresses``)."""
    try:
        return addresses.split(endpoint)
    except addresses.NotAnAddress as e:
        raise WorkerEnvError(f"{name} holds {endpoint!r} where ip:port belongs: it {e}.") from None


def _gpus(environ: Mapping[str, str]) -> Optional[str]:
    return environ.get(ev.SELECTED_GPUS, "").strip() or None


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()
