"""The command lines of Paddle 2.6/3.x's ``paddle.distributed.launch`` and of ``fleetrun``, mapped onto this
launcher's options. Pure: option values in, option values out; what cannot be honoured raises LaunchError
naming the reason. Paddle 1.8's options (``launch`` and ``launch_ps``) are this launcher's own.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from launcher.errors import LaunchError
from launcher.plan import elastic as elastic_options

_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off", "")


@dataclass(frozen=True)
class PaddleOption:
    name: str  # the click parameter, and the config file's key
    aliases: tuple
    metavar: str
    help: str


# Taken and mapped onto this launcher's options (translate)
MAPPED = (
    PaddleOption("devices", ("gpus",), "IDS", "Paddle 2.6/3.x, fleetrun: GPU ids, as --selected_gpus."),
    PaddleOption("ips", (), "IPS", "Paddle 2.6/3.x, fleetrun: every node's address, as --cluster_node_ips."),
    PaddleOption("host", (), "IP", "Paddle 2.6/3.x, fleetrun: this node's address, as --node_ip."),
    PaddleOption("rank", (), "N", "Paddle 2.6/3.x: this node's rank, its place in --ips or --cluster_node_ips (-1: found "
                                  "from --host); needed where nodes share a host (an address listed twice)."),
    PaddleOption("nnodes", ("np",), "N", "Paddle 2.6/3.x, fleetrun: the number of nodes, checked against the nodes found; "
                                          "N:M with --master: an elastic job (docs/elastic.md)."),
    PaddleOption("master", (), "IP:PORT", "Paddle 2.6/3.x: the rendezvous: node 0 (the first of --ips) listens on PORT, "
                                          "as --control_port; etcd://HOST:PORT with --nnodes: the membership in etcd."),
    PaddleOption("elastic_server", (), "HOST:PORT", "fleetrun (Paddle 2.x): etcd's endpoint, with --job_id and --np: "
                                                   "an elastic job whose membership is in etcd (docs/elastic.md)."),
    PaddleOption("trainers", (), "IP:PORT,...", "Paddle 2.6/3.x: every trainer's endpoint, as --workers."),
    PaddleOption("trainer_num", (), "N", "Paddle 2.6/3.x: trainers on this node, as --worker_num (servers: 1 when not given)."),
    PaddleOption("max_restart", (), "N", "Paddle 2.6/3.x: as --max_restarts (Paddle's default is 3, this launcher's 0)."),
    PaddleOption("run_mode", (), "MODE", "Paddle 2.6/3.x, fleetrun: collective, or ps (1 server, 1 trainer unless told)."),
    PaddleOption("backend", (), "NAME", "fleetrun: auto, nccl or gloo (PADDLE_DISTRI_BACKEND)."),
    PaddleOption("elastic_timeout", (), "SECONDS", "Paddle 2.6/3.x: how long to wait for the other nodes, as --join_timeout."),
    PaddleOption("elastic_level", (), "N", "Paddle 2.6/3.x, with --nnodes MIN:MAX: -1 or 1, a worker failure restarts "
                 "the job (up to --max_restart); 0, the failing node leaves and the others go on. A fixed job: -1 only."),
    PaddleOption("http_port", (), "PORT", "fleetrun: fleet's gloo port, as --gloo_port."),
    PaddleOption("sort_ip", (), "BOOL", "Paddle 2.6/3.x: rank the nodes by address."),
    PaddleOption("log_overwrite", (), "BOOL", "Paddle 2.6/3.x: false only: logs are appended, one header line per run."),
    PaddleOption("legacy", (), "BOOL", "Paddle 2.6/3.x: either: both command lines are taken at once."),
)

# Taken only to be refused, saying why (a value in ``harmless`` is accepted: it asks for nothing)
REFUSED = {
    "npus": ("Ascend NPUs are not supported: this launcher drives CPU and NVIDIA GPU workers", ()),
    "xpus": ("Kunlun XPUs are not supported: this launcher drives CPU and NVIDIA GPU workers", ()),
    "selected_xpus": ("Kunlun XPUs are not supported: this launcher drives CPU and NVIDIA GPU workers", ()),
    "enable_gpu_log": ("this launcher records no GPU log (run nvidia-smi alongside)", _FALSE),
    "auto_parallel_config": ("Paddle's auto-parallel tuner is not supported", ()),
    "auto_cluster_config": ("Paddle's auto-parallel tuner is not supported", _FALSE),
    "auto_tuner_json": ("Paddle's auto-parallel tuner is not supported", ()),
    "cluster_topo_path": ("fleetrun's rank auto-mapping is not supported", ()),
    "rank_mapping_path": ("fleetrun's rank auto-mapping is not supported", ()),
    "enable_auto_mapping": ("fleetrun's rank auto-mapping is not supported", _FALSE),
    "coordinators": ("federated parameter servers (coordinators) are not supported", ()),
    "coordinator_num": ("federated parameter servers (coordinators) are not supported", ("0",)),
    "heter_workers": ("heterogeneous parameter servers are not supported", ()),
    "heter_devices": ("heterogeneous parameter servers are not supported", ()),
    "heter_worker_num": ("heterogeneous parameter servers are not supported", ("0",)),
    "elastic_pre_hook": ("elastic training (etcd) is not supported; --max_restarts restarts the whole job", ()),
    "scale": ("elastic training (etcd) is not supported; --max_restarts restarts the whole job", ("0",)),
    "force": ("elastic training (etcd) is not supported; --max_restarts restarts the whole job", _FALSE),
}

PS_OPTIONS = ("server_num", "worker_num", "servers", "workers")


def translate(values: dict, given: set) -> dict:
    """This launcher's option values, with the Paddle 2.6/3.x ones (``given``: the names set by the user) mapped
    onto them; the Paddle names are left in ``values`` for the caller's checks (``expected_nodes``)."""
    out = dict(values)
    for name, (reason, harmless) in REFUSED.items():
        value = out.get(name)
        if name in given and value is not None and str(value).strip().lower() not in harmless:
            raise LaunchError(f"--{name} {value} cannot be honoured: {reason}; drop --{name}.")
    _same_as(out, given, "devices", "selected_gpus")
    _same_as(out, given, "ips", "cluster_node_ips")
    _same_as(out, given, "host", "node_ip")
    _same_as(out, given, "trainers", "workers")
    _same_as(out, given, "trainer_num", "worker_num")
    _same_as(out, given, "max_restart", "max_restarts")
    _same_as(out, given, "elastic_timeout", "join_timeout")
    _same_as(out, given, "http_port", "gloo_port")
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


ELASTIC_OPTIONS = ("nnodes", "master", "job_id", "elastic_level", "elastic_timeout", "max_restart", "rank", "ips")


def elastic(values: dict, given, env=None) -> Optional[dict]:
    """Paddle 3.x's ``--nnodes MIN:MAX --master IP:PORT`` (or ``--master etcd://...``) and fleetrun's
    ``--elastic_server HOST:PORT --job_id ID --np N[:M]``: the ElasticSpec (``elastic``) and the values its first
    round completes (the nodes, this node's rank; the control channel on PORT); None for a fixed job.
    ``given(name)``: whether the user gave that option; ``env``: the launcher's environment."""
    env = env or {}
    if given("elastic_server") or env.get("PADDLE_ELASTIC_SERVER"):  # Paddle 2.x's elastic mode
        spec = elastic_options.from_paddle2({n: values.get(n) for n in (*ELASTIC_OPTIONS, "elastic_server", "np")
                                             if given(n)} | {"np": values.get("nnodes") if given("nnodes") else None}, env)
        if spec.backend == "etcd":
            return {"elastic": spec, "nnodes": None, "elastic_server": None}
    low, colon, high = str(values.get("nnodes") or "").partition(":")
    etcd_master = "://" in str(values.get("master") or "") and given("master")
    if not given("nnodes") or (not etcd_master and (not colon or low.strip() == high.strip())):
        return None
    spec = elastic_options.from_paddle3({n: values.get(n) for n in ELASTIC_OPTIONS if given(n)}, env)
    if spec.backend == "etcd":
        return {"elastic": spec, "nnodes": None, "master": None, "elastic_level": "-1"}
    if given("ips") or spec.port is None:
        raise LaunchError(f"--nnodes {values['nnodes']} runs an elastic job around node 0's --master IP:PORT; give "
                          "--master (the same on every node) and no --ips.")
    ours = {"elastic": spec, "master_addr": spec.host, "nnodes": None, "master": None, "elastic_level": "-1"}
    if not given("started_port"):
        ours["started_port"] = spec.port + 1  # node 0's control channel on PORT, one below the store's
    return ours


def expected_nodes(values: dict, given: set) -> Optional[int]:
    """--nnodes N (or fleetrun's --np N): the number of nodes the plan must find, or None."""
    if "nnodes" not in given or values.get("nnodes") is None:
        return None
    text = str(values["nnodes"]).strip()
    low, _, high = text.partition(":")
    if not (low.isdigit() and (not high or high.isdigit())) or int(low) < 1:
        raise LaunchError(f"--nnodes {text} is not a number of nodes; give a whole number such as 2.")
    if high and int(high) != int(low):
        raise LaunchError(f"--nnodes {text} asks for elastic training (between {low} and {high} nodes), which is not "
                          f"supported; give one number, such as --nnodes {high}.")
    return int(low)


def check_nodes(expected: Optional[int], found: int, where: str) -> None:
    if expected is not None and expected != found:
        raise LaunchError(f"--nnodes {expected} disagrees with the {found} node(s) of {where}; give every node's "
                          f"address with --ips (or --cluster_node_ips), or make --nnodes match.")


# ---------------------------------------------------------------- one option each


def _same_as(out: dict, given: set, paddle: str, ours: str) -> None:
    """``--paddle`` is ``--ours`` under Paddle's name: both given must agree."""
    if paddle not in given:
        return
    value = out[paddle]
    if ours in given and out[ours] != value:
        raise LaunchError(f"--{paddle} {value} disagrees with --{ours} {out[ours]}, which is the same option; give one of them.")
    out[ours] = value


def _flag(out: dict, given: set, name: str) -> bool:
    if name not in given:
        return False
    text = str(out[name]).strip().lower()
    if text not in _TRUE + _FALSE:
        raise LaunchError(f"--{name} {out[name]} is not true or false; give true, false, 1 or 0.")
    return text in _TRUE


def _address_key(host: str):
    try:
        return (0, ipaddress.ip_address(host.strip()).packed, "")
    except ValueError:
        return (1, b"", host.strip())


def _elastic_level(out: dict, given: set) -> None:
    if "elastic_level" in given and str(out["elastic_level"]).strip() != "-1":
        raise LaunchError(f"--elastic_level {out['elastic_level']} asks for elastic training, which is not supported; "
                          "drop it (--max_restarts N restarts the whole job after a failure).")


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
    if "master" not in given or not out["master"]:
        return
    text = str(out["master"]).strip()
    if "://" in text:  # an etcd:// one with --nnodes is an elastic job (``elastic``), taken before this
        from launcher.plan import etcd  # an elastic job's only: every launch would pay its import

        shown = etcd.without_password(text)
        if text.lower().startswith("etcd://"):
            raise LaunchError(f"--master {shown} keeps the job's membership in etcd, which needs the number of nodes; "
                              "give --nnodes N or MIN:MAX too, the same on every node.")
        raise LaunchError(f"--master {shown} is not IP:PORT; give node 0's address and a free port, such as "
                          "10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with --nnodes).")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LaunchError(f"--master {text} is not IP:PORT; give node 0's address and a free port, such as 10.0.0.1:8090.")
    first = out["cluster_node_ips"].split(",")[0].strip()
    if len(out["cluster_node_ips"].split(",")) > 1 and host.strip("[]") != first:
        raise LaunchError(f"--master {text} is not on node 0 ({first}, the first of --ips): the rendezvous is node 0's; "
                          f"give --master {first}:{port}.")
    if "control_port" in given and out["control_port"] != int(port):
        raise LaunchError(f"--master {text} disagrees with --control_port {out['control_port']}; give one of them.")
    out["control_port"] = int(port)


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
    stray = [n for n in ("gloo_port", "with_gloo", "http_port") if n in given]
    if stray and not any(out.get(n) is not None for n in PS_OPTIONS):
        raise LaunchError(f"--{stray[0]} sets fleet's gloo rendezvous of a parameter-server job, and this is a collective "
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
