"""``python -m launcher``: the command line, merged with --config, turned into a plan and run."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

import click

from launcher import __version__
from launcher.output import reports
from launcher.output import standard_streams as streams
from launcher.output.console import console, error, setup_messages
from launcher.output.messages import log
from launcher.cli import torchrun as torchrun_cli
from launcher.errors import LaunchError
from launcher.plan.agent_store import CHOICES as AGENT_STORE_CHOICES
from launcher.plan.clusters.registry import names as cluster_source_names

LOG_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}
DEFAULT_PROG = "python -m launcher"
CLUSTER_ENVS = cluster_source_names()  # --cluster_env's choices, in the registry's order (a cheap import)


class LogLevel(click.ParamType):
    name = "level"

    def convert(self, value, param, ctx):
        text = str(value).strip().upper()
        if text in LOG_LEVELS:
            return LOG_LEVELS[text]
        if text.isascii() and text.isdigit() and 10 <= int(text) <= 40:
            return int(text)
        self.fail(f"{value!r} is not a log level; use DEBUG, INFO, WARNING, ERROR or a number from 10 to 40.", param, ctx)


class WorkerCount(click.types.IntParamType):
    """A number of workers, or torchrun's auto, gpu, cpu (the plan resolves them with the host's facts)."""

    name = "N|auto|gpu|cpu"

    def convert(self, value, param, ctx):
        text = str(value).strip().lower()
        if text in ("auto", "gpu", "cpu"):
            return text
        if text.isascii() and text.lstrip("-").isdigit():
            return int(text)
        self.fail(f"{value!r} is not a number of workers; give a whole number such as 2, or auto, gpu or cpu.", param, ctx)


class Seconds(click.ParamType):
    """A finite number of seconds from ``low`` (0) to one day: nan never expires, inf cannot be added
    to a clock; ``hint`` ends the refusal."""

    name = "seconds"

    def __init__(self, low: float = 0.0, hint: str = "") -> None:
        self.low, self.hint = low, hint

    def convert(self, value, param, ctx):
        from launcher.plan.model import MAX_SHUTDOWN_TIMEOUT  # not at import: --help stays fast

        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            seconds = None
        if seconds is None or not self.low <= seconds <= MAX_SHUTDOWN_TIMEOUT:  # also false for nan
            self.fail(f"{value!r} is not a number of seconds from {self.low:g} to {MAX_SHUTDOWN_TIMEOUT:.0f} "
                      f"(one day){self.hint}.", param, ctx)
        return seconds


class Whole(click.types.IntParamType):
    """A whole number from ``low`` to ``high``; the refusal names the value, the range and ``what`` it counts."""

    def __init__(self, low: int, high: int, what: str) -> None:
        self.low, self.high, self.what = low, high, what
        self.name = what

    def convert(self, value, param, ctx):
        text = str(value).strip()
        number = int(text) if text.isascii() and text.lstrip("+-").isdigit() and not isinstance(value, float) else None
        if number is None or not self.low <= number <= self.high:
            self.fail(f"{value!r} is not {self.what} from {self.low} to {self.high}; give a whole number in that range.",
                      param, ctx)
        return number


def _option(name: str, aliases: tuple = (), **kwargs):
    """An option spelled with underscores (Paddle) and with dashes (torchrun), and its ``aliases``."""
    spellings = []
    for n in (name, *aliases):
        dashed = n.replace("_", "-")
        spellings += [f"--{n}"] + ([f"--{dashed}"] if dashed != n else [])
    return click.option(*kwargs.pop("short", ()), *spellings, name, **kwargs)


# ---------------------------------------------------------------- Paddle 2.6/3.x's and fleetrun's options
# (launcher.cli.paddle maps them onto the options above; Paddle 1.8's are this launcher's own)


def paddle_options(command):
    """Every option of Paddle 2.6/3.x's paddle.distributed.launch and of fleetrun that is not already ours."""
    from launcher.cli.paddle import MAPPED, REFUSED

    types = {"trainer_num": int, "max_restart": click.IntRange(0, 1000), "elastic_timeout": Seconds(),
             "http_port": click.IntRange(1, 65535)}
    for opt in reversed(MAPPED):
        command = _option(opt.name, opt.aliases, type=types.get(opt.name, str), default=None, metavar=opt.metavar,
                          help=opt.help)(command)
    command = _option("with_gloo", default="1", show_default=True, metavar="0|1|2",
                      help="Paddle 2.6/3.x, parameter servers: fleet's gloo among trainers (1), all (2), or none (0).")(command)
    command = _option("gloo_port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
                      help="Paddle 2.6/3.x, parameter servers: the port of fleet's gloo rendezvous on server 0's host "
                           "(default: a free port on one node, 6767 with --servers).")(command)
    for name in reversed(sorted(REFUSED)):
        command = _option(name, default=None, hidden=True)(command)
    return command


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "allow_interspersed_args": False}


@click.command(context_settings=CONTEXT, epilog="""\b
Examples:
  python -m launcher train.py                        # one worker per GPU, or 2 CPU workers
  python -m launcher --selected_gpus=0,1,2,3 --log_dir mylog train.py --lr 0.1
  python -m launcher --cluster_node_ips=192.168.1.2,192.168.1.3 \\
      --node_ip=192.168.1.2 --started_port=6170 train.py   # on each node, its own --node_ip
  python -m launcher --server_num 2 --worker_num 2 train_ps.py   # parameter servers

\b
Watching a job started with --log_dir (reads the folder only; touches no process):
  python -m launcher status mylog          # each process: pid, state, run time, last log line
  python -m launcher logs mylog -f --ranks 0,3 --grep loss   # the logs merged, followed
status and logs are these tools only as the first argument, and only when no file of that name
is in the current folder: a training script named status or logs runs as usual (also as ./status).

\b
Paddle 2.6/3.x and fleetrun options taken only to be refused, each saying why (NPUs and XPUs,
the auto-parallel tuner, rank auto-mapping, heterogeneous and federated parameter servers,
elastic training): --npus --xpus --selected_xpus --enable_gpu_log --auto_parallel_config
--auto_cluster_config --auto_tuner_json --cluster_topo_path --rank_mapping_path
--enable_auto_mapping --coordinators --coordinator_num --heter_workers --heter_devices
--heter_worker_num --elastic_pre_hook --scale --force
""")
@_option("cluster_node_ips", default="127.0.0.1", show_default=True, metavar="IPS",
         help="Comma-separated IPs or host names of all nodes, in node-rank order.")
@_option("node_ip", default="127.0.0.1", show_default=True, metavar="IP",
         help="This node's IP, as it appears in --cluster_node_ips.")
@_option("started_port", aliases=("start_port",), type=Whole(1, 65535, "a port"), default=None, metavar="PORT",
         help="First port of this node's workers; worker i uses PORT+i. "
              "Default: free ports on one node, 6070 on several.")
@_option("selected_gpus", default=None, metavar="IDS",
         help="Comma-separated GPU ids, one worker each. Default: all visible GPUs.")
@_option("nproc_per_node", type=WorkerCount(), default=None, metavar="N",
         help="Workers on this node: CPU workers when there is no GPU (default 2), "
              "or how many of the visible GPUs to use; torchrun's auto, gpu, cpu too.")
@_option("log_dir", default=None, metavar="DIR",
         help="Write each worker's output to DIR/workerlog.RANK (appended); "
              "the node's first worker is also shown on the console.")
@_option("use_paddlecloud", is_flag=True, default=False,
         help="Take the cluster from PaddleCloud's environment (PADDLE_TRAINERS, POD_IP, ...).")
@_option("cluster_env", type=click.Choice(CLUSTER_ENVS), default="auto", show_default=True,
         help="Where the nodes come from: the command line (cli), PaddleCloud, Kubeflow (PET_*), SLURM "
              "(srun), Volcano, MPI or LSF; auto takes the first found, else this node alone.")
@_option("print_config", type=click.BOOL, default=True, show_default=True, metavar="BOOL",
         help="Print the launch plan before starting (true/false/1/0/yes/no).")
@_option("log_level", type=LogLevel(), default="INFO", show_default=True,
         help="The launcher's own messages: DEBUG, INFO, WARNING, ERROR, or 10-40.")
@_option("config", default=None, metavar="FILE.yaml",
         help="A YAML file of options (underscore names), training_script, "
              "training_script_args and env. The command line wins over it.")
@_option("module", short=("-m",), is_flag=True, default=False,
         help="Run training_script as a module: python -m training_script.")
@_option("no_python", is_flag=True, default=False,
         help="Run training_script as an executable, not through Python: a path such as ./run.sh, "
              "or a command on PATH.")
@_option("shutdown_timeout", type=Seconds(), default=10.0, show_default=True, metavar="SECONDS",
         help="Grace between SIGTERM and SIGKILL when workers are stopped (up to one day).")
@click.version_option(__version__, "--version", message="%(prog)s %(version)s")
@_option("max_restarts", type=Whole(0, 1000, "a number of restarts"), default=0, show_default=True, metavar="N",
         help="Restart the whole job (every node) up to N times after a worker fails.")
@_option("control_port", type=Whole(1, 65535, "a port"), default=None, metavar="PORT",
         help="Several nodes: the port node 0's launcher listens on for the others (under mpirun "
              "also to gather the node list). Default: the first worker port minus one.")
@_option("heartbeat_timeout", type=Seconds(0.5), default=3.0, show_default=True, metavar="SECONDS",
         help="Several nodes: a node silent this long is lost, and the job stops.")
@_option("join_timeout", type=Seconds(0.5), default=300.0, show_default=True, metavar="SECONDS",
         help="Several nodes: a node that has not joined after this long is named, and the job stops.")
@_option("job_id", default=None, metavar="ID",
         help="Several nodes: the job's name, the same on every node. Default: a digest of the "
              "nodes, ports and command. Set LAUNCHER_JOB_TOKEN to make nodes prove they belong.")
@_option("dump_stacks", type=click.BOOL, default=False, show_default=True, metavar="BOOL",
         help="Before stopping the workers after a failure or a signal, show where each one was "
              "(its Python stack, with py-spy). Costs up to a few seconds of teardown; always done "
              "for --hang_timeout.")
@_option("hang_timeout", type=Seconds(1.0, "; leave the option out to never stop a quiet job"), default=None, metavar="SECONDS",
         help="Stop the job (showing every worker's stack) when no worker has written "
              "a line for this long. Default: never.")
@_option("agent_store", type=click.Choice(AGENT_STORE_CHOICES), default="auto", show_default=True,
         help="Who hosts the workers' rendezvous store (MASTER_PORT): node 0's launcher, as torchrun's agent "
              "does, so that every rank connects as a client and a late rank 0 costs no wait (on; "
              "TORCHELASTIC_USE_AGENT_STORE=True), or rank 0 itself (off). auto: on when the workers' Python "
              "is the launcher's and has torch but not paddle. Collective mode only.")
@_option("server_num", type=int, default=None, metavar="N",
         help="Parameter-server mode on one node: start N servers (default 2 when --worker_num is given).")
@_option("worker_num", type=int, default=None, metavar="N",
         help="Parameter-server mode on one node: start N trainers (default 2 when --server_num is given).")
@_option("servers", aliases=("endpoints",), default=None, metavar="IP:PORT,...",
         help="Parameter-server mode on several nodes: every server's endpoint; each node starts its own.")
@_option("workers", default=None, metavar="IP:PORT,...",
         help="Parameter-server mode on several nodes: every trainer's endpoint; each node starts its own.")
@torchrun_cli.options(_option)  # torchrun's command line: its own block, mapped onto the options above
@paddle_options
@click.argument("training_script", required=False)
@click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch(ctx: click.Context, **values) -> int:
    """Start one training worker per GPU (or --nproc_per_node CPU workers) on this node,
    keep their logs, and stop them all as soon as one fails.

    Run the same command on every node of the cluster, each with its own --node_ip.
    TRAINING_SCRIPT and everything after it go to every worker unchanged. Each worker
    gets FLAGS_selected_gpus, the PADDLE_TRAINER_* variables, and torch's RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.

    With --server_num/--worker_num (or --servers/--workers) it starts parameter servers and
    trainers instead, and stops the servers once every trainer has finished.
    """
    values, from_file = _with_config(ctx, values)
    given = lambda name: name in from_file or _given(ctx, name)  # noqa: E731
    values = torchrun_cli.to_ours(values, given, os.environ)
    setup_messages(values["log_level"])
    values = _with_elastic_values(values, given)
    if values.get("elastic") is not None:
        from launcher.cli import elastic as elastic_cli

        spec = values.pop("elastic")
        return elastic_cli.run(values, spec, lambda v: resolve_options(ctx, v, from_file)[0])
    values.pop("elastic", None)
    opts, nodes = resolve_options(ctx, values, from_file)
    from launcher.cli import paddle as paddle_cli

    from launcher.host import preflight
    from launcher.run import attempts, limits
    from launcher.plan.planner import make_plan

    host = _with_gathered_nodes(opts, preflight.probe_host(os.environ))
    finder = preflight.port_finder(host, lambda count: limits.check_limits(count, log_dir=False))
    try:
        plan = make_plan(opts, os.environ, host, finder)
        paddle_cli.check_nodes(nodes, len(plan.node_ips), plan.cluster or "--cluster_node_ips")
        preflight.check(plan, opts, host)
    except LaunchError:
        for s in finder.held:
            s.close()
        raise
    reserved = finder.held or preflight.reserve_store_port(plan)
    for note in plan.notes:
        log.warning(note)
    if values["print_config"]:
        console.write(2, (reports.format_plan(plan) + "\n").encode(errors="replace"))
    return attempts.run(plan, tuple(reserved))


def resolve_options(ctx: click.Context, values: dict, from_file: set = frozenset()):
    """(LaunchOptions, the --nnodes to check the plan against): Paddle 2.6/3.x's options mapped onto ours."""
    from launcher.cli import paddle as paddle_cli

    given = set(from_file) | {n for n in values if ctx.get_parameter_source(n) not in (None, click.core.ParameterSource.DEFAULT)}
    values = paddle_cli.translate(values, given)
    expected = paddle_cli.expected_nodes(values, given)
    if not isinstance(values.get("nnodes"), (int, type(None))):  # Paddle's --nnodes: only that check
        values = {**values, "nnodes": None}
    return _options(values, ctx.command_path), expected


def _with_elastic_values(values: dict, given) -> dict:
    """An elastic job (torchrun's or Paddle 3's ``--nnodes MIN:MAX``): its ElasticSpec in ``elastic``, with the
    values it implies (node 0's address, the workers' first port)."""
    from launcher.cli import paddle as paddle_cli

    if "elastic" in values:
        return values
    return {**values, **(paddle_cli.elastic(values, given, os.environ) or {})}


def _with_gathered_nodes(opts, host):
    """An MPI job of several ranks: every node's address, gathered from the other ranks (launcher.nodes.static.gather)."""
    from launcher.plan.clusters.registry import gathering
    from launcher.plan.clusters.source import DEFAULT_NODES
    from launcher.nodes.static import gather
    from launcher.host import preflight
    from launcher.envvars import JOB_TOKEN

    spec = gathering(opts, os.environ)
    if spec is None:
        return host
    given = opts.node_ip != DEFAULT_NODES
    address = opts.node_ip if given else gather.own_address(spec)
    preflight.check_node_ip(address, host)
    nodes = gather.gather(spec, address, opts.join_timeout, os.environ.get(JOB_TOKEN) or None)
    return dataclasses.replace(host, gathered_nodes=nodes)


TOOL_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(context_settings=TOOL_CONTEXT)
@click.argument("log_dir", required=False, default=".")
def status_command(log_dir: str) -> int:
    """Show each process of the job whose --log_dir is LOG_DIR (default: the current folder):
    node, rank (or server/trainer), pid, state (running, exited N, killed by SIG, stopped),
    run time, restarts, and the last line of its log.

    Reads the state file the launcher keeps there (launcher.nodeN.json) and the logs; touches no
    process. A job whose launcher is gone is said not to run any more.
    """
    from launcher.tools import status

    streams.show(status.status(log_dir).encode(), flush=True)
    return 0


@click.command(context_settings=TOOL_CONTEXT)
@click.argument("log_dir")
@click.option("-f", "--follow", is_flag=True, default=False,
              help="Then show new lines as they come, until the job has ended (or Ctrl-C).")
@click.option("--ranks", default=None, metavar="0,3,s0",
              help="Only these logs: N for workerlog.N, sN for serverlog.N.")
@click.option("--grep", default=None, metavar="REGEX", help="Only the lines that match REGEX (Python syntax).")
def logs_command(log_dir: str, follow: bool, ranks, grep) -> int:
    """Show every workerlog.N and serverlog.N of LOG_DIR merged, each line prefixed with its
    process ([rank 0], [server 1]).

    Lines carry no time of their own: the runs (from the dated line that opens each one) are shown
    in the order they started, each run's lines whole and in order; with -f, new lines as they
    are written (each log read when the kernel reports it changed; on a network file system,
    polled).
    """
    from launcher.tools import follow as follow_tool
    from launcher.tools import logs as log_tool

    setup_messages(logging.WARNING)
    if follow and not follow_tool.job_running(log_dir):
        follow = False  # a job that has ended: a dump, as without -f
    write = follow_tool.Paced(log_dir, streams.to_console, lambda: console.has_room(1), console.wait) if follow \
        else lambda data, flush: streams.show(data, flush=flush)
    gone = log_tool.show(log_dir, follow, ranks, grep, write)
    if gone:
        log.warning(gone)
    return 0


TOOLS = {"status": status_command, "logs": logs_command}


def command_for(args: list, prog: str = DEFAULT_PROG):
    """(click command, its arguments, its name). ``status`` and ``logs`` are the operator tools
    only as the first argument and when no file of that name is in the current folder: a training
    script of that name is never shadowed."""
    if args and args[0] in TOOLS and not os.path.isfile(args[0]):
        return TOOLS[args[0]], args[1:], f"{prog} {args[0]}"
    return launch, args, prog


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _with_config(ctx: click.Context, values: dict):
    """Command line, then the --config file, then defaults; and the names the file set."""
    if not values["config"]:
        return values, set()
    from launcher.cli import config_file as config

    options = {p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name != "config"}
    settings = config.load(values["config"], options)
    merged = dict(values)
    for name, value in settings.items():
        given = name in values and _given(ctx, name)
        if name in ("training_script", "training_script_args") and values["training_script"]:
            continue
        if not given:
            merged[name] = value
    return merged, set(settings)


def _options(values: dict, prog: str = DEFAULT_PROG):
    from launcher.plan.model import LaunchOptions

    if not values["training_script"]:
        raise LaunchError(f"no training script given; usage: {prog} [OPTIONS] training_script [ARGS]...")
    given = {f.name: values[f.name] for f in dataclasses.fields(LaunchOptions) if f.name in values}
    given["training_script_args"] = tuple(values["training_script_args"] or ())
    return LaunchOptions(**given, extra_env=tuple(values.get("env", ())))


def prog_name(argv0: str) -> str:
    """How the user invoked us: ``launcher`` (the console script), else ``python -m launcher``."""
    name = os.path.basename(argv0 or "")
    return DEFAULT_PROG if name in ("", "__main__.py", "-c", "-m") or name.endswith(".py") else name


def main(argv=None) -> None:
    streams.open_standard_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    command, args, prog = command_for(args, prog_name(sys.argv[0] if sys.argv else ""))
    try:
        code = command.main(args=args, prog_name=prog, standalone_mode=False)
    except streams.StdoutLost as e:
        code = streams.stdout_lost_code(e.error)
    except (LaunchError, click.ClickException) as e:
        error(e.format_message() if isinstance(e, click.ClickException) else str(e))
        code = getattr(e, "exit_code", 2) if isinstance(e, LaunchError) else 2
    except (KeyboardInterrupt, click.Abort):
        streams.abandon_stdout()
        code = 130
    except Exception:
        import traceback

        console.write(2, traceback.format_exc().encode(errors="replace"))
        error("internal error of the launcher (a bug: please report it with the traceback above); the workers were stopped.")
        code = 1
    streams.finish_output()
    os._exit(code or 0)  # everything is flushed and stopped; the interpreter's teardown only costs time
