"""Where a worker learns its place in the job (Paddle's role makers): collective, or parameter-server mode."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from launcher import envvars as ev
from launcher.runtime.environment import WorkerEnv, env_from_endpoints, read_worker_env


class RoleMakerBase:
    is_collective = True

    def worker_env(self) -> WorkerEnv:
        raise NotImplementedError

    def worker_index(self) -> int:
        return self.worker_env().rank

    def worker_num(self) -> int:
        return self.worker_env().world_size

    def is_first_worker(self) -> bool:
        return self.worker_index() == 0

    def get_trainer_endpoints(self) -> list:
        return list(self.worker_env().endpoints)


class PaddleCloudRoleMaker(RoleMakerBase):
    """Everything from the launcher's variables; a world of one when there are none (collective).

    ``is_collective=False``: a parameter-server job, described by TRAINING_ROLE and the PADDLE_*
    variables that ``python -m launcher --server_num S --worker_num T`` sets.
    """

    def __init__(self, is_collective: bool = True):
        self.is_collective = bool(is_collective)
        if not self.is_collective:
            self.ps_env()  # a missing variable is said now, not at fleet.init

    def worker_env(self) -> WorkerEnv:
        if not self.is_collective:
            raise RuntimeError("this role maker describes a parameter-server job (is_collective=False); use ps_env().")
        return read_worker_env(os.environ)

    def ps_env(self):
        from launcher.ps.env import read_ps_env

        return read_ps_env(os.environ)

    def is_server(self) -> bool:
        return not self.is_collective and self.ps_env().is_server

    def is_worker(self) -> bool:
        return not self.is_server()

    def worker_index(self) -> int:
        return super().worker_index() if self.is_collective else self.ps_env().index

    def worker_num(self) -> int:
        return super().worker_num() if self.is_collective else self.ps_env().trainers_num

    def server_index(self) -> int:
        return self.ps_env().index if self.is_server() else 0

    def server_num(self) -> int:
        return 0 if self.is_collective else len(self.ps_env().servers)

    def get_pserver_endpoints(self) -> list:
        return [] if self.is_collective else list(self.ps_env().servers)


class UserDefinedRoleMaker(RoleMakerBase):
    """This worker is ``current_id`` among ``worker_endpoints`` (rank 0's endpoint hosts the store)."""

    def __init__(self, current_id: int = 0, worker_endpoints: Optional[Sequence[str]] = None):
        self.current_id = current_id
        self.worker_endpoints = list(worker_endpoints or [])
        self._env = env_from_endpoints(current_id, self.worker_endpoints, os.environ.get(ev.SELECTED_GPUS) or None)

    def worker_env(self) -> WorkerEnv:
        return self._env


# Paddle 1.8 spells the collective one this way too.
UserDefinedCollectiveRoleMaker = UserDefinedRoleMaker
