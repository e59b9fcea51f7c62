"""``python -m launcher``: the command line, merged with --config, turned into a plan and run; or, as
the first argument, the operator tools ``status`` and ``logs``, and the tuner ``tune``. The launch command's options (their
spellings, types and help) are ``launcher.cli.options``'s."""

from __future__ import annotations

import logging
import os
import sys

import click

from launcher.output import standard_streams as streams
from launcher.output.console import console, error, setup_messages
from launcher.output.messages import log
from launcher.cli import request as requests
from launcher.cli.options import GroupedCommand, launch_options, refused_options_epilog
from launcher.plan.tune_nodes import TUNE_PORT
from launcher.errors import LaunchError

DEFAULT_PROG = "python -m launcher"
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "allow_interspersed_args": False}


@click.command(cls=GroupedCommand, context_settings=CONTEXT, epilog="""\b
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
The fastest settings searched for, each trial a whole job (docs/tuning.md; tune as status and logs):
  python -m launcher tune --space space.yaml --log_dir tune_log train.py

\b
""" + refused_options_epilog())
@launch_options  # every option, from the one table (launcher.cli.table)
@click.argument("training_script", required=False)
@click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch(ctx: click.Context, **values) -> int:
    """Start one training worker per GPU (or --nproc_per_node CPU workers) on this node,
    keep their logs, and stop them all as soon as one fails.

    Run the same command on every node of the cluster, each with its own --node_ip.
    Every option takes underscores or dashes (--log_dir, --log-dir), and a value after = or a space.
    TRAINING_SCRIPT and everything after it go to every worker unchanged. Each worker
    gets FLAGS_selected_gpus, the PADDLE_TRAINER_* variables, and torch's RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.

    With --server_num/--worker_num (or --servers/--workers) it starts parameter servers and
    trainers instead, and stops the servers once every trainer has finished.
    """
    from launcher.cli import job

    obj = ctx.obj or {}
    if not obj.get("a_host") and (values.get("hostfile") or values.get("hosts") or values.get("config")):
        from launcher.cli import cluster

        over_ssh = cluster.with_hosts(ctx, values)
        if over_ssh is not None:  # every host over ssh, from this command
            return cluster.run(ctx, over_ssh, obj.get("argv") or [])
    request = requests.resolve(ctx, values, os.environ)
    setup_messages(request.log_level)
    return job.run(request, on_end=obj.get("on_end"))


def request_of(argv: list, env=None, prog: str = DEFAULT_PROG) -> "requests.Request":
    """The request a launch command line makes (``env``: the environment it reads; this process's by default)."""
    with launch.make_context(prog, list(argv)) as ctx:
        return requests.resolve(ctx, dict(ctx.params), os.environ if env is None else env)


TOOL_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(context_settings=TOOL_CONTEXT)
@click.argument("log_dir", required=False, default=".")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="The same as a JSON document, {\"nodes\": [...]}: what the monitor's /status.json serves.")
def status_command(log_dir: str, as_json: bool) -> int:
    """Show each process of the job whose --log_dir is LOG_DIR (default: the current folder):
    node, rank (or server/trainer), pid, state (running, exited N, killed by SIG, stopped),
    run time, restarts, and the last line of its log.

    Reads the state file the launcher keeps there (launcher.nodeN.json) and the logs; touches no
    process. A job whose launcher is gone is said not to run any more.
    """
    from launcher.tools import status

    streams.show(status.status(log_dir, as_json).encode(), flush=True)
    return 0


@click.command(context_settings=TOOL_CONTEXT)
@click.argument("log_dir")
@click.option("-f", "--follow", is_flag=True, default=False,
              help="Then show new lines as they come, until the job has ended (or Ctrl-C).")
@click.option("--ranks", default=None, metavar="0,3,s0",
              help="Only these logs: N for workerlog.N, sN for serverlog.N.")
@click.option("--grep", default=None, metavar="REGEX", help="Only the lines that match REGEX (Python syntax).")
@click.option("--events", is_flag=True, default=False,
              help="The job's event log instead (events.jsonl: starts, rounds, members lost or joined, exits, the stop "
                   "and its cause, the end), an event a line.")
def logs_command(log_dir: str, follow: bool, ranks, grep, events: bool) -> int:
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
    if events:
        from launcher.tools import events as event_tool

        if ranks is not None:
            raise LaunchError("--ranks chooses logs, not events; use --grep 'rank 3' with --events.")
        event_tool.show(log_dir, follow, log_tool.compile_grep(grep), streams.show, lambda: follow_tool.job_running(log_dir))
        return 0
    if follow and not follow_tool.job_running(log_dir):
        follow = False  # a job that has ended: a dump, as without -f
    write = follow_tool.Paced(log_dir, streams.to_console, lambda: console.has_room(1), console.wait) if follow \
        else streams.show
    gone = log_tool.show(log_dir, follow, ranks, grep, write)
    if gone:
        log.warning(gone)
    return 0


@click.command(context_settings={**TOOL_CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--space", required=True, metavar="FILE.yaml",
              help="The knobs and the values to try (docs/tuning.md): launch options by name, env.NAME, "
                   "strategy.FIELD, arg.--flag; metric, trial_seconds.")
@click.option("--out", default=None, metavar="FILE.yaml", help="Where the best trial's config goes (default: "
              "tuned.yaml in the log dir); python -m launcher --config FILE.yaml SCRIPT runs it.")
@click.option("--resume", is_flag=True, default=False, help="Go on from the log dir's history (tune.jsonl): the "
              "trials measured there are not run again.")
@click.option("--plot", default=None, metavar="FILE.png", help="Draw the trials (needs matplotlib: the bench extra).")
@click.option("--tune_port", "--tune-port", default=TUNE_PORT, show_default=True, type=click.IntRange(1, 65535),
              help="A job of nodes started on their own: where node 0's tuner leads the others' (the same on each).")
@click.argument("launch_args", nargs=-1, type=click.UNPROCESSED, metavar="[LAUNCH OPTIONS] SCRIPT [ARGS]")
@click.pass_context
def tune_command(ctx: click.Context, space: str, out, resume: bool, plot, tune_port: int, launch_args: tuple) -> int:
    """Search the knobs of --space for the fastest settings of SCRIPT: each trial one whole job (any launch option
    works as for a job), stopped as soon as its rate is steady (the program's own reports: launcher.runtime.report),
    the slower points dropped early and the leaders measured again in alternation; at the end the table by rate,
    and the best trial's config in --out. Every trial's logs are kept in --log_dir (default tune_log), one folder
    each. tune's own options come before the launch options.
    """
    from launcher.cli import tune
    from launcher.run import tuner

    prog = ctx.command_path.rsplit(" tune", 1)[0]
    setup_messages(logging.WARNING)
    job = tune.job_of(launch, prog, space, out, resume, plot, list(launch_args), lambda argv: request_of(argv, prog=prog),
                      tune_port)
    if isinstance(job, tuner.TuneJob):
        return tuner.tune(job)
    from launcher.run import tune_follow

    return tune_follow.follow(job)


TOOLS = {"status": status_command, "logs": logs_command, "tune": tune_command}


def command_for(args: list, prog: str = DEFAULT_PROG):
    """(click command, its arguments, its name). ``status``, ``logs`` and ``tune`` are the tools
    only as the first argument and when no file of that name is in the current folder: a training
    script of that name is never shadowed."""
    if args and args[0] in TOOLS and not os.path.isfile(args[0]):
        return TOOLS[args[0]], args[1:], f"{prog} {args[0]}"
    return launch, args, prog


def prog_name(argv0: str) -> str:
    """How the user invoked us: ``launcher`` (the console script), else ``python -m launcher``."""
    name = os.path.basename(argv0 or "")
    return DEFAULT_PROG if name in ("", "__main__.py", "-c", "-m") or name.endswith(".py") else name


def main(argv=None) -> None:
    streams.open_standard_streams()
    os._exit(run_command(list(sys.argv[1:] if argv is None else argv)))  # the interpreter's teardown only costs time


def run_command(args: list, on_end=None, a_host: bool = False) -> int:
    """Run one command line to its end (everything flushed and stopped); its exit code. ``on_end(code, cause)``: told
    the job's end and its root cause; ``a_host``: a host's launcher under --hostfile's command, which ignores the
    hosts its config file names (``launcher.cli.over_ssh``)."""
    command, args, prog = command_for(args, prog_name(sys.argv[0] if sys.argv else ""))
    obj = {"argv": args, "on_end": on_end, "a_host": a_host}
    try:
        code = command.main(args=args, prog_name=prog, standalone_mode=False, obj=obj)
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
    return code or 0
