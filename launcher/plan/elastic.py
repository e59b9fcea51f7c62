"""The elastic options of torchrun, Paddle 3.x and Paddle 2.x, checked and turned into one ``ElasticSpec``. Pure.

The three command lines that ask for a number of nodes between MIN and MAX:

- torchrun: ``--nnodes MIN:MAX --rdzv-backend c10d --rdzv-endpoint HOST[:PORT] --rdzv-id ID
  --rdzv-conf K=V,... --max-restarts N`` (``from_torchrun``);
- Paddle 3.x: ``--nnodes MIN:MAX --master IP:PORT --job_id ID --elastic_level L --elastic_timeout S
  --max_restart N`` (``from_paddle3``);
- Paddle 2.x (fleetrun): ``--np MIN:MAX --job_id ID`` and ``--elastic_server`` (or their
  ``PADDLE_ELASTIC_*`` variables) (``from_paddle2``).

Each takes the options the user gave as a plain mapping of their underscore names (a name absent
or None: not given), so the command line calls it with what click parsed. Every bad value is a
LaunchError of one sentence that names it and the fix. An etcd rendezvous (``--rdzv-backend etcd``,
``--master etcd://...``, ``--elastic_server``) keeps the membership in etcd instead of node 0's launcher
(``launcher.plan.etcd``): a job of fixed size is then elastic too (a lost node's place can be taken).
What each backend means (its names, its endpoint's module, its heartbeat) is its row's
(``launcher.plan.elastic_backends``); the ``ElasticSpec`` and what each rendezvous setting means are
``launcher.plan.elastic_spec``'s.

Paddle's settings: Paddle 3.x's ``--elastic_timeout`` and Paddle 2.x's ``PADDLE_ELASTIC_TIMEOUT``
(how long Paddle waits with fewer than MAX nodes before it starts with those there) are
``last_call_timeout``; Paddle 2.x's ``PADDLE_ELASTIC_TTL`` (its heartbeat lease, renewed every third
of it) is ``heartbeat_timeout``, with a heartbeat every third of it at most. Paddle 3.x's
``--elastic_level``: -1 (Paddle's default) and 1 restart the round after a worker failure, up to
``--max_restart``, as torchrun does; 0 ("failed exit, peers hold"): the failing node leaves the job
and the others re-form without it, spending no restart.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Optional, Tuple

from launcher import addresses
from launcher.errors import LaunchError
from launcher.plan import elastic_backends as eb
from launcher.plan.elastic_backends import Backend
from launcher.plan.elastic_spec import SETTING, ElasticSpec, Rendezvous, Setting, count_text
from launcher.plan.parsing import DIGITS, INTEGER, node_range, parse_node_list

ELASTIC_LEVELS = (-1, 0, 1)
TRUE, FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")
ALIASES = {"timeout": "join_timeout"}  # the static rendezvous's key
FLAGS = ("is_host",)  # accepted booleans of no effect
KNOWN_KEYS = tuple(sorted([*SETTING, *ALIASES, *FLAGS]))


# ---------------------------------------------------------------- the three command lines


def from_torchrun(values: Mapping, env: Optional[Mapping] = None, by_arrival: bool = False) -> ElasticSpec:
    """torchrun's options (``nnodes``, ``rdzv_backend``, ``rdzv_endpoint``, ``rdzv_id``, ``rdzv_conf``,
    ``max_restarts``, ``node_rank``, and the launcher's own ``cluster_node_ips``); ``by_arrival``: a fixed count whose
    nodes take their ranks in the order they arrive (torchrun's own recipe, no node rank), an elastic job of N:N."""
    low, high = parse_nnodes(_given(values, "nnodes") or "1", "--nnodes")  # a NodeRange from the command line
    row = eb.backend_named(_given(values, "rdzv_backend") or eb.FIXED.name)
    conf, own_conf = eb.split_conf(_given(values, "rdzv_conf"), row)
    rendezvous = parse_rdzv_conf(conf)
    spec = ElasticSpec(low, high, row.name, job_id=_given(values, "rdzv_id"), rendezvous=rendezvous,
                       max_restarts=_restarts(values.get("max_restarts"), "--max-restarts"))
    if not (spec.elastic or by_arrival):
        return spec
    if not row.elastic:
        raise LaunchError(f"--nnodes {low}:{high} with --rdzv-backend {row.name}: a {row.name} rendezvous has a fixed "
                          f"number of nodes; give --rdzv-backend {eb.RANGE.name} for an elastic job, or --nnodes {high}.")
    _no_node_rank(values, "node_rank", "--node-rank", low, high)
    hosts = _node_hosts(values, "cluster_node_ips", "--cluster_node_ips", low, high)
    spec = replace(spec, node_hosts=hosts)
    return _placed(row, row.endpoint_module().from_torchrun(spec, _given(values, "rdzv_endpoint"), own_conf, env or {}))


def from_paddle3(values: Mapping, env: Optional[Mapping] = None, by_arrival: bool = False) -> ElasticSpec:
    """Paddle 3.x's options (``nnodes``, ``master``, ``job_id``, ``elastic_level``, ``elastic_timeout``,
    ``max_restart``, ``rank``, ``ips``); ``--max_restart`` not given is 0, as for a fixed job here (Paddle's
    own default is 3); ``by_arrival``: ``--nnodes N`` around ``--master IP:PORT`` with no rank (Paddle's own recipe),
    an elastic job of N:N whose nodes take their ranks in the order they arrive."""
    low, high = parse_nnodes(_given(values, "nnodes") or "1", "--nnodes")
    master = _given(values, "master")
    url_row = eb.for_url(master)  # --master SCHEME://... names the backend; IP:PORT is node 0's
    level = _elastic_level(_given(values, "elastic_level"))
    rendezvous = Rendezvous()
    timeout = _given(values, "elastic_timeout")
    if timeout is not None:
        rendezvous = replace(rendezvous, last_call_timeout=_seconds(str(timeout), SETTING["last_call_timeout"],
                                                                    f"--elastic_timeout {timeout}", "--elastic_timeout "))
    row = url_row or (eb.RANGE if low < high or by_arrival else eb.FIXED)
    spec = ElasticSpec(low, high, row.name, job_id=_given(values, "job_id"),
                       rendezvous=rendezvous, max_restarts=_restarts(values.get("max_restart"), "--max_restart"),
                       failed_node_leaves=level == 0)
    if not (spec.elastic or by_arrival):
        return spec
    _no_node_rank(values, "rank", "--rank", low, high, unset="-1")
    hosts = _node_hosts(values, "ips", "--ips", low, high)
    if url_row is not None:
        return _placed(row, row.endpoint_module().from_paddle3(replace(spec, node_hosts=hosts), master, env or {}))
    host, port = _paddle_master(master, hosts, low, high, "--nnodes")
    return replace(spec, host=host, port=port, node_hosts=hosts)


def from_paddle2(values: Mapping, env: Optional[Mapping] = None) -> ElasticSpec:
    """Paddle 2.x's (fleetrun's) options (``np``, ``job_id``, ``elastic_server``, ``ips``, and Paddle 3's
    ``master``, taken too), each one not given read from its ``PADDLE_ELASTIC_*`` variable in ``env``."""
    env = env or {}
    server = _given(values, "elastic_server") or env.get("PADDLE_ELASTIC_SERVER") or None
    text = _given(values, "np")
    shown = "--np" if text is not None else "PADDLE_ELASTIC_NP"
    low, high = parse_nnodes(text if text is not None else env.get("PADDLE_ELASTIC_NP") or "1", shown)
    rendezvous = _paddle2_rendezvous(env)
    job_id = _given(values, "job_id") or env.get("PADDLE_ELASTIC_JOB_ID") or None
    row = eb.elastic_server() if server is not None else eb.RANGE if low < high else eb.FIXED
    spec = ElasticSpec(low, high, row.name, job_id=job_id, rendezvous=rendezvous)
    if not spec.elastic:
        return spec
    hosts = _node_hosts(values, "ips", "--ips", low, high)
    if server is not None:
        shown = "--elastic_server" if _given(values, "elastic_server") else "PADDLE_ELASTIC_SERVER"
        return _placed(row, row.endpoint_module().from_paddle2(replace(spec, node_hosts=hosts), server, shown, env))
    host, port = _paddle_master(_given(values, "master"), hosts, low, high, shown)
    return replace(spec, host=host, port=port, node_hosts=hosts)


def first_round(spec: ElasticSpec, started_port_given: bool) -> dict:
    """The options an elastic job starts from (its rounds give the nodes and this node's rank): with a node 0, its
    address as the workers' master and their ports one above node 0's own port, unless --started_port is given."""
    if not spec.backend_row.has_node_0:  # each round's node 0 hosts rank 0's store on the workers' ports (6070 on)
        return {"elastic": spec, "nnodes": None}
    if not started_port_given and spec.port >= addresses.HIGHEST_PORT:
        raise LaunchError(f"node 0's port {spec.port} leaves no port above it for the workers, whose ports start one "
                          "above node 0's; give node 0 a lower port, or --started_port.")
    return {"elastic": spec, "nnodes": None, "master_addr": spec.host,
            **({} if started_port_given else {"started_port": spec.port + 1})}


# ---------------------------------------------------------------- the parts


def _placed(row: Backend, spec: ElasticSpec) -> ElasticSpec:
    """The spec placed at its endpoint, with its backend's heartbeat_timeout unless one was given."""
    if row.heartbeat_timeout is None or "heartbeat_timeout" in spec.rendezvous.given:
        return spec
    return replace(spec, rendezvous=replace(spec.rendezvous, heartbeat_timeout=row.heartbeat_timeout))


def _paddle2_rendezvous(env: Mapping) -> Rendezvous:
    """PADDLE_ELASTIC_TIMEOUT as the last call; PADDLE_ELASTIC_TTL as the heartbeat timeout, a heartbeat
    every third of it at most (Paddle 2.x renews its lease every TTL/3)."""
    rendezvous = Rendezvous()
    for variable, name in (("PADDLE_ELASTIC_TIMEOUT", "last_call_timeout"), ("PADDLE_ELASTIC_TTL", "heartbeat_timeout")):
        if env.get(variable):
            seconds = _seconds(env[variable], SETTING[name], f"{variable}={env[variable]}", f"{variable}=")
            rendezvous = replace(rendezvous, **{name: seconds}, given=rendezvous.given | {name})
    interval = min(rendezvous.keep_alive_interval, rendezvous.heartbeat_timeout / 3)
    return replace(rendezvous, keep_alive_interval=interval)


def parse_nnodes(text, option: str) -> Tuple[int, int]:
    """``N`` or ``MIN:MAX`` (text, or a NodeRange already read) as (MIN, MAX), 1 <= MIN <= MAX."""
    try:
        nodes = node_range(text)
    except ValueError as e:
        raise LaunchError(f"{option} {text} {e}.") from None
    return nodes.low, nodes.high


def parse_rdzv_conf(text: str) -> Rendezvous:
    """torchrun's ``--rdzv-conf`` (``key=value,...``) as the rendezvous settings, each key known and in range."""
    given: dict = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key or not value:
            where = f"--rdzv-conf {text}" + ("" if item == text.strip() else f" has {item!r}, which")
            raise LaunchError(f"{where} is not KEY=VALUE; give KEY=VALUE pairs separated by commas, such as "
                              "join_timeout=600,last_call_timeout=1.")
        name = ALIASES.get(key, key)
        if name not in SETTING and name not in FLAGS:
            raise LaunchError(f"--rdzv-conf has the unknown key {key!r}; the known keys are {', '.join(KNOWN_KEYS)}: "
                              "drop it or correct its spelling.")
        if name in given and given[name][1] != value:
            raise LaunchError(f"--rdzv-conf gives {name} twice ({given[name][0]}={given[name][1]}, {key}={value}); "
                              "give it once.")
        given[name] = (key, value)
    values = {}
    for name, (key, value) in given.items():
        if name in FLAGS:
            _boolean(value, f"--rdzv-conf {key}={value}")
        else:
            values[name] = _seconds(value, SETTING[name], f"--rdzv-conf {key}={value}")
    return _with_silence(values)


def _with_silence(values: dict) -> Rendezvous:
    """The settings given; without ``heartbeat_timeout``, torchrun's dead-node rule makes it from the
    interval and the attempts when either was given; a heartbeat timeout within one interval is refused."""
    rendezvous = Rendezvous(**values, given=frozenset(values))
    if "heartbeat_timeout" not in values and ({"keep_alive_interval", "keep_alive_max_attempt"} & set(values)):
        silence = rendezvous.keep_alive_interval * rendezvous.keep_alive_max_attempt
        rendezvous = replace(rendezvous, heartbeat_timeout=max(silence, SETTING["heartbeat_timeout"].low),
                             given=rendezvous.given | {"heartbeat_timeout"})
    if rendezvous.heartbeat_timeout <= rendezvous.keep_alive_interval:
        raise LaunchError(f"--rdzv-conf heartbeat_timeout={rendezvous.heartbeat_timeout:g} is not longer than "
                          f"keep_alive_interval={rendezvous.keep_alive_interval:g}: a node would count as lost between "
                          "two of its heartbeats; give a heartbeat_timeout of a few intervals.")
    return rendezvous


def _seconds(text: str, setting: Setting, shown: str, spelling: Optional[str] = None) -> float:
    """``text`` as the setting's number (a whole one when ``setting.whole``), within its bounds; ``shown``
    names the value given, ``spelling`` the option before a value (``--rdzv-conf`` KEY= by default)."""
    number = _number(str(text).strip(), setting.whole)
    example = f"{spelling or setting.name + '='}{setting.default:g}"
    if number is None:
        what = "a whole number" if setting.whole else "a number of seconds"
        raise LaunchError(f"{shown} is not {what}; give one from {setting.low:g} to {setting.high:g}, such as {example}.")
    if not setting.low <= number <= setting.high:
        unit = "" if setting.whole else " seconds"
        raise LaunchError(f"{shown} is outside {setting.low:g} to {setting.high:g}{unit}; give a value in that range, "
                          f"such as {example}.")
    return number


def _number(text: str, whole: bool):
    """A finite number written in ASCII (a whole one when ``whole``), or None."""
    if whole:
        return int(text) if INTEGER.fullmatch(text) else None
    try:
        number = float(text) if text.isascii() else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def _boolean(text: str, shown: str) -> bool:
    if text.lower() not in TRUE + FALSE:
        raise LaunchError(f"{shown} is not true or false; give true, false, 1 or 0.")
    return text.lower() in TRUE


def _given(values: Mapping, name: str):
    value = values.get(name)
    return None if value is None or value == "" else value


def _restarts(value, option: str) -> int:
    if value is None:
        return 0
    text = str(value).strip()
    if not DIGITS.fullmatch(text):
        raise LaunchError(f"{option} {value} is not a number of restarts; give 0 (no restart) or more.")
    return int(text)


def _elastic_level(value) -> int:
    text = "-1" if value is None else str(value).strip()
    if not INTEGER.fullmatch(text) or int(text) not in ELASTIC_LEVELS:
        raise LaunchError(f"--elastic_level {value} is not one of -1, 0, 1; give -1 or 1 (a worker failure restarts "
                          "the job, up to --max_restart) or 0 (the failing node leaves, the others go on).")
    return int(text)


def _no_node_rank(values: Mapping, name: str, option: str, low: int, high: int, unset: str = "") -> None:
    """An elastic job's node ranks come from the membership: a fixed one is refused."""
    value = _given(values, name)
    if value is not None and str(value).strip() != unset:
        raise LaunchError(f"{option} {value} fixes this node's rank, but the ranks of an elastic job (--nnodes "
                          f"{count_text(low, high)}) come from the order the nodes join; drop {option}.")


def _node_hosts(values: Mapping, name: str, option: str, low: int, high: int) -> tuple:
    """A static node list given with a range: it must name every node that may join, MAX of them."""
    text = _given(values, name)
    if text is None:
        return ()
    hosts = parse_node_list(str(text), option)
    if len(hosts) != high:
        raise LaunchError(f"{option} {text} lists {len(hosts)} node(s), but --nnodes {count_text(low, high)} lets {high} "
                          f"join; give all {high} addresses, node 0 first, or no {option}.")
    return hosts


def _paddle_master(master, hosts: tuple, low: int, high: int, option: str) -> Tuple[str, Optional[int]]:
    """Paddle's node 0: --master IP:PORT, else the first of --ips (the launcher's default port)."""
    if master is None:
        if not hosts:
            raise LaunchError(f"{option} {low}:{high} needs node 0's address: give --master IP:PORT (the same on "
                              "every node) or --ips with node 0 first.")
        return hosts[0], None
    return paddle_master(master, hosts[0] if hosts else None)


def paddle_master(master, first: Optional[str]) -> Tuple[str, int]:
    """Paddle's ``--master IP:PORT`` (``[v6]:PORT``) of node 0, which is ``first`` (the first of --ips) when the nodes
    are listed; a ``SCHEME://...`` one (a backend's, ``elastic_backends.for_url``) needs a number of nodes."""
    text = str(master).strip()
    row = eb.for_url(text)
    if row is not None:  # with --nnodes, ``from_paddle3`` takes it first
        raise LaunchError(f"--master {eb.without_password(text)} keeps the job's membership in {row.name}, which needs "
                          "the number of nodes; give --nnodes N or MIN:MAX too, the same on every node.")
    try:
        host, port = addresses.split(text)
    except addresses.NotAnAddress:
        example = "[fe80::1]:8090" if text.count(":") > 1 else "10.0.0.1:8090"  # IPv6: its port in brackets
        raise LaunchError(f"--master {text} is not IP:PORT; give node 0's address and a free port, such as "
                          f"{example}.") from None
    if first is not None and host != first:
        raise LaunchError(f"--master {text} is not on node 0 ({first}, the first of --ips): the rendezvous is node "
                          f"0's; give --master {addresses.joined(first, port)}.")
    return host, port
