"""torchrun's ``PET_*`` variables: every option torchrun reads from the environment (``PET_`` and the option's name in
capitals, as torch's argparse_util reads them), taken as if it were on the command line, unless the command line or
--config gives that option. A value is checked as the option's is (a bad one: exit 2, naming the variable); a flag
is on for a whole number other than 0, as torchrun reads it.

Kubeflow's Training Operator starts a PyTorchJob's pods with them (an elastic one: ``PET_NNODES=MIN:MAX``,
``PET_RDZV_ENDPOINT``, ``PET_RDZV_BACKEND``, ...), and so do users who set them by hand. In a job of fixed size the
node variables (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NPROC_PER_NODE``)
stay the Kubeflow cluster source's (``launcher.plan.clusters.kubeflow``), which names every pod; an elastic range,
or a rendezvous backend with its endpoint, makes them this launcher's elastic options.
"""

from __future__ import annotations

from typing import Callable, Mapping, Tuple

import click

from launcher.cli import table
from launcher.errors import LaunchError
from launcher.plan import elastic_backends as backends
from launcher.plan.parsing import node_range


def variable(name: str) -> str:
    return f"PET_{name.upper()}"


def values_from(env: Mapping[str, str], ctx: click.Context, given: Callable[[str], bool]) -> Tuple[dict, set]:
    """(the options the PET_* variables of ``env`` give, and their names): each one the command line does not."""
    params = {p.name: p for p in ctx.command.params if isinstance(p, click.Option)}
    rows = [r for r in read_rows() if variable(r.name) in env and not given(r.name) and r.name in params]
    if not _elastic(env):  # a fixed job's node variables are the Kubeflow cluster source's
        rows = [r for r in rows if table.KUBEFLOW_NODES not in r.tags]
    found = {r.name: (_flag(env, r.name) if r.click.get("is_flag") else _value(env, r.name, params[r.name], ctx))
             for r in rows}
    return found, set(found)


def read_rows() -> tuple:
    """torch/distributed/run.py's options read with argparse_util.env / check_env: the table's rows marked pet."""
    return tuple(r for r in table.ROWS if r.pet)


def _elastic(env: Mapping[str, str]) -> bool:
    """An elastic range of nodes, or a rendezvous backend other than static with its endpoint."""
    try:
        elastic = node_range(env.get(variable("nnodes"), "")).elastic
    except ValueError:
        elastic = False  # not a number of nodes: refused as the option's value is, naming the variable
    backend = env.get(variable("rdzv_backend"), "").strip().lower()
    return elastic or (
        backend not in ("", backends.FIXED.name) and bool(env.get(variable("rdzv_endpoint"), "").strip()))


def _value(env: Mapping[str, str], name: str, param: click.Option, ctx: click.Context):
    raw = env[variable(name)]
    try:
        return param.type_cast_value(ctx, raw)
    except click.BadParameter as e:
        raise LaunchError(f"{variable(name)}={raw}: {e.message.rstrip('.')}; fix the variable, or give "
                          f"--{name.replace('_', '-')} on the command line (which wins over it).") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env[variable(name)]
    try:
        return int(raw) != 0
    except ValueError:
        raise LaunchError(f"{variable(name)}={raw} is not a flag's value; torchrun reads 1 (on) or 0 (off).") from None
