"""torchrun's command line (torch/distributed/run.py), mapped onto the launcher's own options.

``--nproc-per-node``, ``--max-restarts``, ``--log-dir``, ``-m``, ``--no-python`` are the launcher's own
options already (every option has a dashed spelling), and ``--nnodes`` is shared with Paddle 2.6/3.x's
command line (launcher.cli.paddle): it is torchrun's unless Paddle's options name the nodes
(``--ips``, ``--master``, ``--rank``, ``--host``, or Paddle 1.8's ``--cluster_node_ips``), where it is
Paddle's check of the nodes found. The others are in TORCHRUN_OPTIONS;
``to_ours`` turns what was given into the launcher's values: nodes, ranks and the store's endpoint
into a cluster of fixed size (gathered from node 0 when there are several), ``--redirects``, ``--tee``
and ``--local-ranks-filter`` into where each worker's streams go (launcher.plan.streams), the rest into
nothing (the launcher already does what they ask, or has no such choice).
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import click

from launcher.errors import LaunchError
from launcher.plan import elastic, streams

DEFAULT_MASTER = "127.0.0.1"  # torchrun's --master-addr default
STATIC_PORT = 29500  # torchrun's --master-port default
C10D_PORT = 29400  # torchrun's port of a --rdzv-endpoint given without one
BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
START_METHODS = ("spawn", "fork", "forkserver")


@dataclass(frozen=True)
class TorchrunOption:
    name: str  # underscore spelling; the dashed one is accepted too
    kwargs: dict
    help: str


TORCHRUN_OPTIONS = (
    TorchrunOption("standalone", {"is_flag": True, "default": False},
                   "torchrun: one node, on a free port (the default here)."),
    TorchrunOption("node_rank", {"type": click.IntRange(0), "default": None, "metavar": "R"},
                   "torchrun: this node's rank, 0 to --nnodes minus 1."),
    TorchrunOption("master_addr", {"default": None, "metavar": "HOST"},
                   "torchrun: node 0's address (where rank 0 hosts the store); the other nodes join there."),
    TorchrunOption("master_port", {"type": click.IntRange(2, 65535), "default": None, "metavar": "PORT"},
                   f"torchrun: rank 0's store port (= --started_port; default {STATIC_PORT} on several nodes); "
                   "node 0's launcher also listens on PORT-1 for the other nodes."),
    TorchrunOption("local_addr", {"default": None, "metavar": "IP"},
                   "torchrun: this node's address (= --node_ip)."),
    TorchrunOption("rdzv_backend", {"type": click.Choice(BACKENDS), "default": "static", "show_default": True},
                   "torchrun: static, or c10d: with --nnodes MIN:MAX an elastic job whose membership node 0's "
                   "launcher keeps (docs/elastic.md); else both mean nodes of fixed ranks, gathered at node 0. "
                   "etcd (or etcd-v2): the membership in etcd at --rdzv-endpoint, no node is special."),
    TorchrunOption("rdzv_endpoint", {"default": None, "metavar": "HOST[:PORT]"},
                   "torchrun: node 0's address and store port (instead of --master-addr/--master-port)."),
    TorchrunOption("rdzv_id", {"default": None, "metavar": "ID"}, "torchrun: the job's id (= --job_id)."),
    TorchrunOption("rdzv_conf", {"default": None, "metavar": "K=V,..."}, "torchrun: the rendezvous settings of an elastic job (docs/elastic.md)."),
    TorchrunOption("redirects", {"short": ("-r",), "aliases": ("redirect",), "default": None, "metavar": "0-3|R:V,..."},
                   "torchrun: these streams (1 stdout, 2 stderr, 3 both; by local rank as 0:3,1:2) go to "
                   "log_dir/workerlog.N only, the others to the console."),
    TorchrunOption("tee", {"short": ("-t",), "default": None, "metavar": "0-3|R:V,..."},
                   "torchrun: these streams go to log_dir/workerlog.N and to the console."),
    TorchrunOption("local_ranks_filter", {"default": None, "metavar": "0,1,..."},
                   "torchrun: the console shows only these local ranks (the log files keep every line)."),
    TorchrunOption("role", {"default": "default", "show_default": True, "metavar": "NAME"},
                   "torchrun: the workers' ROLE_NAME."),
    TorchrunOption("run_path", {"is_flag": True, "default": False},
                   "torchrun: accepted; the script runs in a fresh interpreter, as it would by its path."),
    TorchrunOption("monitor_interval", {"type": float, "default": None, "metavar": "SECONDS"},
                   "torchrun: accepted, no effect: exits are seen as they happen."),
    TorchrunOption("start_method", {"type": click.Choice(START_METHODS), "default": None},
                   "torchrun: accepted, no effect: every worker is a fresh process."),
    TorchrunOption("event_log_handler", {"default": None, "metavar": "NAME"},
                   "torchrun: accepted, no effect: the launcher's events go to LOG_DIR/events.jsonl."),
    TorchrunOption("signals_to_handle", {"default": None, "metavar": "SIG,..."},
                   "torchrun: accepted, no effect: the launcher handles SIGTERM, SIGINT, SIGHUP and SIGQUIT, and passes "
                   "SIGUSR1 and SIGUSR2 on to the workers (docs/logs.md)."),
    TorchrunOption("duplicate_stdout_filters", {"default": None, "metavar": "TEXT,..."},
                   "torchrun: accepted, no effect: find lines with launcher logs --grep."),
    TorchrunOption("duplicate_stderr_filters", {"default": None, "metavar": "TEXT,..."},
                   "torchrun: accepted, no effect: find lines with launcher logs --grep."),
    TorchrunOption("virtual_local_rank", {"is_flag": True, "default": False},
                   "torchrun: refused: every worker sees its own LOCAL_RANK and FLAGS_selected_gpus here."),
)
NAMES = tuple(o.name for o in TORCHRUN_OPTIONS)
PADDLE_NODE_OPTIONS = ("ips", "master", "rank", "host", "cluster_node_ips", "use_paddlecloud")
TORCHRUN_NODE_OPTIONS = ("standalone", "node_rank", "master_addr", "master_port", "rdzv_endpoint")


def options(option_maker):
    """A decorator adding TORCHRUN_OPTIONS to a click command; ``option_maker(name, **kwargs)`` spells them."""
    def decorate(f):
        for o in reversed(TORCHRUN_OPTIONS):
            f = option_maker(o.name, help=o.help, **dict(o.kwargs))(f)
        return f
    return decorate


# Where a scheduler that starts one launcher per node says which node this is (srun, mpirun): the node
# rank of a c10d rendezvous given no --node-rank, as in pytorch/examples' `srun torchrun --rdzv_backend c10d`.
NODE_RANK_VARS = ("SLURM_NODEID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def to_ours(values: dict, given, env=None) -> dict:
    """The launcher's values for torchrun's; ``given(name)``: whether the user gave that option;
    ``env``: the launcher's environment (a scheduler's node rank)."""
    ours = {k: v for k, v in values.items() if k not in NAMES}
    ours["role"] = values["role"]
    _check_monitor_interval(values["monitor_interval"])
    if values["virtual_local_rank"]:
        raise LaunchError("--virtual-local-rank (every worker seeing LOCAL_RANK=0) is not supported: each worker sees "
                          "its own LOCAL_RANK and its GPU in FLAGS_selected_gpus; leave the option (or PET_VIRTUAL_LOCAL_RANK) out.")
    ours.update(_streams(values, given))
    if values["local_addr"]:
        ours["node_ip"] = values["local_addr"]
    if values["rdzv_id"] and not given("job_id"):
        ours["job_id"] = values["rdzv_id"]
    if any(given(name) for name in PADDLE_NODE_OPTIONS):
        named = ", ".join(f"--{n.replace('_', '-')}" for n in TORCHRUN_NODE_OPTIONS if values.get(n) is not None and values.get(n) is not False)
        if named:
            hint = " (beside --cluster_node_ips or --ips, this node's rank is --rank)" if values.get("node_rank") is not None else ""
            raise LaunchError(f"{named} (torchrun's) and Paddle's node options both name the nodes; give one of them{hint}.")
        return ours  # --nnodes stays Paddle's: a check of the nodes found
    if _elastic_range(values):
        return {**ours, **_elastic(values, given)}
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


def _elastic_range(values: dict) -> bool:
    """An elastic job: ``--nnodes MIN:MAX``, or any count with ``--rdzv-backend etcd`` (whose membership may change
    at any count); not with ``--standalone``."""
    low, colon, high = str(values.get("nnodes") or "").strip().partition(":")
    in_etcd = str(values.get("rdzv_backend") or "").strip().lower().startswith("etcd")
    return (in_etcd or (bool(colon) and low.strip() != high.strip())) and not values["standalone"]


def _elastic(values: dict, given) -> dict:
    """``--nnodes MIN:MAX``: the ElasticSpec (``elastic``), whose rounds give the number of nodes and this node's
    rank (``launcher.cli.elastic``); node 0's launcher keeps the membership on the endpoint's port, the
    workers' ports (rank 0's store first) start one above it."""
    spec = elastic.from_torchrun({**values, "cluster_node_ips": values.get("cluster_node_ips") if given("cluster_node_ips") else None},
                                 os.environ)
    if spec.backend == "etcd":  # each round's node 0 hosts rank 0's store on the workers' ports (6070 on)
        return {"elastic": spec, "nnodes": None}
    ours = {"elastic": spec, "master_addr": spec.host, "nnodes": None}
    if not given("started_port"):
        ours["started_port"] = spec.port + 1
    return ours


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
    """--node-rank; for c10d without it, the scheduler's node index (torchrun would take the order of joining)."""
    if values["node_rank"] is not None or nodes == 1:
        return values["node_rank"] or 0
    if values["rdzv_backend"] != "c10d":
        return 0  # torchrun's static default
    for name in NODE_RANK_VARS:
        text = env.get(name, "").strip()
        if text.isascii() and text.isdigit():
            return int(text)
    raise LaunchError(f"--rdzv-backend c10d with --nnodes {nodes} needs --node-rank on each node (or srun/mpirun, "
                      f"whose node index is taken): this launcher gives nodes fixed ranks, 0 to {nodes - 1}.")


def _nodes(values: dict) -> Optional[int]:
    """--nnodes as a fixed count (--standalone: 1); None when not given."""
    if values["standalone"]:
        if values.get("nnodes") not in (None, "1", "1:1"):
            raise LaunchError(f"--standalone runs one node, but --nnodes is {values['nnodes']}; give one of them.")
        return 1
    text = values.get("nnodes")
    if text is None:
        return None
    low, colon, high = text.strip().partition(":")
    if not low.isascii() or not low.isdigit() or int(low) < 1:
        raise LaunchError(f"--nnodes {text} is not a number of nodes; give a whole number such as 2.")
    return int(low)


def _store_endpoint(values: dict, nodes: int):
    """(node 0's address, rank 0's store port or None for a free one): --rdzv-endpoint, else
    --master-addr/--master-port; --standalone: this node, a free port."""
    if values["standalone"]:
        return None, None
    endpoint = values["rdzv_endpoint"]
    if endpoint:
        host, colon, port = endpoint.rpartition(":")
        if not colon or endpoint.endswith("]"):  # no port: torchrun's c10d default
            host, port = endpoint, str(C10D_PORT)
        host = host.strip("[]")
        if not host or not port.isascii() or not port.isdigit() or not 2 <= int(port) <= 65535:
            raise LaunchError(f"--rdzv-endpoint {endpoint} is not HOST:PORT; give node 0's address and a port such as 10.0.0.1:29400.")
        return host, int(port)
    port = values["master_port"]
    if port is None and nodes > 1:
        port = STATIC_PORT
    return values["master_addr"] or DEFAULT_MASTER, port
