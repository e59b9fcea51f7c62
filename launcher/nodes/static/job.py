"""The coordinator of a plan, built with its real control channel (node 0's hub, the other
nodes' spoke) and the monotonic clock: the one place that wires ``coordinator`` to sockets."""

from __future__ import annotations

import time

from launcher.errors import LaunchError
from launcher.nodes.static.coordinator import Leader, Solo
from launcher.nodes.static.follower import Follower
from launcher.nodes.static.hub import Hub
from launcher.nodes.transport.messages import Identity
from launcher.nodes.static.spoke import Spoke
from launcher.plan.model import Plan


def identity(plan: Plan) -> Identity:
    """What the other nodes' launchers must share with this one to be parts of its job."""
    return Identity(plan.control.job_id, tuple(plan.node_ips), tuple(plan.job_ports),
                    " ".join(plan.workers[0].cmd[1:]))


def open_hub(plan: Plan) -> Hub:
    spec = plan.control
    try:
        return Hub(identity(plan), plan.node_ip, spec.port, spec.heartbeat_timeout, spec.join_timeout, spec.token)
    except OSError as e:
        raise LaunchError(f"cannot listen on the control port {spec.port} of node 0 ({e.strerror}); "
                          f"free it or choose another --control_port (the same on every node).") from None


def open_spoke(plan: Plan) -> Spoke:
    """Connects only when ticked: opening it opens no socket yet."""
    spec = plan.control
    return Spoke(identity(plan), plan.node_rank, plan.node_ips[0], spec.port, spec.heartbeat_timeout,
                 spec.join_timeout, spec.token)


def for_plan(plan: Plan) -> Solo:
    if plan.control is None:
        return Solo(plan)
    if plan.node_rank == 0:
        return Leader(plan, open_hub(plan), time.monotonic)
    return Follower(plan, open_spoke(plan), time.monotonic)
