"""Where a worker learns its place in the job (Paddle's role makers, collective mode only)."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from launcher import envvars as ev
from launcher.runtime.environment import WorkerEnv, env_from_endpoints, read_worker_env

NO_PARAMETER_SERVER = ("is_collective=False asks for parameter-server training, which this library does not do: "
          "it runs collective (all-reduce) data-parallel training on PyTorch only.")


class RoleMakerBase:
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
    """Everything from the launcher's variables; a world of one when there are none."""

    def __init__(self, is_collective: bool = True):
        if not is_collective:
            raise ValueError(NO_PARAMETER_SERVER)
        self.is_collective = True

    def worker_env(self) -> WorkerEnv:
        return read_worker_env(os.environ)


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
