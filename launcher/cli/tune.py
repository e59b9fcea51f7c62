"""``python -m launcher tune --space FILE [launch options] SCRIPT [ARGS]``: the command line of the tuner made into a
``launcher.run.tuner.TuneJob``, every knob and value of the space checked before any trial: an option by the one
table of options and its click type (``config_file.convert``, as a config file's value), the launch given to tune
with each point of the space over it resolved as the launch command resolves it."""

from __future__ import annotations

import os
import re
import shlex
import socket
import tempfile

import click

from launcher import envvars as ev
from launcher.cli import config_file, table
from launcher.errors import LaunchError
from launcher.output import log_files, tune_lines
from launcher.plan import tune_space, tune_trial
from launcher.plan.tune_nodes import TUNE_PORT, tune_nodes
from launcher.plan.common import check_run_options

OWN_OPTIONS = ("--space", "--out", "--resume", "--plot", "--tune_port")
OWN_OF_TRIALS = table.names(tag=table.TUNER_OWN)  # given to each trial by the tuner
DEFAULT_LOG_DIR = "tune_log"


def job_of(launch: click.Command, prog: str, space_path: str, out, resume: bool, plot, args: list, resolve,
           tune_port: int = TUNE_PORT):
    """The TuneJob of tune's command line (``launch``: the launch command; ``resolve(argv)``: its request); on a node
    that follows the leading tuner of a job of several nodes, its FollowJob."""
    from launcher.run.tuner import TuneJob

    try:
        ctx = launch.make_context(f"{prog} tune", list(args))
    except click.NoSuchOption as e:
        if e.option_name not in OWN_OPTIONS:
            raise
        raise LaunchError(f"tune's own {e.option_name} comes before the launch options: {prog} tune --space FILE "
                          f"[--out FILE] [--resume] [--plot FILE] [launch options] SCRIPT [ARGS].") from None
    with ctx:
        if not ctx.params.get("training_script"):
            raise LaunchError(f"no training script given; usage: {prog} tune --space FILE [launch options] SCRIPT "
                              "[ARGS].")
        params = {p.name: p for p in launch.params if isinstance(p, click.Option)}
        base = _base(launch.make_parser(ctx).parse_args(list(args))[0], params, ctx)
    raw_log_dir = base.get("log_dir")
    base = {name: value for name, value in base.items() if name not in OWN_OF_TRIALS}
    if plot:
        _check_plot(plot)
    space = tune_space.parse(config_file.read(space_path, "space file", "--space"), f"space file {space_path}",
                             _option_checker(params, base))
    _check_points(space, base, space_path, resolve)
    log_dir = raw_log_dir or DEFAULT_LOG_DIR
    log_files.make_log_dir(log_dir)
    for option, path in (("--out", out or os.path.join(log_dir, "tuned.yaml")), ("--plot", plot)):
        if path:
            log_files.make_folder_of(path, option)
    request = _resolved(base, resolve)
    nodes = tune_nodes(request.options, request.elastic, request.nodes_expected, tune_port,
                       bool(base.get("hostfile") or base.get("hosts")))
    lead, token = None, os.environ.get(ev.JOB_TOKEN) or None
    join_timeout = request.elastic.rendezvous.join_timeout if request.elastic else request.options.join_timeout
    if nodes is not None:
        from launcher.run.tune_lead import try_to_lead

        lead = try_to_lead(nodes, token)
        if lead is None:
            from launcher.run.tune_follow import FollowJob

            name = str(base.get("node_ip") or socket.gethostname())
            return FollowJob(space, base, log_dir, nodes, token, name, join_timeout)
    command = shlex.join([*prog.split(), "tune", "--space", space_path, *(["--out", out] if out else []),
                          *(["--resume"] if resume else []), *(["--plot", plot] if plot else []), *args])
    return TuneJob(space, base, log_dir, out or os.path.join(log_dir, "tuned.yaml"), command, resume, plot, lead,
                   join_timeout)


def _check_plot(path: str) -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise LaunchError("--plot needs matplotlib: pip install 'launcher[bench]' (or leave --plot out).")
    ending = os.path.splitext(path)[1][1:].lower()
    formats = tune_lines.plot_formats()
    if ending not in formats:
        this = f"ending in .{ending}" if ending else "with no ending"
        raise LaunchError(f"--plot {path}: matplotlib cannot draw to a file {this}; give one ending in "
                          f"{', '.join('.' + f for f in formats)}, say {os.path.splitext(path)[0]}.png.")


def _base(raw: dict, params: dict, ctx: click.Context) -> dict:
    """The launch given to tune as config settings: a --config's own, the command line's over them (as their text,
    which the config file reads with the same types)."""
    base = {}
    if raw.get("config"):
        config_file.load(raw["config"], {n: p for n, p in params.items() if n != "config"})  # checked as a launch would
        base = {str(k).replace("-", "_"): v for k, v in config_file.read(raw["config"]).items()}
    for name, value in raw.items():
        if name in params and name != "config":
            base[name] = _setting(params[name], value, ctx)
    base["training_script"] = ctx.params["training_script"]
    if ctx.params["training_script_args"] or "training_script_args" not in base:
        base["training_script_args"] = list(ctx.params["training_script_args"])
    return base


def _setting(param: click.Parameter, text, ctx: click.Context):
    """An option's text as the config file holds it: true/false for a boolean, a number for an option of numbers, the
    text itself otherwise (read again by the option's own type)."""
    if param.type is click.BOOL:
        return param.type.convert(text, param, ctx)
    if isinstance(text, str) and param.type is not click.STRING:
        if re.fullmatch(r"[-+]?[0-9]+", text):
            return int(text)
        if re.fullmatch(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?", text):
            return float(text)
    return text  # 2:3 stays text (YAML would read it as 123, a number in base 60)


def _option_checker(params: dict, base: dict):
    def check(name: str, value, where: str) -> str:
        key = name.replace("-", "_")
        row = table.ROW.get(key)
        if row is None or key not in params:
            raise LaunchError(f"{where} is neither a launch option nor env.NAME, strategy.FIELD or arg.--flag; "
                              "write a launch option by its name (nproc_per_node), or one of those.")
        if key in OWN_OF_TRIALS:
            raise LaunchError(f"{where}: --{key} is the tuner's own for each trial; it cannot be a knob.")
        if row.status in (table.REFUSED, table.NO_EFFECT):
            raise LaunchError(f"{where}: the launch takes --{key} with no effect or refuses it ({row.reason}); "
                              "it cannot change a trial.")
        if key in base:
            raise LaunchError(f"{where} is also given to the launch; leave --{key} out of the command line (or its "
                              "config): the space tries its values.")
        config_file.convert(params[key], key, value, where)
        return key
    return check


def _resolved(settings: dict, resolve):
    """The request of a launch of these config settings."""
    with tempfile.TemporaryDirectory(prefix="launcher-tune-") as folder:
        path = os.path.join(folder, "launch.yaml")
        with open(path, "w") as f:
            f.write(tune_trial.to_yaml(settings, ""))
        return resolve(["--config", path])


def _check_points(space: tune_space.Space, base: dict, space_path: str, resolve) -> None:
    """Each point's launch resolved as the launch command would resolve it: a combination it refuses is refused now,
    naming the point."""
    with tempfile.TemporaryDirectory(prefix="launcher-tune-") as folder:
        path = os.path.join(folder, "point.yaml")
        for point in space.points():
            with open(path, "w") as f:
                f.write(tune_trial.to_yaml(tune_trial.config(base, space, point), ""))
            try:
                check_run_options(resolve(["--config", path]).options)
            except (LaunchError, click.ClickException) as e:
                text = e.format_message() if isinstance(e, click.ClickException) else str(e)
                raise LaunchError(f"space file {space_path}: the point {tune_space.label(point)} is refused: "
                                  f"{text.replace(f'config file {path}: ', '')}") from None
