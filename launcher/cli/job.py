"""One launch path for fixed and elastic jobs: probe this machine, plan the request, check the plan, log its notes,
print it, and run it attempt after attempt. The two kinds differ only in the coordinator that is built: a fixed job's
(``launcher.nodes.static``, the attempt driver's default) or an elastic job's (``launcher.nodes.elastic.job``, over the
link to the membership that its backend forms, whose rounds give the nodes and this node's rank).

Bad options exit 2 before anything starts: an elastic job checks them on a trial plan before it joins anyone.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack
from typing import Callable, Optional

from launcher.cli.request import DEFAULT, Request
from launcher.envvars import JOB_ID, JOB_TOKEN
from launcher.errors import LaunchError
from launcher.host import preflight
from launcher.output import reports
from launcher.output.console import console
from launcher.output.messages import log
from launcher.plan.planner import make_plan
from launcher.run import attempts, limits


def run(request: Request, env=os.environ, on_end=None) -> int:
    """Run the request on this node to its end; the launcher's exit code. ``on_end(code, cause)``: told the job's end
    and its root cause (None for a good end)."""
    for name, source in sorted(request.sources.items()):
        if source != DEFAULT:
            log.debug("--%s from %s", name, source if source.startswith("PET_") else f"the {source}")
    host = preflight.probe_host(env, topology=request.options.places_workers)
    finder = preflight.port_finder(host, lambda count: limits.check_limits(count, log_dir=False))
    _check_warm_start(request)
    with ExitStack() as cleanup:
        warm = None
        if request.elastic is None:
            plan, reserved, coordinator = _fixed(request, host, finder, env)
        else:
            plan, reserved, coordinator, warm = _elastic(request, host, finder, env, cleanup)
            if plan is None:  # a standby whose job finished without it
                return 0
        for note in plan.notes:
            log.warning(note)
        if request.print_config:
            console.write(2, (reports.format_plan(plan) + "\n").encode(errors="replace"))
        return attempts.run(plan, tuple(reserved), coordinator=coordinator, warm=warm, on_end=on_end)


def _check_warm_start(request: Request) -> None:
    if not request.options.warm_start:
        return
    if request.elastic is None:
        raise LaunchError("--warm_start starts the workers of an elastic job before it forms: give --nnodes MIN:MAX, "
                          "or leave --warm_start out.")
    if request.options.no_python:
        raise LaunchError("--warm_start runs each worker up to launcher.runtime.elastic.run, a Python call: "
                          "leave --no_python or --warm_start out.")


def _fixed(request: Request, host, finder, env):
    """A fixed job's plan, the ports it holds, and its coordinator (None: the attempt driver's default, one node's);
    with several nodes, one that node 0 judges each node's health checkup with."""
    opts = request.options
    host = _with_gathered_nodes(opts, host, env)
    try:
        plan = make_plan(opts, env, host, finder)
        _check_nodes(request.nodes_expected, len(plan.node_ips), plan.cluster or "--cluster_node_ips")
        preflight.check(plan, opts, host)
        if plan.control is None:  # one node, no other launcher to admit it: its own checks, before anything starts
            _check_health(plan, opts, host)
    except LaunchError:
        for s in finder.held:
            s.close()
        raise
    if plan.control is None:
        return plan, finder.held or preflight.reserve_store_port(plan), None
    from launcher.host import health
    from launcher.nodes.static import job as static_job

    mine = health.checkup(plan.health, health.subject_of(plan, opts, host))  # node 0 judges it before any worker starts
    return plan, finder.held or preflight.reserve_store_port(plan), lambda p: static_job.for_plan(p, mine)


def _check_health(plan, opts, host) -> None:
    """This node's health checks (launcher.host.health): a failure refuses the job in one sentence; a check that
    cannot run here is said once."""
    from launcher.host import health

    for skipped in health.check_alone(plan.health, health.subject_of(plan, opts, host), f"this node ({plan.node_ip})"):
        log.info("health check %s skipped: %s", skipped.check, skipped.reason)


def _elastic(request: Request, host, finder, env, cleanup: ExitStack):
    """An elastic job's first round's plan, the ports it holds, the coordinator of its rounds, and its workers started
    warm (--warm_start; else None); (None, (), None, None) for a standby whose job finished without it."""
    from launcher.nodes.elastic import backends, link as elastic_link
    from launcher.nodes.elastic.job import ElasticJob

    spec = request.elastic

    def plan_for(opts, check, round_=None):
        plan = make_plan(opts, env, host, finder)
        check(plan, opts, host)
        return dataclasses.replace(plan, elastic_round=round_.text if round_ is not None else None)

    trial = plan_for(request.options, lambda plan, opts, _: preflight.check_script(plan, opts))
    if trial.parameter_server:
        raise LaunchError("--nnodes MIN:MAX runs a collective job; parameter-server mode (--server_num, --servers) "
                          "has a fixed set of nodes: give one --nnodes.")
    request = dataclasses.replace(request, options=dataclasses.replace(
        request.options, agent_store=_agent_store(request, spec, trial)))
    job_id = request.options.job_id or env.get(JOB_ID) or f"elastic-{spec.host}:{spec.port}"
    warm = _start_warm(request, trial, spec, cleanup)
    link = backends.form(spec, job_id, len(trial.workers), env.get(JOB_TOKEN) or None,
                         health=_health(trial, request.options, host))
    cleanup.callback(link.close)
    if link.first is None:
        return None, (), None, None

    def round_plan(round_, check: Callable = lambda *_: None):
        place = elastic_link.place_in(round_, link.node_id)
        workers = tuple(seat.workers for seat in elastic_link.members(round_))
        return plan_for(request.for_round(place.hosts, place.node_rank, workers), check, round_)

    plan = round_plan(link.first, preflight.check)
    reserved = preflight.reserve_store_port(plan)
    link.serve()
    return plan, reserved, lambda p: ElasticJob(p, link, round_plan, spec.reform_wait, spec.min_nodes), warm


def _health(plan, opts, host):
    """This launcher's health checks for its link (``launcher.nodes.elastic.link.Health``): its checkup made afresh
    each time. Its workers' ports are not among them: they are a round's (its node rank's), checked as each round's
    plan is (``preflight``), and another launcher of the job on this host may hold the first round's meanwhile."""
    from launcher.host import health
    from launcher.nodes.elastic.link import Health
    from launcher.plan.health import PORTS

    settings = dataclasses.replace(plan.health, off=plan.health.off | {PORTS})
    subject = health.subject_of(plan, opts, host)
    return Health(settings, lambda _: health.checkup(settings, subject), lambda: health.facts_of(subject))


def _start_warm(request: Request, trial, spec, cleanup: ExitStack):
    """--warm_start: this node's workers started, and waited for (up to join_timeout) until each waits in
    launcher.runtime.elastic.run; those never woken are ended with the launcher. None without the option."""
    if not request.options.warm_start:
        return None
    from launcher.run.starter import SubprocessStarter
    from launcher.run.warm import WarmWorkers

    warm = WarmWorkers(SubprocessStarter())
    cleanup.callback(warm.close)
    warm.start(trial)
    warm.await_ready(spec.rendezvous.join_timeout)
    return warm


def _agent_store(request: Request, spec, trial) -> str:
    """Decided once, as for a job of several nodes, so that every round's workers find their store where the first
    round's did; with no node 0 (a membership in etcd), rank 0 hosts it: each round's node 0 may be another launcher."""
    choice = request.options.agent_store
    if not spec.backend_row.has_node_0:
        if choice == "on":
            raise LaunchError(f"--agent_store on cannot be honoured with an {spec.backend} rendezvous: each round's node "
                              "0 may be another launcher, so rank 0 hosts the store; give --agent_store off or auto.")
        return "off"
    if choice == "auto":
        return "on" if trial.agent_store is not None else "off"
    return choice


def _with_gathered_nodes(opts, host, env):
    """An MPI job of several ranks: every node's address, gathered from the other ranks (launcher.nodes.static.gather)."""
    from launcher.plan.clusters.registry import gathering
    from launcher.plan.clusters.source import DEFAULT_NODES
    from launcher.nodes.static import gather

    spec = gathering(opts, env)
    if spec is None:
        return host
    address = opts.node_ip if opts.node_ip != DEFAULT_NODES else gather.own_address(spec)
    preflight.check_node_ip(address, host)
    nodes = gather.gather(spec, address, opts.join_timeout, env.get(JOB_TOKEN) or None)
    return dataclasses.replace(host, gathered_nodes=nodes)


def _check_nodes(expected: Optional[int], found: int, where: str) -> None:
    if expected is not None and expected != found:
        raise LaunchError(f"--nnodes {expected} disagrees with the {found} node(s) of {where}; give every node's "
                          f"address with --ips (or --cluster_node_ips), or make --nnodes match.")
