"""What every kind of plan shares: the options checked alike, the worker's command, its error file, the
endpoint variables, the network interface, the control channel of a job of several nodes. Pure.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import os
from typing import Mapping, Optional, Sequence

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan.model import MAX_SHUTDOWN_TIMEOUT, ControlSpec, HostFacts, Interface, LaunchOptions

# Linux refuses a single "NAME=value" string longer than MAX_ARG_STRLEN (32 pages).
MAX_ENV_STRING = 128 * 1024


def check_run_options(opts: LaunchOptions) -> None:
    """The options of the run itself, the same in every mode: the grace period, how to run the script, restarts."""
    check_shutdown_timeout(opts.shutdown_timeout)
    if opts.module and opts.no_python:
        raise LaunchError("--module and --no_python exclude each other; give only one of them.")
    if opts.max_restarts < 0:
        raise LaunchError(f"--max_restarts {opts.max_restarts} is below 0; give 0 (no restart) or more.")
    if opts.report_log and not opts.log_dir:
        raise LaunchError("--report_log keeps the reports in the log dir; give --log_dir DIR too.")


def check_shutdown_timeout(seconds) -> None:
    """A grace period the stop sequence can wait for: a finite number of seconds, up to one day."""
    ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds)
    if not ok or not 0 <= seconds <= MAX_SHUTDOWN_TIMEOUT:
        raise LaunchError(f"--shutdown_timeout {seconds} is not a grace period the launcher can wait for; "
                          f"give a number of seconds from 0 to {MAX_SHUTDOWN_TIMEOUT:.0f} (one day).")


def error_file_of(host: HostFacts, rank: int) -> str:
    """Where a worker's @record writes its exception: a file of its own, in the launch's temporary folder."""
    return os.path.join(host.temp_dir, f"launcher-{host.run_id}", f"error.{rank}.json")


def control_spec(opts: LaunchOptions, env: Mapping[str, str], node_ips: tuple, ports: tuple, cmd: tuple,
                 scheduler_job: Optional[str] = None, taken: tuple = ()):
    """The control channel of a job of several nodes (None for one); ``ports``: node 0's, the first one's neighbour is
    the default; ``taken``: the other ports of node 0's host (nodes sharing it). The job id: --job_id,
    LAUNCHER_JOB_ID, the scheduler's job, or a digest of the job."""
    if len(node_ips) == 1:
        return None
    port = opts.control_port if opts.control_port is not None else ports[0] - 1
    if not 1 <= port <= 65535:
        raise LaunchError(f"--control_port {port} is outside 1-65535; give a free port of node 0 with --control_port.")
    if port in ports or port in taken:
        raise LaunchError(f"--control_port {port} is also the port of a process on node 0; choose another one.")
    for name, value in (("--heartbeat_timeout", opts.heartbeat_timeout), ("--join_timeout", opts.join_timeout)):
        if not 0.5 <= value <= MAX_SHUTDOWN_TIMEOUT:
            raise LaunchError(f"{name} {value} is not a number of seconds from 0.5 to {MAX_SHUTDOWN_TIMEOUT:.0f}; give a sensible timeout.")
    job_id = opts.job_id or env.get(ev.JOB_ID) or scheduler_job or default_job_id(node_ips, ports, cmd)
    return ControlSpec(port, opts.heartbeat_timeout, opts.join_timeout, job_id, env.get(ev.JOB_TOKEN) or None)


def default_job_id(node_ips, ports, cmd) -> str:
    """The same on every node of one job: a digest of the nodes, the ports and the command."""
    text = json.dumps([list(node_ips), list(ports), list(cmd[1:])])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def endpoint_vars(endpoints: str, host: HostFacts, base_env: dict):
    """PADDLE_TRAINER_ENDPOINTS, or files holding them when the variable would be too long: one that
    PADDLE_TRAINER_ENDPOINTS_FILE names (this project's runtime), and Paddle's own, a JSON object of
    variables that PADDLE_BACKUP_ENV_PATH names (read by Paddle's role maker and ParallelEnv); then the
    launcher's own value is dropped from ``base_env`` (it would be stale)."""
    if len(ev.TRAINER_ENDPOINTS) + len(endpoints) + 2 <= MAX_ENV_STRING:
        return {}, {ev.TRAINER_ENDPOINTS: endpoints}
    base_env.pop(ev.TRAINER_ENDPOINTS, None)
    folder = os.path.join(host.temp_dir, f"launcher-{host.run_id}")
    path, backup = os.path.join(folder, "trainer_endpoints"), os.path.join(folder, "backup_env.json")
    files = {path: endpoints, backup: json.dumps({ev.TRAINER_ENDPOINTS: endpoints})}
    return files, {ev.TRAINER_ENDPOINTS_FILE: path, ev.BACKUP_ENV_PATH: backup}


def node_vars(base_env: Mapping[str, str], host: HostFacts, node_ip: str, processes: int, interface_vars: tuple) -> dict:
    """What every process of a node gets in every mode, unless the user set it: OMP_NUM_THREADS (the node's cores
    shared among its ``processes``) and the network interface of ``node_ip`` in each of ``interface_vars``."""
    out = {ev.OMP_NUM_THREADS: str(max(1, host.cpu_count // processes))}
    iface = interface_of(node_ip, host.interfaces)
    out.update({name: iface for name in interface_vars if iface})
    return {name: value for name, value in out.items() if name not in base_env}


def interface_of(ip: str, interfaces: Sequence[Interface]) -> Optional[str]:
    """The interface that holds or reaches ``ip`` directly, or None."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    for iface in interfaces:
        if iface.address == ip:
            return iface.name
    for iface in interfaces:
        try:
            net = ipaddress.ip_network(f"{iface.address}/{iface.netmask}", strict=False)
        except (ValueError, TypeError):
            continue
        if addr in net and net.prefixlen < net.max_prefixlen:
            return iface.name
    return None


def python_of(env: Mapping[str, str], host: HostFacts) -> str:
    """The interpreter of Python workers: torchrun's PYTHON_EXEC when set, else the launcher's own."""
    return env.get(ev.PYTHON_EXEC) or host.python


def command(opts: LaunchOptions, python: str) -> tuple:
    args = tuple(opts.training_script_args)
    if opts.no_python:
        return (opts.training_script, *args)
    if opts.module:
        return (python, "-u", "-m", opts.training_script, *args)
    return (python, "-u", opts.training_script, *args)


def run_fields(opts: LaunchOptions, base_env: dict, files: dict, node_ip: str) -> dict:
    """The Plan's fields that every mode fills alike. The monitor (--monitor_port) listens on --monitor_host, else on
    this node's own address (never every interface unless asked, with --monitor_host 0.0.0.0)."""
    monitor = (opts.monitor_host or node_ip, opts.monitor_port) if opts.monitor_port is not None else None
    return dict(base_env=base_env, log_dir=opts.log_dir, shutdown_timeout=opts.shutdown_timeout, files=files,
                max_restarts=opts.max_restarts, hang_timeout=opts.hang_timeout, dump_stacks=opts.dump_stacks, report_log=opts.report_log,
                monitor=monitor, error_file=base_env.get(ev.ERROR_FILE) or None)
