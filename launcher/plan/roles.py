"""The kinds of process a plan starts, one row each: how they are named, logged, and what ends the job. Pure.

``WorkerSpec.role`` holds a role's ``name``; a new role is one row of ``ROLES`` (and the plan that starts it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Role:
    name: str  # WorkerSpec.role: "" for a collective worker
    label: str  # how messages name one, ``{}`` its number: "rank {}", "server {}"
    log_name: str  # its log file in --log_dir, ``{}`` its number: "workerlog.{}"
    ends_job: bool  # every process of this role exiting 0 ends the job (the others, then, are stopped)
    by_rank: bool = False  # numbered by its global rank (a plain rank), not by its id within the role
    paddle_role: Optional[str] = None  # TRAINING_ROLE and PADDLE_ROLE of parameter-server mode

    def label_of(self, number: int) -> str:
        return self.label.format(number)

    def log_name_of(self, number: int) -> str:
        return self.log_name.format(number)


WORKER = Role("", "rank {}", "workerlog.{}", ends_job=True, by_rank=True)
TRAINER = Role("trainer", "trainer {}", "workerlog.{}", ends_job=True, paddle_role="TRAINER")
SERVER = Role("server", "server {}", "serverlog.{}", ends_job=False, paddle_role="PSERVER")  # stopped after the trainers

ROLES = {role.name: role for role in (WORKER, TRAINER, SERVER)}
PS_ROLES = (SERVER, TRAINER)  # a parameter-server job's, in the order its plan table counts them


def role_named(name: str) -> Role:
    return ROLES[name]
