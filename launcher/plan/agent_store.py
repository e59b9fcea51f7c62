"""Whether the job's rendezvous store is served by node 0's launcher (as torchrun's agent does), not by rank 0.

With the agent's store every rank, rank 0 included, connects to the store as a client
(``TORCHELASTIC_USE_AGENT_STORE=True``), so a rank 0 that starts late finds the others already
connected instead of waiting out their back-off. That helps only where ranks start apart: across
nodes. On one node every rank starts together, so ``auto`` leaves the store to rank 0 there.
Node 0's launcher serves the store itself (``launcher.run.tcpstore``), speaking torch's TCPStore
protocol as torch's clients of ``OLDEST_TORCH`` and later send it. Pure: options and host facts
in, a decision out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from launcher.errors import LaunchError

CHOICES = ("auto", "on", "off")
# The TCPStore clients of torch 2.5 and later open with VALIDATE, then PING, then one query type
# byte per request, numbered as in 2.13 (later versions only appended query types). Verified
# query by query against the client of torch 2.13 (tests/integration/test_store_torch_client.py).
OLDEST_TORCH = (2, 5)


@dataclass(frozen=True)
class StoreSpec:
    """The rendezvous store node 0's launcher serves, on ``address:port`` (MASTER_ADDR, MASTER_PORT)."""

    address: str
    port: int


def uses_agent_store(choice: str, nodes: int, no_python: bool, python: str, host_python: str,
                     importable, torch_version: Optional[str] = None) -> bool:
    """``--agent_store``: on, off, or auto: on for a job of more than one node whose workers run the
    launcher's own interpreter, when that finds torch (of OLDEST_TORCH or later) and not paddle
    (Paddle's rank 0 hosts a store of its own on MASTER_PORT; an interpreter the launcher cannot
    look into is left as it was)."""
    if choice not in CHOICES:
        raise LaunchError(f"--agent_store {choice!r} is not one of {', '.join(CHOICES)}; give auto, on or off.")
    own_python = python == host_python and not no_python
    if choice == "on":
        if own_python and "torch" not in importable:
            raise LaunchError(f"--agent_store on, but the workers' Python ({python}) cannot import torch, whose "
                              "clients use the store; install torch there or give --agent_store off.")
        if own_python and too_old(torch_version):
            raise LaunchError(f"--agent_store on, but the workers' torch {torch_version} is older than "
                              f"{'.'.join(map(str, OLDEST_TORCH))}, whose store protocol the launcher serves; "
                              "give --agent_store off.")
        return True
    if choice == "off" or nodes < 2 or not own_python:
        return False
    return "torch" in importable and "paddle" not in importable and not too_old(torch_version)


def too_old(version: Optional[str]) -> bool:
    """Whether a torch version (``2.13.0+cpu``) is older than OLDEST_TORCH; an unreadable one is not."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return found is not None and (int(found.group(1)), int(found.group(2))) < OLDEST_TORCH


def served_store(used: bool, node_rank: int, address: str, port: int) -> Optional[StoreSpec]:
    """The store this node's launcher serves: node 0's, in a job that uses the agent's store, else None."""
    return StoreSpec(address, port) if used and node_rank == 0 else None
