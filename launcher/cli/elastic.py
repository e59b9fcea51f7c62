"""``--nnodes MIN:MAX``: an elastic job, from the command line to its end on this node.

The options are checked first, on a trial plan, before this launcher joins anyone: bad input exits 2
with nothing started. Then this launcher joins the membership (``launcher.nodes.elastic.backends``:
node 0 is the launcher that can listen on the endpoint) and runs each round it is a member of as an
attempt, with the round's plan: the round's hosts by node rank as the node list, this node's rank
among them (``launcher.nodes.elastic.job``). ``auto`` for the agent store is decided once, as for a
job of several nodes, so that every round's workers find their store where the first round's did.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from launcher.envvars import JOB_ID, JOB_TOKEN
from launcher.errors import LaunchError
from launcher.plan.elastic import ElasticSpec

ToOptions = Callable[[dict], object]  # option values -> LaunchOptions


def run(values: dict, spec: ElasticSpec, to_options: ToOptions) -> int:
    from launcher.host import preflight
    from launcher.nodes.elastic import backends, link as elastic_link
    from launcher.nodes.elastic.job import ElasticJob
    from launcher.plan.planner import make_plan
    from launcher.run import attempts, limits

    host = preflight.probe_host(os.environ)
    finder = preflight.port_finder(host, lambda count: limits.check_limits(count, log_dir=False))

    def plan_for(hosts: tuple, node_rank: int, given: dict, check=preflight.check, round_=None):
        round_values = {**given, "nnodes": len(hosts), "node_rank": node_rank, "cluster_node_ips": ",".join(hosts),
                        "node_ip": hosts[node_rank]}
        opts = to_options(round_values)
        plan = make_plan(opts, os.environ, host, finder)
        check(plan, opts, host)
        return dataclasses.replace(plan, elastic_round=round_.text if round_ is not None else None)

    # bad options: exit 2 before joining anyone (this node's address and ports are checked in its first round)
    trial = plan_for((spec.host, spec.host), 0, values, lambda plan, opts, _: preflight.check_script(plan, opts))
    if trial.parameter_server:
        raise LaunchError("--nnodes MIN:MAX runs a collective job; parameter-server mode (--server_num, --servers) "
                          "has a fixed set of nodes: give one --nnodes.")
    if spec.backend == "etcd":
        values = {**values, "agent_store": _etcd_store(values.get("agent_store"))}
    elif values.get("agent_store") == "auto":
        values = {**values, "agent_store": "on" if trial.agent_store is not None else "off"}
    job_id = values.get("job_id") or os.environ.get(JOB_ID) or f"elastic-{spec.host}:{spec.port}"
    link = backends.form(spec, job_id, len(trial.workers), os.environ.get(JOB_TOKEN) or None)
    if link.first is None:  # a standby whose job finished without it
        link.close()
        return 0
    try:
        def replan(round_):  # a later round: this launcher holds some of its ports (rank 0's store)
            place = elastic_link.place_in(round_, link.node_id)
            return plan_for(place.hosts, place.node_rank, values, lambda *_: None, round_)

        place = elastic_link.place_in(link.first, link.node_id)
        plan = plan_for(place.hosts, place.node_rank, values, round_=link.first)
        reserved = preflight.reserve_store_port(plan)
        link.serve()
        return attempts.run(plan, tuple(reserved), coordinator=lambda p: ElasticJob(p, link, replan, spec.reform_wait))
    finally:
        link.close()


def _etcd_store(choice) -> str:
    """With the membership in etcd, rank 0 hosts the workers' store: each round's node 0 may be another launcher."""
    if choice == "on":
        raise LaunchError("--agent_store on cannot be honoured with an etcd rendezvous: each round's node 0 may be "
                          "another launcher, so rank 0 hosts the store; give --agent_store off or auto.")
    return "off"
