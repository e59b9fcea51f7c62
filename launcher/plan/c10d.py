"""A c10d rendezvous's endpoint: node 0's ``HOST[:PORT]``, where its launcher keeps the job's membership. Pure.

torchrun's ``--rdzv-backend c10d --rdzv-endpoint HOST[:PORT]`` (``[v6]:PORT``): no port is torchrun's 29400;
no endpoint, the first node of a static node list, else loopback (torchrun's localhost). A job of fixed nodes
reads its ``--rdzv-endpoint`` here too (``launcher.cli.torchrun``: node 0's address and rank 0's store port). Paddle's
``--master IP:PORT`` of a range of nodes is node 0's too (``launcher.plan.elastic``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Optional, Tuple

from launcher import addresses
from launcher.errors import LaunchError

if TYPE_CHECKING:
    from launcher.plan.elastic_spec import ElasticSpec

PORT = 29400  # torchrun's port of a --rdzv-endpoint given without one
LOOPBACK = "127.0.0.1"  # torchrun's c10d endpoint when none is given (it says localhost)


def from_torchrun(spec: "ElasticSpec", text: Optional[str], conf: Mapping[str, str], env: Mapping) -> "ElasticSpec":
    """The spec around node 0 at ``--rdzv-endpoint`` (this backend has no --rdzv-conf keys of its own)."""
    host, port = parse_rdzv_endpoint(text, spec.node_hosts)
    return replace(spec, host=host, port=port)


def parse_rdzv_endpoint(text: Optional[str], hosts: tuple = ()) -> Tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT``) of node 0 (``launcher.addresses``); no port: torchrun's 29400; none given: the
    first of ``hosts``, else loopback (torchrun's localhost)."""
    if text is None or not str(text).strip():
        return (hosts[0] if hosts else LOOPBACK), PORT
    try:
        return addresses.split(text, PORT)
    except addresses.NotAnAddress:
        raise LaunchError(f"--rdzv-endpoint {str(text).strip()} is not HOST:PORT; give node 0's address and a port "
                          "such as 10.0.0.1:29400.") from None
