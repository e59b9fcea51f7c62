"""Where a parameter-server process stands: its role, the servers, the trainers (read from the launcher's variables).

Pure: a mapping of variables in, a frozen PsEnv out. No torch, no os.environ.

The RPC world is every server and every trainer: server i is rpc rank i, trainer j is rpc rank
S + j. Server 0 hosts the rendezvous store on its own endpoint (the first of
PADDLE_PSERVERS_IP_PORT_LIST), which the launcher keeps reserved for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from launcher import envvars as ev
from launcher.runtime.environment import WorkerEnvError, int_var, parse_endpoints, split_endpoint

SERVER = "PSERVER"
TRAINER = "TRAINER"


@dataclass(frozen=True)
class PsEnv:
    """This process in a parameter-server job."""

    role: str  # SERVER or TRAINER
    index: int  # server id or trainer id
    servers: tuple  # every server's "ip:port", by server id
    trainers_num: int
    trainer_endpoints: tuple = ()  # every trainer's "ip:port", by trainer id; () when unknown

    @property
    def is_server(self) -> bool:
        return self.role == SERVER

    @property
    def rpc_rank(self) -> int:
        return self.index if self.is_server else len(self.servers) + self.index

    @property
    def rpc_world_size(self) -> int:
        return len(self.servers) + self.trainers_num

    @property
    def name(self) -> str:
        return server_name(self.index) if self.is_server else trainer_name(self.index)

    @property
    def store_endpoint(self) -> tuple:
        """(host, port) of server 0, where the rendezvous store lives."""
        return split_endpoint(self.servers[0], ev.PSERVERS_IP_PORT_LIST)

    def endpoints_by_rpc_rank(self) -> tuple:
        trainers = self.trainer_endpoints or tuple("endpoint unknown" for _ in range(self.trainers_num))
        return self.servers + trainers

    def describe(self, name: str) -> str:
        """'server 1 (10.0.0.2:6170)' for the rpc name ``name``."""
        for prefix, offset in (("server", 0), ("trainer", len(self.servers))):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                index = int(name[len(prefix):])
                return f"{prefix} {index} ({self.endpoints_by_rpc_rank()[offset + index]})"
        return name


def server_name(index: int) -> str:
    return f"server{index}"


def trainer_name(index: int) -> str:
    return f"trainer{index}"


def is_ps_environment(environ: Mapping[str, str]) -> bool:
    """Whether the launcher started this process in parameter-server mode."""
    return bool(environ.get(ev.TRAINING_ROLE, "").strip())


def read_ps_env(environ: Mapping[str, str]) -> PsEnv:
    """The PsEnv described by ``environ``; a missing or malformed variable is a WorkerEnvError naming it."""
    role = environ.get(ev.TRAINING_ROLE, "").strip().upper()
    if role not in (SERVER, TRAINER):
        raise WorkerEnvError(f"{ev.TRAINING_ROLE}={environ.get(ev.TRAINING_ROLE, '')!r} must be {SERVER} or {TRAINER}; "
                             "start the script with python -m launcher --server_num S --worker_num T.")
    servers = parse_endpoints(_required(environ, ev.PSERVERS_IP_PORT_LIST), ev.PSERVERS_IP_PORT_LIST)
    trainers_num = _required_int(environ, ev.TRAINERS_NUM)
    if trainers_num < 1:
        raise WorkerEnvError(f"{ev.TRAINERS_NUM}={trainers_num} must be at least 1.")
    trainer_endpoints = parse_endpoints(environ.get(ev.TRAINER_ENDPOINTS, ""), ev.TRAINER_ENDPOINTS)
    if trainer_endpoints and len(trainer_endpoints) != trainers_num:
        raise WorkerEnvError(f"{ev.TRAINER_ENDPOINTS} lists {len(trainer_endpoints)} endpoints for "
                             f"{ev.TRAINERS_NUM}={trainers_num} trainers.")
    if role == SERVER:
        index = _server_index(environ, servers)
    else:
        index = _required_int(environ, ev.TRAINER_ID)
        if not 0 <= index < trainers_num:
            raise WorkerEnvError(f"{ev.TRAINER_ID}={index} is outside {ev.TRAINERS_NUM}={trainers_num}.")
    return PsEnv(role, index, servers, trainers_num, trainer_endpoints)


def make_ps_env(role: str, index: int, servers: Sequence[str], trainers_num: int,
                trainer_endpoints: Sequence[str] = ()) -> PsEnv:
    """A PsEnv from explicit values (the transpiler's arguments), checked as read_ps_env checks variables."""
    servers = parse_endpoints(",".join(servers), "pservers")
    limit = len(servers) if role == SERVER else trainers_num
    if not 0 <= index < limit:
        raise WorkerEnvError(f"{'server' if role == SERVER else 'trainer'} id {index} is outside the {limit} "
                             f"{'pservers' if role == SERVER else 'trainers'}.")
    return PsEnv(role, index, servers, trainers_num, tuple(trainer_endpoints))


def _server_index(environ: Mapping[str, str], servers: tuple) -> int:
    index: Optional[int] = int_var(environ, ev.PSERVER_ID)
    if index is None:
        here = f"{environ.get(ev.POD_IP, '').strip()}:{environ.get(ev.PORT, '').strip()}"
        if here not in servers:
            raise WorkerEnvError(f"{ev.PSERVER_ID} is not set and {ev.POD_IP}:{ev.PORT} ({here}) is not in "
                                 f"{ev.PSERVERS_IP_PORT_LIST}; set {ev.PSERVER_ID}.")
        return servers.index(here)
    if not 0 <= index < len(servers):
        raise WorkerEnvError(f"{ev.PSERVER_ID}={index} is outside the {len(servers)} servers of {ev.PSERVERS_IP_PORT_LIST}.")
    return index


def _required(environ: Mapping[str, str], name: str) -> str:
    text = environ.get(name, "").strip()
    if not text:
        raise WorkerEnvError(f"{name} is not set; parameter-server mode needs it (the launcher sets it).")
    return text


def _required_int(environ: Mapping[str, str], name: str) -> int:
    _required(environ, name)
    return int_var(environ, name)
