"""Whether the job's rendezvous store is hosted by node 0's launcher (as torchrun's agent does), not by rank 0.

With the agent's store every rank, rank 0 included, connects to the store as a client
(``TORCHELASTIC_USE_AGENT_STORE=True``), so a rank 0 that starts late finds the others already
connected instead of waiting out their back-off. Pure: options and host facts in, a decision out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.errors import LaunchError

CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class StoreHostSpec:
    """The store host node 0's launcher starts for each attempt: ``python`` hosts a TCPStore on ``address:port``."""

    python: str
    address: str
    port: int


def uses_agent_store(choice: str, no_python: bool, python: str, host_python: str, importable) -> bool:
    """``--agent_store``: on, off, or auto: on for a Python worker run by the launcher's own
    interpreter when that finds torch and not paddle (Paddle's rank 0 hosts a store of its own on
    MASTER_PORT; an interpreter the launcher cannot look into is left as it was)."""
    if choice not in CHOICES:
        raise LaunchError(f"--agent_store {choice!r} is not one of {', '.join(CHOICES)}; give auto, on or off.")
    if choice == "on":
        if python == host_python and "torch" not in importable:
            raise LaunchError(f"--agent_store on, but the workers' Python ({python}) cannot import torch, which "
                              "hosts the store; install torch there or give --agent_store off.")
        return True
    if choice == "off" or no_python or python != host_python:
        return False
    return "torch" in importable and "paddle" not in importable


def store_host(used: bool, node_rank: int, python: str, address: str, port: int) -> Optional[StoreHostSpec]:
    """The store host of this node: node 0 of a job that uses the agent's store, else None."""
    return StoreHostSpec(python, address, port) if used and node_rank == 0 else None
