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
The ``ElasticSpec`` and what each rendezvous setting means are ``launcher.plan.elastic_spec``'s.

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
from typing import TYPE_CHECKING, Mapping, Optional, Tuple

from launcher.errors import LaunchError
from launcher.plan.elastic_spec import ETCD_HEARTBEAT_TIMEOUT, SETTING, ElasticSpec, Rendezvous, Setting
from launcher.plan.parsing import DIGITS, INTEGER, parse_node_list

if TYPE_CHECKING:  # launcher.plan.etcd is imported by an elastic job's line only: every launch would pay its 2 ms
    from launcher.plan.etcd import EtcdSpec

C10D_PORT = 29400  # torchrun's port of a --rdzv-endpoint given without one
LOOPBACK = "127.0.0.1"  # torchrun's c10d endpoint when none is given (it says localhost)
BACKENDS = ("static", "c10d", "etcd", "etcd-v2")  # etcd-v2 (torchrun's newer etcd backend) is etcd here
ELASTIC_LEVELS = (-1, 0, 1)
TRUE, FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")
ALIASES = {"timeout": "join_timeout"}  # the static rendezvous's key
FLAGS = ("is_host",)  # accepted booleans of no effect
KNOWN_KEYS = tuple(sorted([*SETTING, *ALIASES, *FLAGS]))


# ---------------------------------------------------------------- the three command lines


def from_torchrun(values: Mapping, env: Optional[Mapping] = None) -> ElasticSpec:
    """torchrun's options (``nnodes``, ``rdzv_backend``, ``rdzv_endpoint``, ``rdzv_id``, ``rdzv_conf``,
    ``max_restarts``, ``node_rank``, and the launcher's own ``cluster_node_ips``)."""
    low, high = parse_nnodes(_given(values, "nnodes") or "1", "--nnodes")
    backend = _backend(_given(values, "rdzv_backend") or "static")
    from launcher.plan import etcd

    conf, etcd_conf = etcd.split_conf(_given(values, "rdzv_conf"))
    if etcd_conf and backend != "etcd":
        raise LaunchError(f"--rdzv-conf {','.join(etcd_conf)}= is for an etcd rendezvous; give --rdzv-backend etcd, "
                          "or drop it.")
    rendezvous = parse_rdzv_conf(conf)
    spec = ElasticSpec(low, high, backend, job_id=_given(values, "rdzv_id"), rendezvous=rendezvous,
                       max_restarts=_restarts(values.get("max_restarts"), "--max-restarts"))
    if not spec.elastic:
        return spec
    if backend == "static":
        raise LaunchError(f"--nnodes {low}:{high} with --rdzv-backend static: a static rendezvous has a fixed number "
                          f"of nodes; give --rdzv-backend c10d for an elastic job, or --nnodes {high}.")
    _no_node_rank(values, "node_rank", "--node-rank", low, high)
    hosts = _node_hosts(values, "cluster_node_ips", "--cluster_node_ips", low, high)
    if backend == "etcd":
        endpoint = _given(values, "rdzv_endpoint")
        if endpoint is None:
            raise LaunchError("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd (2379 is etcd's client "
                              "port), the same on every node.")
        endpoints, protocol = etcd.parse_endpoints(endpoint, "--rdzv-endpoint")
        return _in_etcd(spec, etcd.with_conf(etcd.EtcdSpec(endpoints), etcd_conf, env or {}, protocol), hosts)
    host, port = parse_rdzv_endpoint(_given(values, "rdzv_endpoint"), hosts)
    return replace(spec, host=host, port=port, node_hosts=hosts)


def from_paddle3(values: Mapping, env: Optional[Mapping] = None) -> ElasticSpec:
    """Paddle 3.x's options (``nnodes``, ``master``, ``job_id``, ``elastic_level``, ``elastic_timeout``,
    ``max_restart``, ``rank``, ``ips``); ``--max_restart`` not given is 0, as for a fixed job here (Paddle's
    own default is 3)."""
    low, high = parse_nnodes(str(_given(values, "nnodes") or "1"), "--nnodes")
    master = _given(values, "master")
    in_etcd = master is not None and "://" in str(master)
    level = _elastic_level(_given(values, "elastic_level"))
    rendezvous = Rendezvous()
    timeout = _given(values, "elastic_timeout")
    if timeout is not None:
        rendezvous = replace(rendezvous, last_call_timeout=_seconds(str(timeout), SETTING["last_call_timeout"],
                                                                    f"--elastic_timeout {timeout}", "--elastic_timeout "))
    backend = "etcd" if in_etcd else "c10d" if low < high else "static"
    spec = ElasticSpec(low, high, backend, job_id=_given(values, "job_id"),
                       rendezvous=rendezvous, max_restarts=_restarts(values.get("max_restart"), "--max_restart"),
                       failed_node_leaves=level == 0)
    if not spec.elastic:
        return spec
    _no_node_rank(values, "rank", "--rank", low, high, unset="-1")
    hosts = _node_hosts(values, "ips", "--ips", low, high)
    if in_etcd:
        from launcher.plan import etcd

        etcd_spec = etcd.from_url(master, "--master")
        return _in_etcd(spec, etcd.with_conf(etcd_spec, {}, env or {}, inline=etcd.URL_PASSWORD), hosts)
    host, port = _paddle_master(master, hosts, low, high, "--nnodes")
    return replace(spec, host=host, port=port, node_hosts=hosts)


def from_paddle2(values: Mapping, env: Optional[Mapping] = None) -> ElasticSpec:
    """Paddle 2.x's (fleetrun's) options (``np``, ``job_id``, ``elastic_server``, ``ips``, and Paddle 3's
    ``master``, taken too), each one not given read from its ``PADDLE_ELASTIC_*`` variable in ``env``."""
    env = env or {}
    server = _given(values, "elastic_server") or env.get("PADDLE_ELASTIC_SERVER") or None
    text = _given(values, "np")
    shown = "--np" if text is not None else "PADDLE_ELASTIC_NP"
    low, high = parse_nnodes(str(text if text is not None else env.get("PADDLE_ELASTIC_NP") or "1"), shown)
    rendezvous = _paddle2_rendezvous(env)
    job_id = _given(values, "job_id") or env.get("PADDLE_ELASTIC_JOB_ID") or None
    backend = "etcd" if server is not None else "c10d" if low < high else "static"
    spec = ElasticSpec(low, high, backend, job_id=job_id, rendezvous=rendezvous)
    if not spec.elastic:
        return spec
    hosts = _node_hosts(values, "ips", "--ips", low, high)
    if server is not None:
        from launcher.plan import etcd

        shown = "--elastic_server" if _given(values, "elastic_server") else "PADDLE_ELASTIC_SERVER"
        if job_id is None:
            raise LaunchError(f"{shown} {etcd.without_password(server)} keeps the membership of many jobs in etcd: give "
                              "--job_id ID (or PADDLE_ELASTIC_JOB_ID), the same on every node of this job.")
        text = str(server).strip()
        if text.lower().startswith("etcd://"):
            spec_etcd = etcd.from_url(text, shown)
        else:  # HOST:PORT,... (http:// or https:// before them say the protocol)
            endpoints, protocol = etcd.parse_endpoints(text, shown)
            spec_etcd = etcd.EtcdSpec(endpoints, protocol=protocol or "http")
        return _in_etcd(spec, etcd.with_conf(spec_etcd, {}, env, inline=etcd.URL_PASSWORD), hosts)
    host, port = _paddle_master(_given(values, "master"), hosts, low, high, shown)
    return replace(spec, host=host, port=port, node_hosts=hosts)


# ---------------------------------------------------------------- the parts


def _in_etcd(spec: ElasticSpec, etcd_spec: "EtcdSpec", hosts: tuple) -> ElasticSpec:
    """An etcd rendezvous: the membership in etcd; ``host``:``port`` name its first endpoint (the default job id)."""
    host, port = etcd_spec.endpoints[0]
    rendezvous = spec.rendezvous
    if "heartbeat_timeout" not in rendezvous.given:
        rendezvous = replace(rendezvous, heartbeat_timeout=ETCD_HEARTBEAT_TIMEOUT)
    return replace(spec, backend="etcd", etcd=etcd_spec, host=host, port=port, node_hosts=hosts, rendezvous=rendezvous)


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


def parse_nnodes(text: str, option: str) -> Tuple[int, int]:
    """``N`` or ``MIN:MAX`` as (MIN, MAX), 1 <= MIN <= MAX."""
    parts = str(text).strip().split(":")
    if len(parts) > 2 or not all(DIGITS.fullmatch(p.strip()) for p in parts):
        raise LaunchError(f"{option} {text} is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4.")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise LaunchError(f"{option} {text} has a minimum of 0 nodes; give 1 or more, such as {option} 1:{max(high, 1)}.")
    if low > high:
        raise LaunchError(f"{option} {text} has its minimum above its maximum; give MIN:MAX with MIN at most MAX, "
                          f"such as {option} {high}:{low}.")
    return low, high


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


def parse_rdzv_endpoint(text: Optional[str], hosts: tuple = ()) -> Tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT``) of node 0; no port: torchrun's 29400; none given: the first of
    ``hosts``, else loopback (torchrun's localhost)."""
    if text is None or not str(text).strip():
        return (hosts[0] if hosts else LOOPBACK), C10D_PORT
    text = str(text).strip()
    if text.startswith("["):
        host, _, port = text[1:].partition("]")
        port = port[1:] if port.startswith(":") else port or str(C10D_PORT)
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:  # a host alone, or a bare IPv6 address
        host, port = text, str(C10D_PORT)
    if not host or not DIGITS.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise LaunchError(f"--rdzv-endpoint {text} is not HOST[:PORT]; give node 0's address and a port from 1 to "
                          "65535, such as 10.0.0.1:29400.")
    return host, int(port)


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


def _backend(name: str) -> str:
    name = str(name).strip().lower()
    if name not in BACKENDS:
        raise LaunchError(f"--rdzv-backend {name} is not a rendezvous backend of this launcher; give c10d, etcd or "
                          "static.")
    return "etcd" if name.startswith("etcd") else name


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
                          f"{_count(low, high)}) come from the order the nodes join; drop {option}.")


def _node_hosts(values: Mapping, name: str, option: str, low: int, high: int) -> tuple:
    """A static node list given with a range: it must name every node that may join, MAX of them."""
    text = _given(values, name)
    if text is None:
        return ()
    hosts = parse_node_list(str(text), option)
    if len(hosts) != high:
        raise LaunchError(f"{option} {text} lists {len(hosts)} node(s), but --nnodes {_count(low, high)} lets {high} "
                          f"join; give all {high} addresses, node 0 first, or no {option}.")
    return hosts


def _count(low: int, high: int) -> str:
    """The number of nodes as written: ``N`` (a fixed count: an etcd rendezvous's) or ``MIN:MAX``."""
    return str(low) if low == high else f"{low}:{high}"


def _paddle_master(master, hosts: tuple, low: int, high: int, option: str) -> Tuple[str, Optional[int]]:
    """Paddle's node 0: --master IP:PORT, else the first of --ips (the launcher's default port)."""
    if master is None:
        if not hosts:
            raise LaunchError(f"{option} {low}:{high} needs node 0's address: give --master IP:PORT (the same on "
                              "every node) or --ips with node 0 first.")
        return hosts[0], None
    text = str(master).strip()
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not DIGITS.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise LaunchError(f"--master {text} is not IP:PORT; give node 0's address and a free port, such as 10.0.0.1:8090.")
    if hosts and host != hosts[0]:
        raise LaunchError(f"--master {text} is not on node 0 ({hosts[0]}, the first of --ips); give --master "
                          f"{hosts[0]}:{port}.")
    return host, int(port)
