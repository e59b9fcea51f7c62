"""The launch command's options: how each is spelled (Paddle's underscores and torchrun's dashes),
read (its type, and the sentence that refuses a bad value) and explained in --help, in --help's
order; ``launcher.cli.main`` defines the command that takes them and runs it."""

from __future__ import annotations

import click

from launcher import __version__
from launcher.cli import torchrun as torchrun_cli
from launcher.plan.agent_store import CHOICES as AGENT_STORE_CHOICES
from launcher.plan.clusters.registry import names as cluster_source_names

LOG_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}
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


def option(name: str, aliases: tuple = (), **kwargs):
    """An option spelled with underscores (Paddle) and with dashes (torchrun), and its ``aliases``."""
    spellings = []
    for n in (name, *aliases):
        dashed = n.replace("_", "-")
        spellings += [f"--{n}"] + ([f"--{dashed}"] if dashed != n else [])
    return click.option(*kwargs.pop("short", ()), *spellings, name, **kwargs)


# ---------------------------------------------------------------- Paddle 2.6/3.x's and fleetrun's options
# (launcher.cli.paddle maps them onto this launcher's own; Paddle 1.8's are this launcher's own)


def paddle_options(command):
    """Every option of Paddle 2.6/3.x's paddle.distributed.launch and of fleetrun that is not already ours."""
    from launcher.cli.paddle import MAPPED, REFUSED

    types = {"trainer_num": int, "max_restart": click.IntRange(0, 1000), "elastic_timeout": Seconds(),
             "http_port": click.IntRange(1, 65535)}
    for opt in reversed(MAPPED):
        command = option(opt.name, opt.aliases, type=types.get(opt.name, str), default=None, metavar=opt.metavar,
                         help=opt.help)(command)
    command = option("with_gloo", default="1", show_default=True, metavar="0|1|2",
                     help="Paddle 2.6/3.x, parameter servers: fleet's gloo among trainers (1), all (2), or none (0).")(command)
    command = option("gloo_port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
                     help="Paddle 2.6/3.x, parameter servers: the port of fleet's gloo rendezvous on server 0's host "
                          "(default: a free port on one node, 6767 with --servers).")(command)
    for name in reversed(sorted(REFUSED)):
        command = option(name, default=None, hidden=True)(command)
    return command


def launch_options(command):
    """Every option of the launch command, as click decorators in --help's order: this launcher's own,
    then torchrun's block (mapped onto ours by ``launcher.cli.torchrun``), then Paddle's."""
    decorators = (
        option("cluster_node_ips", default="127.0.0.1", show_default=True, metavar="IPS",
               help="Comma-separated IPs or host names of all nodes, in node-rank order."),
        option("node_ip", default="127.0.0.1", show_default=True, metavar="IP",
               help="This node's IP, as it appears in --cluster_node_ips."),
        option("started_port", aliases=("start_port",), type=Whole(1, 65535, "a port"), default=None, metavar="PORT",
               help="First port of this node's workers; worker i uses PORT+i. "
                    "Default: free ports on one node, 6070 on several."),
        option("selected_gpus", default=None, metavar="IDS",
               help="Comma-separated GPU ids, one worker each. Default: all visible GPUs."),
        option("nproc_per_node", type=WorkerCount(), default=None, metavar="N",
               help="Workers on this node: CPU workers when there is no GPU (default 2), "
                    "or how many of the visible GPUs to use; torchrun's auto, gpu, cpu too."),
        option("log_dir", default=None, metavar="DIR",
               help="Write each worker's output to DIR/workerlog.RANK (appended); "
                    "the node's first worker is also shown on the console."),
        option("use_paddlecloud", is_flag=True, default=False,
               help="Take the cluster from PaddleCloud's environment (PADDLE_TRAINERS, POD_IP, ...)."),
        option("cluster_env", type=click.Choice(CLUSTER_ENVS), default="auto", show_default=True,
               help="Where the nodes come from: the command line (cli), PaddleCloud, Kubeflow (PET_*), SLURM "
                    "(srun), Volcano, MPI or LSF; auto takes the first found, else this node alone."),
        option("print_config", type=click.BOOL, default=True, show_default=True, metavar="BOOL",
               help="Print the launch plan before starting (true/false/1/0/yes/no)."),
        option("log_level", type=LogLevel(), default="INFO", show_default=True,
               help="The launcher's own messages: DEBUG, INFO, WARNING, ERROR, or 10-40."),
        option("config", default=None, metavar="FILE.yaml",
               help="A YAML file of options (underscore names), training_script, "
                    "training_script_args and env. The command line wins over it."),
        option("module", short=("-m",), is_flag=True, default=False,
               help="Run training_script as a module: python -m training_script."),
        option("no_python", is_flag=True, default=False,
               help="Run training_script as an executable, not through Python: a path such as ./run.sh, "
                    "or a command on PATH."),
        option("shutdown_timeout", type=Seconds(), default=10.0, show_default=True, metavar="SECONDS",
               help="Grace between SIGTERM and SIGKILL when workers are stopped (up to one day)."),
        click.version_option(__version__, "--version", message="%(prog)s %(version)s"),
        option("max_restarts", type=Whole(0, 1000, "a number of restarts"), default=0, show_default=True, metavar="N",
               help="Restart the whole job (every node) up to N times after a worker fails."),
        option("control_port", type=Whole(1, 65535, "a port"), default=None, metavar="PORT",
               help="Several nodes: the port node 0's launcher listens on for the others (under mpirun "
                    "also to gather the node list). Default: the first worker port minus one."),
        option("heartbeat_timeout", type=Seconds(0.5), default=3.0, show_default=True, metavar="SECONDS",
               help="Several nodes: a node silent this long is lost, and the job stops."),
        option("join_timeout", type=Seconds(0.5), default=300.0, show_default=True, metavar="SECONDS",
               help="Several nodes: a node that has not joined after this long is named, and the job stops."),
        option("job_id", default=None, metavar="ID",
               help="Several nodes: the job's name, the same on every node. Default: a digest of the "
                    "nodes, ports and command. Set LAUNCHER_JOB_TOKEN to make nodes prove they belong."),
        option("dump_stacks", type=click.BOOL, default=False, show_default=True, metavar="BOOL",
               help="Before stopping the workers after a failure or a signal, show where each one was "
                    "(its Python stack, with py-spy), and again before the SIGKILL of a worker that let SIGTERM "
                    "pass. Costs up to a few seconds of teardown; always done for --hang_timeout."),
        option("hang_timeout", type=Seconds(1.0, "; leave the option out to never stop a quiet job"), default=None,
               metavar="SECONDS",
               help="Stop the job (showing every worker's stack) when no worker has written "
                    "a line for this long, or a worker that reports its steps (launcher.runtime.report) has "
                    "reported none for this long. Default: never."),
        option("monitor_port", type=click.IntRange(0, 65535), default=None, metavar="PORT", envvar="LAUNCHER_MONITOR_PORT",
               help="Serve this node's view of the job over HTTP: /metrics (Prometheus), /healthz, /status.json and "
                    "a live page of the whole job at / (give every node the same port); 0 picks a free port and prints it. Needs pip install 'launcher[monitor]'. "
                    "Also LAUNCHER_MONITOR_PORT. Default: off."),
        option("monitor_host", default=None, metavar="HOST",
               help="The address the monitor listens on (default: this node's own; 0.0.0.0 for every interface)."),
        option("agent_store", type=click.Choice(AGENT_STORE_CHOICES), default="auto", show_default=True,
               help="Who hosts the workers' rendezvous store (MASTER_PORT): node 0's launcher, as torchrun's agent "
                    "does, so that every rank connects as a client and a late rank 0 costs no wait (on; "
                    "TORCHELASTIC_USE_AGENT_STORE=True), or rank 0 itself (off). auto: on when the workers' Python "
                    "is the launcher's and has torch but not paddle. Collective mode only."),
        option("server_num", type=int, default=None, metavar="N",
               help="Parameter-server mode on one node: start N servers (default 2 when --worker_num is given)."),
        option("worker_num", type=int, default=None, metavar="N",
               help="Parameter-server mode on one node: start N trainers (default 2 when --server_num is given)."),
        option("servers", aliases=("endpoints",), default=None, metavar="IP:PORT,...",
               help="Parameter-server mode on several nodes: every server's endpoint; each node starts its own."),
        option("workers", default=None, metavar="IP:PORT,...",
               help="Parameter-server mode on several nodes: every trainer's endpoint; each node starts its own."),
        torchrun_cli.options(option),  # torchrun's command line: its own block, mapped onto the options above
        paddle_options,
    )
    for decorate in reversed(decorators):
        command = decorate(command)
    return command
