"""The cluster source ``kubeflow``: a PyTorchJob's or TrainJob's pods, from torchrun's PET_* variables. Pure."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

from launcher.plan.clusters.source import (DEFAULT_NODES, Cluster, Request, Source, fail, first_var, index_var,
                                           int_var, var, worker_ports)
from launcher.plan.parsing import DIGITS, node_range

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "kubeflow"

# PyTorchJob (training-operator v1): pods <job>-master-0 and <job>-worker-0..N-2, MASTER_ADDR=<job>-master-0.
_PYTORCHJOB_MASTER = re.compile(r"(?P<job>.+)-master-0(?P<domain>\..+)?")
# TrainJob (Kubeflow Trainer v2, a JobSet): pods <job>-node-0-0..N-1, PET_MASTER_ADDR=<job>-node-0-0.<job>.
_JOBSET_FIRST = re.compile(r"(?P<prefix>.+-[0-9]+)-0(?P<domain>\..+)?")


def _kubeflow_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    """torchrun's PET_* variables (MASTER_ADDR and RANK alone are what every torch worker sees)."""
    return bool(env.get("PET_NNODES", "").strip() or env.get("PET_NODE_RANK", "").strip())


def _kubeflow(req: Request) -> Cluster:
    nodes_var = first_var(req, "PET_NNODES", "WORLD_SIZE")
    rank_var = first_var(req, "PET_NODE_RANK", "RANK")
    nnodes = _nnodes(req, nodes_var)
    rank = index_var(req, rank_var, nnodes, f"{nodes_var}={nnodes}")
    used = (nodes_var, rank_var)
    if nnodes == 1:
        return Cluster(NAME, (DEFAULT_NODES,), 0, worker_ports(req, None, ""), used)
    addr_var = first_var(req, "PET_MASTER_ADDR", "MASTER_ADDR")
    port_var = first_var(req, "PET_MASTER_PORT", "MASTER_PORT")
    hosts = _pod_names(req, addr_var, var(req, addr_var), nnodes)
    port = int_var(req, port_var)
    return Cluster(NAME, hosts, rank, worker_ports(req, port, f"{port_var}={port}"), used + (addr_var, port_var))


def _nnodes(req: Request, name: str) -> int:
    value = var(req, name)
    try:
        nodes = node_range(value)
    except ValueError:
        raise fail(req, f"{name}={value} is not a number of nodes; fix the variable.") from None
    if nodes.elastic:  # "2:2" is an elastic policy with min = max: a fixed number
        raise fail(req, f"{name}={value} is an elastic range of nodes; this launcher runs a fixed number: give the job minReplicas = maxReplicas.")
    return nodes.low


def _pod_names(req: Request, name: str, master: str, count: int) -> tuple:
    """Every pod of the job in rank order, from the first one's predictable name."""
    m = _PYTORCHJOB_MASTER.fullmatch(master)
    if m:
        domain = m.group("domain") or ""
        return (master, *(f"{m.group('job')}-worker-{i}{domain}" for i in range(count - 1)))
    m = _JOBSET_FIRST.fullmatch(master)
    if m:
        domain = m.group("domain") or ""
        return tuple(f"{m.group('prefix')}-{i}{domain}" for i in range(count))
    raise fail(req, f"{name}={master} is not the name of a PyTorchJob's master pod (<job>-master-0) or of a TrainJob's "
                     f"first node (<job>-node-0-0.<job>), so the other nodes' names are unknown; give --cluster_node_ips and --node_ip instead.")


def _kubeflow_devices(env: Mapping[str, str]) -> Mapping[str, object]:
    for name in ("PET_NPROC_PER_NODE", "PET_N_PROC_PER_NODE"):  # the second: training-operator's older spelling
        value = env.get(name, "").strip()
        if DIGITS.fullmatch(value) and int(value) > 0:
            return {"nproc_per_node": int(value)}
    return {}  # unset, or torchrun's "auto", "gpu", "cpu": the launcher's own rule


SOURCE = Source(NAME, "Kubeflow", _kubeflow_found, _kubeflow, "run it in a PyTorchJob or TrainJob pod, or choose another --cluster_env",
                devices=_kubeflow_devices)
