"""The launch plan, whichever the mode: a parameter-server job's (``ps``) or a collective one's (``collective``). Pure."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from launcher.plan.collective import make_collective_plan
from launcher.plan.health import HealthSettings
from launcher.plan.model import HostFacts, LaunchOptions, Plan
from launcher.plan.ps import make_ps_plan
from launcher.plan import torchrun_values
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
        if opts.stream_choice or opts.duplicate_stdout_filters or opts.duplicate_stderr_filters:
            raise LaunchError("--redirects, --tee, --local-ranks-filter and --duplicate-stdout/stderr-filters are "
                              "torchrun's, for collective jobs; in parameter-server mode --log_dir writes serverlog.N "
                              "and workerlog.N.")
        if opts.virtual_local_rank:
            raise LaunchError("--virtual-local-rank is torchrun's, for collective jobs; in parameter-server mode each "
                              "trainer's GPU is in FLAGS_selected_gpus: leave the option out.")
        if opts.places_workers:
            raise LaunchError("--numa-binding, --bind_cores_to_rank and --bind_core_list place a collective job's "
                              "workers; in parameter-server mode leave them out (run the launcher under taskset or "
                              "numactl to bind every process of the node).")
        plan = make_ps_plan(opts, env, host, find_free_ports)
    else:
        plan = make_collective_plan(opts, env, host, find_free_ports)
    return with_run_options(plan, opts)


def with_run_options(plan: Plan, opts: LaunchOptions) -> Plan:
    """What every mode's run takes from the options: the signals that stop the job (torchrun's --signals-to-handle),
    where the events also go (--event-log-handler) and the node's health checks."""
    stop = plan.stop_signals
    if opts.signals_to_handle is not None:  # numbers, as parse_signals gives them: checked as it checks them
        stop = torchrun_values.parse_signals(",".join(str(int(s)) for s in opts.signals_to_handle))
    handler = torchrun_values.parse_event_log_handler(opts.event_log_handler)
    return dataclasses.replace(plan, stop_signals=stop, events_to_console=handler == "console",
                               health=health_settings(opts))


def health_settings(opts: LaunchOptions) -> HealthSettings:
    """The checks the options ask for (--health_check, --health_check_timeout, --skip_health_checks,
    --health_interval)."""
    command = opts.health_check
    if command is not None and not command.strip():
        raise LaunchError("--health_check is empty; give the command that checks a node (such as 'dcgmi diag -r 1'), "
                          "or leave the option out.")
    return HealthSettings(off=frozenset(opts.skip_health_checks), command=command, timeout=opts.health_check_timeout,
                          interval=opts.health_interval)
