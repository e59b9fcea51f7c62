"""The cluster source ``slurm``: an srun step with one task per node, its host list expanded. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from launcher.plan import hostlist
from launcher.plan.clusters.source import (Cluster, Request, Source, checked_hosts, fail, first_var, gpu_devices,
                                           index_var, int_var, job_port, var, worker_ports)

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "slurm"


def sbatch_note(env: Mapping[str, str]) -> tuple:
    """A SLURM job of several nodes whose batch shell runs the launcher itself, not under srun."""
    nodes = env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "")).strip()
    if env.get("SLURM_JOB_ID") and not env.get("SLURM_STEP_ID") and nodes.isdigit() and int(nodes) > 1:
        return (f"SLURM job {env['SLURM_JOB_ID']} has {nodes} nodes, but the launcher runs in its batch shell, "
                f"not in an srun step: only this node is used; start it with srun --ntasks-per-node=1 to use every node.",)
    return ()


def _slurm_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    """Inside an srun step; a batch shell (sbatch, salloc) is not a launch across nodes."""
    return bool(env.get("SLURM_STEP_ID", "").strip() and env.get("SLURM_NODEID", "").strip())


def _slurm(req: Request) -> Cluster:
    var(req, "SLURM_STEP_ID")
    _refuse_several_tasks_per_node(req)
    list_var = first_var(req, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    text = var(req, list_var)
    try:
        hosts = checked_hosts(req, hostlist.expand(text), list_var, text)
    except hostlist.HostListError as e:
        raise fail(req, f"{list_var}={text} is not a Slurm host list ({e}); fix the variable.") from None
    count_var = "SLURM_STEP_NUM_NODES" if req.env.get("SLURM_STEP_NUM_NODES", "").strip() else "SLURM_NNODES"
    count = int_var(req, count_var, optional=True)
    if count is not None and count != len(hosts):
        raise fail(req, f"{count_var}={count} disagrees with {list_var}={text} ({len(hosts)} nodes); fix the job's variables.")
    rank = index_var(req, "SLURM_NODEID", len(hosts), list_var)
    job = int_var(req, "SLURM_JOB_ID")
    port = job_port(job)
    used = (list_var, "SLURM_NODEID", "SLURM_JOB_ID")
    used += tuple(v for v in ("SLURM_STEP_GPUS",) if gpu_devices(v)(req.env))
    ports = worker_ports(req, port, f"the start port {port} derived from SLURM_JOB_ID={job}")
    return Cluster(NAME, hosts, rank, ports, used, job_id=f"slurm-{job}.{req.env['SLURM_STEP_ID'].strip()}")


def _refuse_several_tasks_per_node(req: Request) -> None:
    """One launcher per node: it starts every worker of its node itself."""
    fix = "run srun with --ntasks-per-node=1 (the launcher starts the workers of its node itself)."
    tasks = int_var(req, "SLURM_STEP_NUM_TASKS", optional=True)
    nodes = int_var(req, "SLURM_STEP_NUM_NODES", optional=True)
    if tasks is not None and nodes is not None:
        if tasks > nodes:
            raise fail(req, f"SLURM_STEP_NUM_TASKS={tasks} on SLURM_STEP_NUM_NODES={nodes} starts several launchers per node; {fix}")
        return
    per_node = int_var(req, "SLURM_NTASKS_PER_NODE", optional=True)
    if per_node is not None and per_node > 1:
        raise fail(req, f"SLURM_NTASKS_PER_NODE={per_node} starts several launchers per node; {fix}")


SOURCE = Source(NAME, "SLURM", _slurm_found, _slurm, "start the launcher with srun --ntasks-per-node=1, or choose another --cluster_env",
                devices=gpu_devices("SLURM_STEP_GPUS"))
