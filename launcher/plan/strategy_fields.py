"""The fields of fleet's ``DistributedStrategy`` (``launcher.fleet.strategy``) that a config file's ``strategy:`` and a
tuning space's ``strategy.NAME`` set over the program's own strategy, with the values each takes; carried to the
workers as JSON in one variable (``envvars.STRATEGY``), which fleet applies when the strategy comes into force.
Pure: the launcher never imports the worker side (tests/test_strategy_fields.py keeps this table and the dataclass
the same)."""

from __future__ import annotations

import json
from typing import Mapping

from launcher.errors import LaunchError

# name -> the least whole number it takes, or None for true/false
FIELDS = {
    "nccl_comm_num": 1, "fuse_all_reduce_ops": None, "use_hierarchical_allreduce": None,
    "hierarchical_allreduce_inter_nranks": 0, "use_local_sgd": None, "local_sgd_steps": 1,
    "local_sgd_is_warm_steps": 0, "fetch_frequency": 1, "num_threads": 1, "num_iteration_per_drop_scope": 1,
}


def check(name: str, value, where: str):
    """``value`` for the field ``name``; LaunchError naming ``where`` when the field is unknown or refuses it."""
    if name not in FIELDS:
        raise LaunchError(f"{where} is not a field of fleet's DistributedStrategy; the fields are "
                          f"{', '.join(FIELDS)}.")
    low = FIELDS[name]
    if low is None:
        if not isinstance(value, bool):
            raise LaunchError(f"{where} expects true or false, not {value!r}.")
    elif not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise LaunchError(f"{where} expects a whole number of at least {low}, not {value!r}.")
    return value


def encode(fields: Mapping) -> str:
    """The variable's value: the fields as a JSON object, in a stable order."""
    return json.dumps(dict(sorted(fields.items())), separators=(",", ":"))
