"""The cluster sources by name, in the order ``--cluster_env auto`` tries them, and choosing and resolving one. Pure.

A new source is a module of this folder defining ``SOURCE`` (a ``source.Source``) and one line of ``SOURCES`` below.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Optional

from launcher.errors import LaunchError
from launcher.plan.clusters import command_line, kubeflow, lsf, mpi, paddlecloud, slurm, torchrun, volcano
from launcher.plan.clusters.source import AUTO, DEFAULT_NODES, Cluster, GatherSpec, Request, short_list

SOURCES = {source.name: source for source in (
    command_line.SOURCE,
    torchrun.SOURCE,
    paddlecloud.SOURCE,
    kubeflow.SOURCE,
    slurm.SOURCE,
    volcano.SOURCE,
    mpi.SOURCE,
    lsf.SOURCE,
)}
FILE_VARIABLES = tuple(name for source in SOURCES.values() for name in source.files)  # read by preflight


def names() -> tuple:
    """--cluster_env's choices."""
    return (AUTO, *SOURCES)


def choose(opts: LaunchOptions, env: Mapping[str, str]):
    """(source name, how it was chosen): --use_paddlecloud, --cluster_env NAME, or the first found."""
    wanted = opts.cluster_env or AUTO
    if wanted != AUTO and wanted not in SOURCES:
        raise LaunchError(f"--cluster_env {wanted} is not a cluster source; choose one of {', '.join(names())}.")
    if opts.use_paddlecloud:
        if wanted not in (AUTO, paddlecloud.NAME):
            raise LaunchError(f"--use_paddlecloud and --cluster_env {wanted} name two different cluster sources; give only one of them.")
        return paddlecloud.NAME, "--use_paddlecloud"
    if wanted != AUTO:
        return wanted, f"--cluster_env {wanted}"
    for name, source in SOURCES.items():
        if source.detect(env, opts):
            return name, f"--cluster_env auto (found {source.label})"
    return command_line.NAME, "--cluster_env auto"


def scheduler_found(env: Mapping[str, str]) -> bool:
    """Whether a scheduler's variables say which node this is (a source other than the command line's and
    torchrun's options is found in ``env``)."""
    return any(source.detect(env, None) for name, source in SOURCES.items() if name not in (command_line.NAME, torchrun.NAME))


def device_defaults(name: str, env: Mapping[str, str]) -> Mapping[str, object]:
    """Option values the scheduler gives (selected_gpus, nproc_per_node), for options not given."""
    return SOURCES[name].devices(env)


def request(name: str, env: Mapping[str, str], opts: LaunchOptions, host: Optional[HostFacts], nper: int,
            chosen_by: str) -> Request:
    return Request(name, env, opts, host, nper, chosen_by, SOURCES[name].fix)


def resolve(name: str, env: Mapping[str, str], opts: LaunchOptions, host: HostFacts, nper: int, chosen_by: str) -> Cluster:
    """The nodes of source ``name``, with the notes of where they replace the options (or the batch shell's)."""
    req = request(name, env, opts, host, nper, chosen_by)
    cluster = _with_override_notes(req, SOURCES[name].resolve(req))
    if name == command_line.NAME and chosen_by == "--cluster_env auto":
        cluster = replace(cluster, notes=cluster.notes + slurm.sbatch_note(env))
    return cluster


def _with_override_notes(req: Request, cluster: Cluster) -> Cluster:
    """A scheduler's nodes replace --cluster_node_ips and --node_ip: say so where they differ."""
    if not SOURCES[cluster.source].replaces_cli_nodes:
        return cluster
    notes = list(cluster.notes)
    label = SOURCES[cluster.source].label
    nodes = ",".join(cluster.node_ips)
    if req.opts.cluster_node_ips not in (DEFAULT_NODES, nodes):
        notes.append(f"{label}: using the nodes {short_list(cluster.node_ips)} instead of --cluster_node_ips {req.opts.cluster_node_ips}.")
    if req.opts.node_ip not in (DEFAULT_NODES, cluster.node_ips[cluster.node_rank]):
        notes.append(f"{label}: this is node {cluster.node_rank} ({cluster.node_ips[cluster.node_rank]}), not --node_ip {req.opts.node_ip}.")
    return replace(cluster, notes=tuple(notes))


def gathering(opts: LaunchOptions, env: Mapping[str, str]) -> Optional[GatherSpec]:
    """What a job of several nodes must gather before planning (torchrun's, an MPI job's node list), else None."""
    name, chosen_by = choose(opts, env)
    if opts.parameter_server:
        return None
    return SOURCES[name].gathering(request(name, env, opts, None, 1, chosen_by))

if TYPE_CHECKING:
    from launcher.plan.model import HostFacts, LaunchOptions
