"""The launch command's one typed request: the command line, ``--config``, torchrun's ``PET_*`` variables and the
other launchers' spellings resolved once into the options, the elastic spec (or none) and the nodes expected, with
where each value came from.

The precedence is written once, in ``_layers``: the command line over ``--config`` over ``PET_*`` over the defaults.
An option the table refuses is refused there, in one sentence; an alias row's value, whatever its dialect, goes to
the option it names; then torchrun's spellings (``launcher.cli.torchrun``) and Paddle 2.6/3.x's
(``launcher.cli.paddle``) are mapped onto this launcher's own options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional

import click

from launcher.cli import pet, table
from launcher.cli import torchrun as torchrun_cli
from launcher.errors import LaunchError

if TYPE_CHECKING:  # the plan's model is imported by a launch only: --help stays fast
    from launcher.plan.elastic_spec import ElasticSpec
    from launcher.plan.model import LaunchOptions

COMMAND_LINE, CONFIG_FILE, DEFAULT, ENVIRONMENT = "command line", "config file", "default", "environment"


@dataclass(frozen=True)
class Request:
    """What the user asked for, resolved once."""

    options: "LaunchOptions"  # an elastic job's: those of a round of two nodes, this one node 0 (each round replaces them)
    elastic: Optional["ElasticSpec"] = None  # None: a job of fixed nodes
    nodes_expected: Optional[int] = None  # --nnodes N of a fixed job: the number of nodes the plan must find
    print_config: bool = True
    log_level: int = 20
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)  # each option not at its default: from where

    def for_round(self, hosts: tuple, node_rank: int, workers: tuple = ()) -> "LaunchOptions":
        """An elastic round's options: its nodes by node rank, this node's rank among them, each node's number of
        workers (they may differ)."""
        return dataclasses.replace(self.options, nnodes=len(hosts), node_rank=node_rank,
                                   cluster_node_ips=",".join(hosts), node_ip=hosts[node_rank], node_workers=tuple(workers))


def resolve(ctx: click.Context, values: dict, env: Mapping[str, str]) -> Request:
    """The request of a launch command's parsed ``values`` (``ctx``: whose parameters tell which were given)."""
    values, sources = _layers(ctx, values, env)
    given = lambda name: sources.get(name, DEFAULT) != DEFAULT  # noqa: E731
    _refuse(values, given)
    shown = lambda name: sources[name] if sources.get(name, "").startswith("PET_") else table.ROW[name].shown[0]  # noqa: E731
    values = torchrun_cli.to_ours(_aliased(values, sources, shown), given, env, shown)
    log_level = values["log_level"]
    if "elastic" not in values:
        from launcher.cli import paddle as paddle_cli

        values = {**values, **(paddle_cli.elastic(values, given, env) or {})}
    spec = values.pop("elastic", None)
    if spec is not None:
        trial = {**values, "nnodes": 2, "node_rank": 0, "cluster_node_ips": f"{spec.host},{spec.host}",
                 "node_ip": spec.host}
        options, _ = _options(ctx, trial, given)
        return Request(options, spec, None, values["print_config"], log_level, sources)
    options, expected = _options(ctx, values, given)
    return Request(options, None, expected, values["print_config"], log_level, sources)


def _layers(ctx: click.Context, values: dict, env: Mapping[str, str]):
    """(values, the source of each): the command line over --config over PET_* over the defaults."""
    sources = {name: _source(ctx, name) for name in values}
    if values.get("config"):
        from launcher.cli import config_file

        params = {p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name != "config"}
        settings = config_file.load(values["config"], params)
        script_given = bool(values["training_script"])
        for name, value in settings.items():
            if (name == "training_script" and script_given) or (name == "training_script_args" and
                                                                 values["training_script_args"]):
                continue  # the file's arguments are used where the command line gives none after the script
            if sources.get(name, DEFAULT) == DEFAULT:
                values[name], sources[name] = value, f"{CONFIG_FILE} {values['config']}"
            elif name not in values:
                values[name], sources[name] = value, f"{CONFIG_FILE} {values['config']}"
    on_line = lambda name: sources.get(name, DEFAULT) != DEFAULT  # noqa: E731
    from_pet, names = pet.values_from(env, ctx, on_line)
    values.update(from_pet)
    sources.update({name: pet.variable(name) for name in names})
    return values, sources


def _refuse(values: dict, given) -> None:
    """An option the table refuses, given with a value that asks for something: its reason, in one sentence."""
    for row in table.rows(status=table.REFUSED):
        value = values.get(row.name)
        if given(row.name) and value is not None and str(value).strip().lower() not in row.harmless:
            shown = row.spellings[-1] if table.TORCHRUN in row.dialects else row.spellings[0]
            raise LaunchError(f"{shown} {value} cannot be honoured: {row.reason}; drop {shown}.")


def _aliased(values: dict, sources: dict, shown) -> dict:
    """Each alias row given (whatever launcher's spelling it is) as the option it names, given from where the alias
    was (``sources``), before either dialect's options are mapped onto ours; two values for one option are refused."""
    out, by = dict(values), {}
    for row in table.rows(status=table.ALIAS):
        if sources.get(row.name, DEFAULT) == DEFAULT:
            continue
        target = row.maps_to
        first = by.get(target, target if sources.get(target, DEFAULT) != DEFAULT else None)
        if first is not None and out[target] != out[row.name]:
            raise LaunchError(f"{shown(row.name)} {out[row.name]} disagrees with {shown(first)} {out[target]}, which is "
                              "the same option; give one of them.")
        out[target], by[target], sources[target] = out[row.name], row.name, sources[row.name]
    return out


def given_in(ctx: click.Context):
    """Whether the command line of ``ctx`` gave an option (a test's view of one layer)."""
    return lambda name: _source(ctx, name) != DEFAULT


def _source(ctx: click.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    if source in (None, click.core.ParameterSource.DEFAULT):
        return DEFAULT
    return ENVIRONMENT if source == click.core.ParameterSource.ENVIRONMENT else COMMAND_LINE


def _options(ctx: click.Context, values: dict, given):
    """(LaunchOptions, the --nnodes to check the plan against): Paddle 2.6/3.x's options mapped onto ours."""
    from launcher.cli import paddle as paddle_cli
    from launcher.plan.model import LaunchOptions

    named = {n for n in values if given(n)}
    values = paddle_cli.translate(values, named)
    expected = paddle_cli.expected_nodes(values, named)
    if not isinstance(values.get("nnodes"), (int, type(None))):  # Paddle's --nnodes: only that check
        values = {**values, "nnodes": None}
    if not values["training_script"]:
        raise LaunchError(f"no training script given; usage: {ctx.command_path} [OPTIONS] training_script [ARGS]...")
    fields = {f.name: values[f.name] for f in dataclasses.fields(LaunchOptions) if f.name in values}
    fields["training_script_args"] = tuple(values["training_script_args"] or ())
    return LaunchOptions(**fields, extra_env=_env_file(values.get("env_file")) + tuple(values.get("env", ()))), expected


def _env_file(path) -> tuple:
    """--env_file's variables, as (name, value) pairs; --env's come after them, and win."""
    if not path:
        return ()
    from launcher.cli import config_file

    return tuple(config_file.env_file(path).items())
