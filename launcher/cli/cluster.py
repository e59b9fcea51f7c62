"""The whole cluster from one command: ``--hostfile FILE`` (or ``--hosts H:N,...``) starts the job's launcher on every
host over ssh (``launcher.run.over_ssh``), each a node of an ordinary job in hostfile order, after every host passed
the check; one table says each host's address, workers, ranks and what failed. The job's exit code is its nodes'
(they agree), and the host and rank of its root cause are named; a signal to this command stops every host."""

from __future__ import annotations

import os
import platform
import random
import secrets
import shlex
import sys
from typing import Mapping, Optional, Sequence

import click

import launcher
from launcher.cli import config_file
from launcher.cli import request as requests
from launcher.cli import table
from launcher.envvars import JOB_TOKEN
from launcher.errors import LaunchError
from launcher.output import reports
from launcher.output.console import console, setup_messages
from launcher.output.messages import log
from launcher.plan import carried_env, collective, hostfile, over_ssh
from launcher.plan import elastic_backends as backends

DEFAULT_RUN = 16  # ports asked about beside the control port, where a host's workers are not known yet

LOCAL_NAMES = ("localhost",)


def with_hosts(ctx: click.Context, values: Mapping) -> Optional[dict]:
    """The values with this command's own options (``table.OVER_SSH``) from --config where the command line left
    them out, when the command line or the config names hosts; None when neither does (a job of this node's)."""
    settings = {}
    if values.get("config"):
        params = {p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name != "config"}
        settings = config_file.load(values["config"], params)
    on_line = requests.given_in(ctx)
    own = {row.name for row in table.ROWS if table.OVER_SSH in row.tags}
    merged = {**values, **{k: v for k, v in settings.items() if k in own and not on_line(k)}}
    return merged if merged.get("hostfile") or merged.get("hosts") else None


def run(ctx: click.Context, values: Mapping, argv: Sequence[str]) -> int:
    """Check every host, print the table, run the job on all of them; the job's exit code."""
    from launcher.run.over_ssh import FanOut

    on_line = requests.given_in(ctx)
    given = {name for name in values if on_line(name)}.__contains__  # before any stand-in
    request = _request(ctx, values, given)
    _refuse_mixed(given, request)
    hosts = _hosts(values)
    config = config_file.read_text(values["config"], "--config") if values.get("config") else None  # as checked
    reach = over_ssh.Reach(python=values.get("remote_python") or sys.executable, directory=os.getcwd(),
                           port=values.get("ssh_port"), identity_file=values.get("ssh_identity_file"),
                           extra=tuple(_split(values.get("ssh_args"))), connect_timeout=values["ssh_connect_timeout"])
    fan = FanOut(_remotes(hosts, reach), reach, values["ssh_fanout"], stop_node_0_only=request.elastic is None)
    fan.catch_signals()
    opts = request.options
    starts = over_ssh.candidate_starts(values.get("started_port"), random.Random().randrange)
    try:
        if not fan.check(over_ssh.environment(_environment(values)), _probe(opts, values, hosts, starts, fan.key)):
            return 128 + fan.signals[0]
        placed = _place(hosts, fan.remotes, reach, opts, values)
        start = over_ssh.common_start(starts, [(r.facts or {}).get("free") for r in fan.remotes],
                                      [p.workers + 1 for p in placed])
        rows = over_ssh.table_rows(placed, start, request.elastic is not None)
        console.write(2, "".join(line + "\n" for line in reports.table(rows, indent="")).encode())
        _refuse_unfit(placed, start, values.get("started_port"))
        names, counts, base = [p.address for p in placed], [p.workers for p in placed], _passed_on(argv)
        runs = {p.node: over_ssh.host_options(names, p.node, counts, p.gpus, start, request.elastic is not None,
                                              given("rdzv_endpoint")) + base for p in placed}
        sig = fan.run(runs, opts.shutdown_timeout, _report_dir(opts), config)
        return 128 + sig if sig is not None else _outcome(fan.remotes)
    finally:
        fan.close()


def _remotes(hosts, reach: over_ssh.Reach) -> list:
    """A session for each host: over ssh, or this machine's own without."""
    from launcher.run.over_ssh import Remote

    local = _local_names()
    return [Remote(i, h.name, over_ssh.local_command(reach) if h.name in local else over_ssh.ssh_command(h.name, reach),
                   f"[{h.name}] ".encode(), ssh=h.name not in local) for i, h in enumerate(hosts)]


def _report_dir(opts) -> Optional[str]:
    """Where the hosts' reports are relayed to (--report_log's log dir), each host's in a file named by its place in
    the hostfile (a fixed job's node; an elastic job's node numbers follow its rounds)."""
    return opts.log_dir if opts.report_log and opts.log_dir else None


def _probe(opts, values: Mapping, hosts, starts, key: str) -> dict:
    """The check each host answers: its files, and its free ports from each of ``starts`` (as many as the most
    workers a host may get, DEFAULT_RUN where they are not known yet, and the control port)."""
    limit = max([h.slots or 0 for h in hosts] + [_int(opts.nproc_per_node), DEFAULT_RUN]) + 1
    return over_ssh.probe_request(_script(opts), None, starts, limit, key)  # the config file travels with the job


def _script(opts) -> Optional[str]:
    """The file the hosts must have: the script, unless it is a module or a program found on PATH."""
    return opts.training_script if not (opts.module or opts.no_python) else None


# ---------------------------------------------------------------- the hosts


def _hosts(values: Mapping) -> tuple:
    if values.get("hostfile") and values.get("hosts"):
        raise LaunchError("--hostfile and --hosts both name the hosts; give one of them.")
    if values.get("hostfile"):
        hosts = hostfile.parse_hostfile(config_file.read_text(values["hostfile"], "--hostfile"), values["hostfile"])
    else:
        hosts = hostfile.parse_hosts(values["hosts"])
    return hostfile.select(hosts, values.get("include"), values.get("exclude"))


def _request(ctx: click.Context, values: Mapping, given):
    """The request as each host will read it. An elastic job's membership is kept by node 0's launcher (c10d) at a
    port chosen later: a stand-in endpoint lets the request be read here."""
    from launcher.plan.parsing import NodeRange

    nodes = values.get("nnodes")
    if isinstance(nodes, NodeRange) and nodes.elastic and not given("rdzv_endpoint") and not given("master"):
        stand_ins = {"rdzv_endpoint": "127.0.0.1", **({} if given("rdzv_backend") else {"rdzv_backend": backends.C10D.name})}
        values = {**values, **stand_ins}
        for name in stand_ins:
            ctx.set_parameter_source(name, click.core.ParameterSource.COMMANDLINE)
    request = requests.resolve(ctx, dict(values), os.environ)
    setup_messages(request.log_level)
    return request


def _refuse_mixed(given, request) -> None:
    """The options that name the nodes another way, or choose GPUs for every host, refused beside --hostfile; but an
    elastic job's membership in etcd, which no host keeps."""
    backend = getattr(request.elastic, "backend_row", None)
    for row in table.ROWS:
        if row.name == "rdzv_endpoint" and backend is not None and not backend.has_node_0:
            continue
        if given(row.name) and table.OVER_SSH not in row.tags and (
                table.NAMES_NODES in row.tags or table.NOT_OVER_SSH in row.tags):
            shown = row.shown[0]
            raise LaunchError(f"{shown} cannot be given with --hostfile or --hosts, which place every node (and "
                              "--include HOST:IDS its GPUs); leave it out.")


def _local_names() -> frozenset:
    """The host names that are this machine (localhost, and the addresses of its interfaces): they run without ssh."""
    from launcher.host import preflight

    return frozenset(LOCAL_NAMES) | {interface.address for interface in preflight.interfaces()}


def _place(hosts, remotes, reach: over_ssh.Reach, opts, values) -> list:
    """Each host's place (``over_ssh.Placed``), from its facts."""
    expected = {"python": platform.python_version(), "launcher": launcher.__version__, "directory": reach.directory,
                "script": _script(opts), "config": None}
    command_address = next((r.facts["command_address"] for r in remotes if r.facts and r.facts.get("command_address")),
                           None)
    return [_placed(host, remote, expected, _int(opts.nproc_per_node), command_address)
            for host, remote in zip(hosts, remotes)]


def _placed(host, remote, expected: Mapping, nproc: int, command_address: Optional[str]) -> over_ssh.Placed:
    if remote.facts is None:
        return over_ssh.Placed(remote.node, host.name, problems=(remote.failure or "it did not answer",))
    facts = remote.facts
    problems = over_ssh.fact_problems(facts, expected)
    gpu_count = _int(facts.get("gpus"))
    try:
        workers, gpus = hostfile.resolve(host, nproc or gpu_count or collective.DEFAULT_CPU_WORKERS, tuple(range(gpu_count)))
    except LaunchError as e:
        workers, gpus = 0, None
        problems.append(str(e).rstrip("."))
    address = str(facts.get("address") or "?")
    if command_address and not facts.get("command_address"):
        address = command_address  # this machine, run without ssh: where the other hosts reached it
    return over_ssh.Placed(remote.node, host.name, address, workers, gpus, tuple(problems))


def _refuse_unfit(placed, start, given_port) -> None:
    unfit = [p for p in placed if p.problems]
    if unfit:
        more = f" (and {len(unfit) - 1} more host(s), in the table above)" if len(unfit) > 1 else ""
        raise LaunchError(f"host {unfit[0].name} cannot take part: {'; '.join(unfit[0].problems)}{more}; nothing was "
                          "started.")
    if start is None:
        if given_port is not None:
            raise LaunchError(f"--started_port {given_port} (and the control port {given_port - 1} before it) is not "
                              "free on every host; give another port, or leave it out to have free ones chosen.")
        raise LaunchError("no run of ports was free on every host; give --started_port.")


# ---------------------------------------------------------------- what each host gets


def _environment(values: Mapping) -> dict:
    """The command's environment less what describes this machine, the env file's lines and --env; a job token."""
    file_env = config_file.env_file(values["env_file"]) if values.get("env_file") else {}
    env = carried_env.carried(os.environ, file_env, dict(values.get("env") or ()))
    env.setdefault(JOB_TOKEN, secrets.token_hex(16))  # the nodes prove to each other that they are this job's
    return env


def _passed_on(argv: Sequence[str]) -> list:
    """The command line less the options this command uses itself or sets for each host, and --config (its text is
    sent to each host with the job)."""
    names = {row.name for row in table.ROWS if {table.OVER_SSH, table.PER_HOST} & set(row.tags)} | {"config"}
    takes_value, dropped = {}, set()
    for row in table.ROWS:
        for spelling in (*row.spellings, *row.short):
            takes_value[spelling] = not row.click.get("is_flag")
            if row.name in names:
                dropped.add(spelling)
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            return out + list(argv[i:])
        name, equals, _ = token.partition("=")
        short = token[:2] if not token.startswith("--") and len(token) > 2 else None
        key = short if short in takes_value else name
        width = 1 if equals or short or not takes_value.get(key, False) else 2
        if key not in dropped:
            out += argv[i:i + width]
        i += width
    return out


# ---------------------------------------------------------------- the end


def _outcome(remotes) -> int:
    """The job's exit code, the root cause's host named; a host lost before it said how the job ended, named."""
    code, cause = over_ssh.outcome([r.end for r in remotes])
    if cause is not None:
        node = cause.get("node")
        where = remotes[node].name if isinstance(node, int) and 0 <= node < len(remotes) else "?"
        log.error("the job stopped: %s, on host %s; exit code %d", cause.get("text"), where, code)
    for remote in remotes:
        if remote.end is None:
            log.error("host %s ended its ssh session (exit code %s) before its launcher said how the job ended",
                      remote.name, remote.proc.returncode if remote.proc else None)
    return code


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _split(text: Optional[str]) -> list:
    try:
        return shlex.split(text or "")
    except ValueError as e:
        raise LaunchError(f"--ssh_args {text!r} cannot be split as a shell would ({e}); check its quotes.") from None
