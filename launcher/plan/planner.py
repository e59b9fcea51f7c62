"""The launch plan, whichever the mode: a parameter-server job's (``ps``) or a collective one's (``collective``). Pure."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from launcher.plan.collective import make_collective_plan
from launcher.plan.model import HostFacts, LaunchOptions, Plan
from launcher.plan.ps import make_ps_plan
from launcher.errors import LaunchError


def make_plan(
    opts: LaunchOptions,
    env: Mapping[str, str],
    host: HostFacts,
    find_free_ports: Callable[[str, int], Sequence[int]] = lambda ip, n: (),
) -> Plan:
    """Resolve devices, nodes, ranks, endpoints and each local process's environment.

    ``find_free_ports(ip, n)`` is called only when one node runs without --started_port (or without ports
    in parameter-server mode).
    """
    if opts.parameter_server:
        if opts.stream_choice:
            raise LaunchError("--redirects, --tee and --local-ranks-filter are torchrun's, for collective jobs; "
                              "in parameter-server mode --log_dir writes serverlog.N and workerlog.N.")
        return make_ps_plan(opts, env, host, find_free_ports)
    return make_collective_plan(opts, env, host, find_free_ports)
