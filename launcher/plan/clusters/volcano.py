"""The cluster source ``volcano``: the hosts of every task (the svc plugin), this pod's index (the env plugin). Pure."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

from launcher.plan.clusters.source import (MULTI_NODE_PORT, MULTI_NODE_START, Cluster, Request, Source, checked_hosts, fail, first_var,
                                           index_var, int_var, own_index, var, worker_ports)

if TYPE_CHECKING:  # annotations only
    from launcher.plan.model import LaunchOptions


NAME = "volcano"

_VOLCANO_HOSTS = re.compile(r"VC_(?P<task>[A-Z0-9_]+)_HOSTS")
_FIRST_TASKS = ("MASTER", "CHIEF")  # their pods come first, as node 0


def _volcano_tasks(env: Mapping[str, str]) -> list:
    """The task names of the job, as in VC_<TASK>_HOSTS: master/chief first, then by name."""
    tasks = [m.group("task") for m in map(_VOLCANO_HOSTS.fullmatch, env) if m and env[m.group(0)].strip()]
    return sorted(tasks, key=lambda t: (t not in _FIRST_TASKS, t))


def _volcano_found(env: Mapping[str, str], opts: LaunchOptions) -> bool:
    index = env.get("VC_TASK_INDEX", "").strip() or env.get("VK_TASK_INDEX", "").strip()
    return bool(index and _volcano_tasks(env))


def _volcano(req: Request) -> Cluster:
    index_name = first_var(req, "VC_TASK_INDEX", "VK_TASK_INDEX")
    tasks = _volcano_tasks(req.env)
    if not tasks:
        var(req, "VC_<TASK>_HOSTS")
    offsets, hosts, used = {}, [], [index_name]
    for task in tasks:
        name = f"VC_{task}_HOSTS"
        text = req.env[name].strip()
        listed = [h.strip() for h in text.split(",")]
        count = int_var(req, f"VC_{task}_NUM", optional=True)
        if count is not None and count != len(listed):
            raise fail(req, f"VC_{task}_NUM={count} disagrees with {name}={text} ({len(listed)} hosts); fix the job's variables.")
        offsets[task] = (len(hosts), len(listed), name)
        hosts += listed
        used.append(name)
    hosts = checked_hosts(req, hosts, "+".join(f"VC_{t}_HOSTS" for t in tasks), ",".join(hosts))
    task = tasks[0] if len(tasks) == 1 else _own_task(req, hosts, offsets)
    start, count, name = offsets[task]
    index = index_var(req, index_name, count, name)
    port = int_var(req, "MASTER_PORT", optional=True)
    given_as = f"MASTER_PORT={port}" if port is not None else MULTI_NODE_START
    start_port = port if port is not None else MULTI_NODE_PORT if len(hosts) > 1 else None
    return Cluster(NAME, hosts, start + index, worker_ports(req, start_port, given_as), tuple(used))


def _own_task(req: Request, hosts: tuple, offsets: dict) -> str:
    """Several tasks: this pod's task is the one whose host list holds this machine's name."""
    mine = own_index(req, hosts, "the Volcano job")
    return next(t for t, (start, count, _) in offsets.items() if start <= mine < start + count)


SOURCE = Source(NAME, "Volcano", _volcano_found, _volcano, "run it in a Volcano job with the svc and env plugins, or choose another --cluster_env")
