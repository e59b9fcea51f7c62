"""The coordinator of a plan, built with its real control channel (node 0's hub, the other
nodes' spoke) and the monotonic clock: the one place that wires ``coordinator`` to sockets."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from launcher.errors import LaunchError
from launcher.nodes.static.coordinator import Leader, Solo
from launcher.nodes.static.follower import Follower
from launcher.nodes.static.hub import Hub
from launcher.nodes.transport.messages import Identity
from launcher.nodes.static.spoke import Spoke
from launcher.plan import admission
from launcher.plan.health import Checkup
from launcher.plan.model import Plan


def identity(plan: Plan) -> Identity:
    """What the other nodes' launchers must share with this one to be parts of its job."""
    return Identity(plan.control.job_id, tuple(plan.node_ips), tuple(plan.job_ports),
                    " ".join(plan.workers[0].cmd[1:]))


def open_hub(plan: Plan, mine: Optional[Checkup] = None) -> Hub:
    """Node 0's hub, which judges each node's checkup against node 0's facts (``mine``; None: none judged) as its
    hello comes."""
    spec = plan.control

    def judge(node: int, offered) -> admission.Verdict:
        return admission.judge(f"node {node} ({plan.node_ips[node]})", offered, mine.facts, time.time(), plan.health)

    try:
        return Hub(identity(plan), plan.node_ip, spec.port, spec.heartbeat_timeout, spec.join_timeout, spec.token,
                   judge=judge if mine is not None else None)
    except OSError as e:
        raise LaunchError(f"cannot listen on the control port {spec.port} of node 0 ({e.strerror}); "
                          f"free it or choose another --control_port (the same on every node).") from None


def open_spoke(plan: Plan, mine: Optional[Checkup] = None) -> Spoke:
    """Connects only when ticked: opening it opens no socket yet. Its hellos carry ``mine`` (this node's checkup),
    their clock read as each is sent."""
    spec = plan.control
    return Spoke(identity(plan), plan.node_rank, plan.node_ips[0], spec.port, spec.heartbeat_timeout,
                 spec.join_timeout, spec.token, checkup=fresh(mine) if mine is not None else None)


def fresh(mine: Checkup, clock: Callable[[], float] = time.time) -> Callable[[], dict]:
    """A checkup for a hello, off the wire's side: the checks' findings as they were, the clock as it is now."""
    return lambda: dataclasses.replace(mine, facts=dataclasses.replace(mine.facts, clock=clock())).to_wire()


def for_plan(plan: Plan, mine: Optional[Checkup] = None) -> Solo:
    """``mine``: this node's health checkup (``launcher.host.health``), which node 0 judges, its own and each node's,
    before any worker starts (None: none is judged)."""
    if plan.control is None:
        return Solo(plan)
    if plan.node_rank == 0:
        verdict = admission.own(f"node 0 ({plan.node_ip})", mine) if mine is not None else None
        return Leader(plan, open_hub(plan, mine), time.monotonic, verdict)
    return Follower(plan, open_spoke(plan, mine), time.monotonic)
