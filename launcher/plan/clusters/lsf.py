"""The cluster source ``lsf``: a bsub job's hosts, from its rank file or LSB_MCPU_HOSTS, one launcher per host. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from launcher.plan.clusters.source import (Cluster, Request, Source, checked_hosts, fail, int_var, job_port,
                                           own_index, var, worker_ports)
from launcher.plan.parsing import DIGITS

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "lsf"


def _lsf_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    return bool(env.get("LSB_JOBID", "").strip())


def _lsf(req: Request) -> Cluster:
    job = int_var(req, "LSB_JOBID")
    slots, list_var = _lsf_slots(req)
    hosts = checked_hosts(req, [h for h, _ in slots], list_var, ",".join(h for h, _ in slots))
    notes = ()
    if _is_launch_node(slots):
        notes = (f"LSF: leaving out {hosts[0]}, the job's launch node (one slot, while every other host has more).",)
        hosts = hosts[1:]
    rank = 0 if len(hosts) == 1 else own_index(req, hosts, f"LSF job {job}")
    port = job_port(job)
    ports = worker_ports(req, port, f"the start port {port} derived from LSB_JOBID={job}")
    return Cluster(NAME, hosts, rank, ports, (list_var, "LSB_JOBID"), notes, job_id=f"lsf-{job}")


def _lsf_slots(req: Request):
    """[(host, slots)] in order, from the rank file (one line per slot) or LSB_MCPU_HOSTS (host n host n)."""
    files = dict(req.host.env_files)
    path = req.env.get("LSB_DJOB_RANKFILE", "").strip()
    if path and path in files:
        lines = [line.strip() for line in files[path].splitlines() if line.strip()]
        if not lines:
            raise fail(req, f"LSB_DJOB_RANKFILE={path} lists no host; fix the file, or unset the variable to use LSB_MCPU_HOSTS.")
        order = list(dict.fromkeys(lines))
        return [(h, lines.count(h)) for h in order], "LSB_DJOB_RANKFILE"
    if path:
        raise fail(req, f"LSB_DJOB_RANKFILE={path} cannot be read; check the file, or unset the variable to use LSB_MCPU_HOSTS.")
    text = var(req, "LSB_MCPU_HOSTS")
    words = text.split()
    if len(words) % 2 or not all(DIGITS.fullmatch(n) for n in words[1::2]):
        raise fail(req, f"LSB_MCPU_HOSTS={text} is not pairs of a host and its slots (host1 4 host2 4); fix the variable.")
    return [(h, int(n)) for h, n in zip(words[::2], words[1::2])], "LSB_MCPU_HOSTS"


def _is_launch_node(slots: list) -> bool:
    """CSM/jsrun systems list the launch node first, with one slot; it runs no worker."""
    return len(slots) > 1 and slots[0][1] == 1 and all(n > 1 for _, n in slots[1:])


SOURCE = Source(NAME, "LSF", _lsf_found, _lsf, "run it in an LSF job (bsub), or choose another --cluster_env",
                files=("LSB_DJOB_RANKFILE",))
