"""The command lines of Paddle 2.6/3.x's ``paddle.distributed.launch`` and of ``fleetrun``, mapped onto this
launcher's options. Pure: option values in, option values out; what cannot be honoured raises LaunchError
naming the reason. Paddle 1.8's options (``launch`` and ``launch_ps``) are this launcher's own.
"""

from __future__ import annotations

import ipaddress
from typing import Optional

from launcher.cli import table
from launcher.errors import LaunchError
from launcher.plan import elastic as elastic_options
from launcher.plan import elastic_backends as backends

PS_OPTIONS = table.names(tag=table.PARAMETER_SERVERS)


def translate(values: dict, given: set) -> dict:
    """This launcher's option values, with the Paddle 2.6/3.x ones (``given``: the names set by the user) mapped
    onto them; the Paddle names are left in ``values`` for the caller's checks (``expected_nodes``). Alias rows
    are the request's (``launcher.cli.request``), whatever their dialect."""
    out = dict(values)
    if _flag(out, given, "sort_ip"):
        out["cluster_node_ips"] = ",".join(sorted(out["cluster_node_ips"].split(","), key=_address_key))
    if _flag(out, given, "log_overwrite"):
        raise LaunchError("--log_overwrite true cannot be honoured: logs are appended, each run opening with a header "
                          "line; remove the old logs first, or give a new --log_dir.")
    _flag(out, given, "legacy")  # checked only: both command lines are taken whatever it says
    _elastic_level(out, given)
    _rank(out, given)
    _master(out, given)
    _run_mode(out, given)
    _backend(out, given)
    _gloo_only_with_servers(out, given)
    return out


def elastic(values: dict, given, env=None) -> Optional[dict]:
    """Paddle 3.x's ``--nnodes MIN:MAX --master IP:PORT`` (or ``--master etcd://...``) and fleetrun's
    ``--elastic_server HOST:PORT --job_id ID --np N[:M]``: the ElasticSpec (``elastic``) and the values its first
    round completes (the nodes, this node's rank; the control channel on PORT); None for a fixed job.
    ``given(name)``: whether the user gave that option; ``env``: the launcher's environment."""
    env = env or {}
    named = {name: value for name, value in values.items() if given(name)}  # each reader takes the names it knows
    if given("elastic_server") or env.get("PADDLE_ELASTIC_SERVER"):  # Paddle 2.x's elastic mode
        spec = elastic_options.from_paddle2({**named, "np": named.get("nnodes")}, env)
        if not spec.backend_row.has_node_0:
            return {**elastic_options.first_round(spec, given("started_port")), "elastic_server": None}
    url_master = given("master") and backends.for_url(values.get("master")) is not None  # a backend's, not node 0's
    nodes = values.get("nnodes")  # a NodeRange; a whole number once torchrun's options took it as theirs
    if not given("nnodes") or isinstance(nodes, int):
        return None
    by_arrival = not url_master and _by_arrival(values, given, env)
    if not url_master and not nodes.elastic and not by_arrival:
        return None
    spec = elastic_options.from_paddle3(named, env, by_arrival)
    if spec.backend_row.has_node_0 and (given("ips") or spec.port is None):
        raise LaunchError(f"--nnodes {values['nnodes']} runs an elastic job around node 0's --master IP:PORT; give "
                          "--master (the same on every node) and no --ips.")
    return {**elastic_options.first_round(spec, given("started_port")), "master": None, "elastic_level": "-1"}


def _by_arrival(values: dict, given, env) -> bool:
    """Paddle's own multi-node recipe: ``--master IP:PORT --nnodes N`` of several nodes on every node, with no rank,
    no node list and no scheduler that says which node this is: the nodes take their ranks in the order they arrive
    at node 0, an elastic job of N:N (launchers past N wait as standbys)."""
    from launcher.plan.clusters import registry

    listed = any(given(row.name) for row in table.rows(tag=table.LISTS_NODES))
    ranked = given("rank") and str(values.get("rank")).strip() != "-1"
    return (given("master") and values["nnodes"].low > 1 and not listed and not ranked
            and values.get("cluster_env") in (None, "auto") and not registry.scheduler_found(env))


def expected_nodes(values: dict, given: set) -> Optional[int]:
    """--nnodes N (or fleetrun's --np N): the number of nodes the plan must find, or None."""
    nodes = values.get("nnodes") if "nnodes" in given else None
    if nodes is None or isinstance(nodes, int):
        return nodes
    if nodes.elastic:
        raise LaunchError(f"--nnodes {nodes} asks for an elastic job (between {nodes.low} and {nodes.high} nodes), which "
                          "needs node 0's --master IP:PORT (or torchrun's --rdzv-endpoint), the same on every node; give "
                          f"it, or one number such as --nnodes {nodes.high}.")
    return nodes.low


# ---------------------------------------------------------------- one option each


def _flag(out: dict, given: set, name: str) -> bool:
    if name not in given:
        return False
    text = str(out[name]).strip().lower()
    if text not in table.TRUE_WORDS + table.FALSE_WORDS:
        raise LaunchError(f"--{name} {out[name]} is not true or false; give true, false, 1 or 0.")
    return text in table.TRUE_WORDS


def _address_key(host: str):
    try:
        return (0, ipaddress.ip_address(host.strip()).packed, "")
    except ValueError:
        return (1, b"", host.strip())


def _elastic_level(out: dict, given: set) -> None:
    if "elastic_level" in given and str(out["elastic_level"]).strip() != "-1":
        raise LaunchError(f"--elastic_level {out['elastic_level']} sets an elastic job's answer to a failure, and this "
                          "job has a fixed number of nodes; drop it, or give --nnodes MIN:MAX with --master IP:PORT "
                          "(docs/elastic.md).")


def _rank(out: dict, given: set) -> None:
    if "rank" not in given or str(out["rank"]).strip() == "-1":
        return
    text = str(out["rank"]).strip()
    nodes = out["cluster_node_ips"].split(",")
    listed = "--ips" if "ips" in given else "--cluster_node_ips"
    if not text.isdigit() or int(text) >= len(nodes):
        raise LaunchError(f"--rank {text} is not a node rank of {listed} {out['cluster_node_ips']}; give 0 to {len(nodes) - 1}.")
    node = nodes[int(text)].strip()
    if ("host" in given or "node_ip" in given) and out["node_ip"] != node:
        raise LaunchError(f"--rank {text} is node {node} of {listed}, but --host/--node_ip is {out['node_ip']}; give one of them.")
    out["node_ip"], out["node_rank"] = node, int(text)  # the rank tells apart nodes that share a host


def _master(out: dict, given: set) -> None:
    """Paddle's --master IP:PORT of a fixed job: node 0's control channel (an elastic one is ``elastic``'s)."""
    if "master" not in given or not out["master"]:
        return
    nodes = out["cluster_node_ips"].split(",")
    _, port = elastic_options.paddle_master(out["master"], nodes[0].strip() if len(nodes) > 1 else None)
    if "control_port" in given and out["control_port"] != port:
        raise LaunchError(f"--master {str(out['master']).strip()} disagrees with --control_port {out['control_port']}; "
                          "give one of them.")
    out["control_port"] = port


def _run_mode(out: dict, given: set) -> None:
    ps_given = [n for n in PS_OPTIONS if out.get(n) is not None]
    if "trainer_num" in given and out.get("server_num") is None and out.get("servers") is None:
        out["server_num"] = 1  # Paddle 2.6/3.x's default, with its spelling of the trainer count
    mode = str(out.get("run_mode") or "").strip().lower() if "run_mode" in given else ""
    if mode in ("", "collective"):
        if mode and ps_given:
            raise LaunchError(f"--run_mode collective disagrees with --{ps_given[0]}, which asks for parameter servers; "
                              "drop one of them.")
        return
    if mode != "ps":
        raise LaunchError(f"--run_mode {out['run_mode']} is not supported; give collective or ps "
                          "(ps-heter and rpc are not supported).")
    if not any(out.get(n) is not None for n in PS_OPTIONS):
        out["server_num"], out["worker_num"] = 1, 1  # Paddle 2.6/3.x's defaults


def _gloo_only_with_servers(out: dict, given: set) -> None:
    stray = sorted((r for r in table.rows(tag=table.FLEET_GLOO) if r.name in given), key=lambda r: r.status != table.ALIAS)
    if stray and not any(out.get(n) is not None for n in PS_OPTIONS):  # an alias named first: the spelling given
        raise LaunchError(f"--{stray[0].name} sets fleet's gloo rendezvous of a parameter-server job, and this is a collective "
                          "one (whose workers meet at rank 0's store, PADDLE_MASTER); drop it, or give --server_num/--trainer_num.")


def _backend(out: dict, given: set) -> None:
    if "backend" not in given or out["backend"] is None:
        return
    name = str(out["backend"]).strip().lower()
    if name in ("auto", "nccl"):
        return  # GPU workers get NCCL, CPU workers gloo
    if name != "gloo":
        raise LaunchError(f"--backend {out['backend']} is not supported: this launcher drives CPU (gloo) and NVIDIA GPU "
                          "(nccl) workers; give auto, nccl or gloo.")
    out["env"] = tuple(out.get("env") or ()) + (("PADDLE_DISTRI_BACKEND", "gloo"),)
