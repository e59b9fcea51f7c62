"""torchrun's command line (torch/distributed/run.py), mapped onto the launcher's own options.

``--nproc-per-node``, ``--max-restarts``, ``--log-dir``, ``-m``, ``--no-python`` are the launcher's own
options already (every option has a dashed spelling), and ``--nnodes`` is shared with Paddle 2.6/3.x's
command line (launcher.cli.paddle): it is torchrun's unless Paddle's options name the nodes
(``--ips``, ``--master``, ``--rank``, ``--host``, or Paddle 1.8's ``--cluster_node_ips``), where it is
Paddle's check of the nodes found. The others are the table's rows of torchrun's alone (``own_names``);
``to_ours`` turns what was given into the launcher's values: nodes, ranks and the store's endpoint
into a cluster of fixed size (gathered from node 0 when there are several), or, for ``--nnodes MIN:MAX`` and for
PyTorch's own recipe (a count at a c10d rendezvous with no node rank), into an elastic job whose nodes take their
ranks in the order they arrive, ``--redirects``, ``--tee``
and ``--local-ranks-filter`` into where each worker's streams go (launcher.plan.streams), the rest into
nothing (the launcher already does what they ask, or has no such choice).
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Optional

from launcher.cli import table
from launcher.errors import LaunchError
from launcher.plan import c10d, elastic, streams, torchrun_values
from launcher.plan import elastic_backends as backends

DEFAULT_MASTER = "127.0.0.1"  # torchrun's --master-addr default


# Where a scheduler that starts one launcher per node says which node this is (srun, mpirun): the node
# rank of a c10d rendezvous given no --node-rank, as in pytorch/examples' `srun torchrun --rdzv_backend c10d`.
NODE_RANK_VARS = ("SLURM_NODEID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def to_ours(values: dict, given, env=None, shown=None) -> dict:
    """The launcher's values for torchrun's; ``given(name)``: whether the user gave that option;
    ``env``: the launcher's environment (a scheduler's node rank); ``shown(name)``: how a refusal names the
    option (its PET_* variable when it came from there)."""
    shown = shown or (lambda name: f"--{name.replace('_', '-')}")
    ours = {k: v for k, v in values.items() if k not in own_names()}
    ours["role"] = values["role"]
    _check_monitor_interval(values["monitor_interval"])
    ours.update(_torchrun_213(values, shown))
    ours.update(_streams(values, given))
    if values["rdzv_id"] and not given("job_id"):
        ours["job_id"] = values["rdzv_id"]
    node_rows = table.rows(tag=table.NAMES_NODES)  # torchrun's and Paddle's: one command line may not mix them
    if any(given(r.name) for r in node_rows if not r.torchruns):
        named = ", ".join(r.shown[0] for r in node_rows if r.torchruns and values[r.name] is not None
                          and values[r.name] is not False)
        if named:
            hint = " (beside --cluster_node_ips or --ips, this node's rank is --rank)" if values.get("node_rank") is not None else ""
            raise LaunchError(f"{named} (torchrun's) and Paddle's node options both name the nodes; give one of them{hint}.")
        return {**ours, **_fixed_rdzv_conf(values, given)}  # --nnodes stays Paddle's: a check of the nodes found
    if _elastic_range(values, env or {}):
        return {**ours, **_elastic(values, given, env or {})}
    ours.update(_fixed_rdzv_conf(values, given))
    nodes = _nodes(values)
    if nodes is None and values["master_port"] is None:
        return ours
    host, port = _store_endpoint(values, nodes or 1)
    if port is not None and not given("started_port"):
        ours["started_port"] = port
    ours["nnodes"] = nodes
    ours["node_rank"] = _node_rank(values, nodes or 1, env or {})
    ours["master_addr"] = host
    return ours


def own_names() -> tuple:
    """torchrun's own options (the table's rows of torchrun's alone that are not ours): turned into ours here."""
    return tuple(r.name for r in table.ROWS if r.torchruns)


def _elastic_range(values: dict, env) -> bool:
    """An elastic job: ``--nnodes MIN:MAX``, any count with ``--rdzv-backend etcd`` (whose membership may change
    at any count), or torchrun's own recipe (``_by_arrival``); not with ``--standalone``."""
    nodes = values.get("nnodes")
    row = backends.backend_named(values.get("rdzv_backend") or backends.FIXED.name)
    if values["standalone"]:
        return False
    return row.fixed_count_elastic or (nodes is not None and (nodes.elastic or _by_arrival(values, row, env)))


def _by_arrival(values: dict, row, env) -> bool:
    """torchrun's own multi-node recipe: ``--nnodes N`` (or ``N:N``) of several nodes at a rendezvous that gives the
    ranks (c10d), and no node rank, neither given nor a scheduler's: the nodes take their ranks in the order they
    arrive, an elastic job of N:N (launchers past N wait as standbys)."""
    nodes = values.get("nnodes")
    return row.elastic and nodes.low > 1 and values["node_rank"] is None and _scheduler_rank(env) is None


def _elastic(values: dict, given, env) -> dict:
    """``--nnodes MIN:MAX`` (or N by arrival): the ElasticSpec (``elastic``), whose rounds give the number of nodes and
    this node's rank (``launcher.cli.job``); node 0's launcher keeps the membership on the endpoint's port, the
    workers' ports (rank 0's store first) start one above it."""
    row = backends.backend_named(values.get("rdzv_backend") or backends.FIXED.name)
    spec = elastic.from_torchrun({**values, "cluster_node_ips": values.get("cluster_node_ips") if given("cluster_node_ips") else None},
                                 os.environ, by_arrival=values.get("nnodes") is not None and _by_arrival(values, row, env))
    return elastic.first_round(spec, given("started_port"))


def _torchrun_213(values: dict, shown) -> dict:
    """torchrun 2.13's --virtual-local-rank, --duplicate-stdout/stderr-filters, --signals-to-handle,
    --event-log-handler and --numa-binding, read as torchrun reads them (``launcher.plan.torchrun_values``)."""
    ours = {"virtual_local_rank": bool(values["virtual_local_rank"]),
            "duplicate_stdout_filters": torchrun_values.parse_filters(values["duplicate_stdout_filters"]),
            "duplicate_stderr_filters": torchrun_values.parse_filters(values["duplicate_stderr_filters"]),
            "numa_binding": values["numa_binding"]}
    if values["signals_to_handle"] is not None:
        ours["signals_to_handle"] = torchrun_values.parse_signals(values["signals_to_handle"], shown("signals_to_handle"))
    if values["event_log_handler"] is not None:
        ours["event_log_handler"] = torchrun_values.parse_event_log_handler(values["event_log_handler"])
    return ours


def _fixed_rdzv_conf(values: dict, given) -> dict:
    """--rdzv-conf of a job of fixed nodes: its keys checked as an elastic job's are; ``join_timeout`` (the static
    rendezvous's ``timeout``) is how long node 0 waits for the other nodes (--join_timeout unless given), the
    other settings have no round to set."""
    text = values.get("rdzv_conf")
    if not text:
        return {}
    conf, _ = backends.split_conf(text, backends.FIXED)  # another backend's key is refused
    rendezvous = elastic.parse_rdzv_conf(conf)
    if "join_timeout" in rendezvous.given and not given("join_timeout"):
        return {"join_timeout": rendezvous.join_timeout}
    return {}


def _check_monitor_interval(seconds: Optional[float]) -> None:
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise LaunchError(f"--monitor-interval {seconds:g} is not a positive number of seconds; give one such as 0.1 "
                          "(exits are seen as they happen here, whatever the value).")


def _streams(values: dict, given) -> dict:
    """--redirects, --tee, --local-ranks-filter as the plan's StreamChoice; a log dir of torchrun's kind
    (a fresh temporary folder) when they write log files and no --log_dir was given."""
    choice = streams.parse_choice(values["redirects"], values["tee"], values["local_ranks_filter"])
    if choice is None:
        return {}
    if choice.needs_files and not values.get("log_dir"):
        return {"stream_choice": choice, "log_dir": tempfile.mkdtemp(prefix="torchelastic_")}
    return {"stream_choice": choice}


def _node_rank(values: dict, nodes: int, env) -> int:
    """--node-rank; for c10d without it, the scheduler's node index (without one, ``_by_arrival``: an elastic job)."""
    if values["node_rank"] is not None or nodes == 1:
        return values["node_rank"] or 0
    if not backends.backend_named(values["rdzv_backend"]).elastic:
        return 0  # torchrun's static default
    return _scheduler_rank(env) or 0


def _scheduler_rank(env) -> Optional[int]:
    """The node index that srun or mpirun gives this launcher, or None."""
    for name in NODE_RANK_VARS:
        text = env.get(name, "").strip()
        if text.isascii() and text.isdigit():
            return int(text)
    return None


def _nodes(values: dict) -> Optional[int]:
    """--nnodes as a fixed count (--standalone: 1); None when not given."""
    nodes = values.get("nnodes")
    if values["standalone"]:
        if nodes is not None and (nodes.elastic or nodes.low != 1):
            raise LaunchError(f"--standalone runs one node, but --nnodes is {nodes}; give one of them.")
        return 1
    return None if nodes is None else nodes.low


def _store_endpoint(values: dict, nodes: int):
    """(node 0's address, rank 0's store port or None for a free one): --rdzv-endpoint, else
    --master-addr/--master-port; --standalone: this node, a free port."""
    if values["standalone"]:
        return None, None
    if values["rdzv_endpoint"]:
        return c10d.parse_rdzv_endpoint(values["rdzv_endpoint"])
    port = values["master_port"]
    if port is None and nodes > 1:
        port = table.STATIC_PORT
    return values["master_addr"] or DEFAULT_MASTER, port
