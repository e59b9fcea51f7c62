"""The cluster source ``mpi``: one launcher per node under mpirun, the node list gathered at MASTER_ADDR. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from launcher.plan.clusters.source import (DEFAULT_NODES, MULTI_NODE_PORT, MULTI_NODE_START, Cluster, GatherSpec, Request, Source,
                                           fail, first_var, index_var, int_var, short_list, well_formed_hosts, worker_ports)
from launcher.plan.parsing import is_valid_host

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "mpi"

_MPI_SIZES = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), ("PMI_SIZE", "PMI_RANK"), ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))


def _mpi_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    return any(env.get(size, "").strip() for size, _ in _MPI_SIZES)


ONE_PER_NODE = "run mpirun with --map-by ppr:1:node (the launcher starts the workers of its node itself)"
GATHER_PORT = MULTI_NODE_PORT - 1  # the gathering port without --control_port, MASTER_PORT, --started_port


def _mpi_world(req: Request):
    """(size variable, rank variable, size, rank), one launcher per node."""
    size_var = first_var(req, *(size for size, _ in _MPI_SIZES))
    rank_var = dict(_MPI_SIZES)[size_var]
    size = int_var(req, size_var)
    rank = index_var(req, rank_var, max(size, 1), f"{size_var}={size}")
    local = int_var(req, "OMPI_COMM_WORLD_LOCAL_SIZE", optional=True)
    if local is not None and local > 1:
        raise fail(req, f"OMPI_COMM_WORLD_LOCAL_SIZE={local} starts several launchers per node; {ONE_PER_NODE}.")
    return size_var, rank_var, size, rank


def _gather_port(req: Request):
    """(port, how messages name it): --control_port, MASTER_PORT, --started_port - 1, else 6069."""
    opts = req.opts
    if opts.control_port is not None:
        return opts.control_port, f"--control_port {opts.control_port}"
    port = int_var(req, "MASTER_PORT", optional=True)
    if port is not None:
        given_as = f"MASTER_PORT={port}"
    elif opts.started_port is not None:
        port, given_as = opts.started_port - 1, f"--started_port {opts.started_port} minus one"
    else:
        port, given_as = GATHER_PORT, f"the default gathering port {GATHER_PORT}"
    if not 1 <= port <= 65535:
        raise fail(req, f"{given_as} is not a port (1-65535) to gather the node list on; give one with --control_port.")
    return port, given_as


def _mpi_gathering(req: Request) -> Optional[GatherSpec]:
    """What an MPI job of several ranks must gather before planning, else None."""
    _, _, size, rank = _mpi_world(req)
    if size <= 1:
        return None
    return GatherSpec(rank, size, _mpi_master(req, size), *_gather_port(req))


def _mpi_master(req: Request, size: int) -> str:
    """Node 0's address, where the other ranks gather: MASTER_ADDR, which mpirun -x passes on."""
    master = req.env.get("MASTER_ADDR", "").strip()
    if not master:
        raise fail(req, f"{size} MPI ranks need node 0's address in MASTER_ADDR to gather the node list; "
                         f"run mpirun -x MASTER_ADDR=<address of the first host>.")
    if not is_valid_host(master):
        raise fail(req, f"MASTER_ADDR={master} is not an address or host name; run mpirun -x MASTER_ADDR=<address of the first host>.")
    return master


def _refuse_shared_hosts(req: Request, nodes: tuple) -> None:
    """One launcher per node, as OMPI_COMM_WORLD_LOCAL_SIZE says where it is set: two ranks at one address are two
    launchers of one host, each of which would take every GPU of it."""
    for rank, address in enumerate(nodes):
        first = nodes.index(address)
        if first != rank:
            raise fail(req, f"the gathered node list={short_list(nodes)} lists {address} twice: MPI ranks {first} and {rank} "
                            f"both run there, which starts several launchers per node; {ONE_PER_NODE}.")


def _mpi(req: Request) -> Cluster:
    size_var, rank_var, size, rank = _mpi_world(req)
    if size <= 1:
        return Cluster(NAME, (DEFAULT_NODES,), rank, worker_ports(req, None, ""), (size_var, rank_var))
    _mpi_master(req, size)
    nodes = tuple(req.host.gathered_nodes)
    if len(nodes) != size:
        raise fail(req, f"{size_var}={size}, but {len(nodes)} nodes were gathered; start every rank with the same mpirun.")
    nodes = well_formed_hosts(req, nodes, "the gathered node list", ",".join(nodes))
    _refuse_shared_hosts(req, nodes)
    port, _ = _gather_port(req)
    ports = worker_ports(req, MULTI_NODE_PORT, MULTI_NODE_START)
    return Cluster(NAME, nodes, rank, ports, (size_var, rank_var, "MASTER_ADDR"), detail=f"node list gathered over port {port}")


SOURCE = Source(NAME, "MPI", _mpi_found, _mpi, "start the launcher with mpirun, or choose another --cluster_env",
                gathering=_mpi_gathering)
