"""An etcd rendezvous: where the job's membership lives when it is kept in etcd, and how to reach it. Pure.

The three spellings (each maps to one ``EtcdSpec``):

- torchrun: ``--rdzv-backend etcd`` (or ``etcd-v2``, the same here) ``--rdzv-endpoint HOST:PORT[,HOST:PORT...]``
  with ``--rdzv-conf protocol=https,cacert=CA,cert=CERT,key=KEY`` (torchrun's etcd keys) and this
  launcher's ``user=NAME`` (or ``user=NAME:PASSWORD``, as etcdctl's ``--user``) and ``password=...``;
- Paddle 3.x: ``--master etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]``;
- Paddle 2.x: ``--elastic_server HOST:PORT[,...]`` (or ``PADDLE_ELASTIC_SERVER``), with ``--job_id``.

An endpoint without a port is etcd's client port, 2379; one written ``https://HOST:PORT`` asks for TLS.
The password may also come from ``LAUNCHER_ETCD_PASSWORD`` (an option's value is visible to every
user of the machine in ``ps``). This is the etcd row's endpoint module (``launcher.plan.elastic_backends``):
``from_torchrun``, ``from_paddle3`` and ``from_paddle2`` place an ``ElasticSpec`` in etcd.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Tuple

from launcher import addresses
from launcher.errors import LaunchError
from launcher.plan import elastic_backends
from launcher.plan.elastic_backends import without_password

ETCD_PORT = 2379
PASSWORD_VAR = "LAUNCHER_ETCD_PASSWORD"
ROW = elastic_backends.ETCD
PROTOCOLS = ("http", "https")
URL_PASSWORD = "etcd://NAME:PASSWORD@HOST:PORT"  # Paddle's spelling of a password given with the user
Spec = object  # an ``ElasticSpec`` (launcher.plan.elastic_spec, which names this module's EtcdSpec)


@dataclass(frozen=True)
class EtcdSpec:
    """How this launcher reaches the etcd cluster that keeps the job's membership."""

    endpoints: Tuple[Tuple[str, int], ...]  # (host, port) of each etcd member, tried in this order
    protocol: str = "http"
    cacert: Optional[str] = None  # the CA that signed etcd's certificate (https)
    cert: Optional[str] = None  # this client's certificate and key (etcd's --client-cert-auth)
    key: Optional[str] = None
    user: Optional[str] = None  # etcd's user (its --auth-token with `etcdctl auth enable`)
    password: Optional[str] = field(default=None, repr=False)

    def shown(self) -> str:
        """The endpoints as the messages name them."""
        return ",".join(f"{self.protocol}://{addresses.joined(h, p)}" for h, p in self.endpoints)


def parse_endpoints(text, option: str, shown: Optional[str] = None) -> Tuple[Tuple[Tuple[str, int], ...], Optional[str]]:
    """``[http(s)://]HOST[:PORT],...`` as ((host, port), ...) and the protocol named (None: none named);
    ``shown``: the value as the messages name it (``text`` by default)."""
    shown = text if shown is None else shown
    endpoints, protocols = [], set()
    for item in (part.strip() for part in str(text or "").split(",")):
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if sep:
            if scheme.lower() not in PROTOCOLS:
                raise LaunchError(f"{option} {shown} names the scheme {scheme!r}; give HOST:PORT of etcd, or "
                                  "http:// or https:// before it.")
            protocols.add(scheme.lower())
            item = rest
        endpoints.append(_endpoint(item.rstrip("/"), shown, option))
    if not endpoints:
        raise LaunchError(f"{option} {shown!r} names no etcd endpoint; give HOST:PORT of etcd, such as 10.0.0.1:2379.")
    if len(protocols) > 1:
        raise LaunchError(f"{option} {shown} mixes http:// and https:// endpoints; give one protocol for every member.")
    return tuple(endpoints), (protocols.pop() if protocols else None)


def from_url(text: str, option: str) -> EtcdSpec:
    """Paddle 3.x's ``etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`` (each endpoint may say ``https://``)."""
    text = str(text).strip()
    credentials, at, hosts = text.partition("://")[2].rpartition("@")
    endpoints, protocol = parse_endpoints(hosts, option, without_password(text))
    user, colon, password = credentials.partition(":")
    if at and not user:
        raise LaunchError(f"{option} etcd://...@{hosts} names no user before '@'; give etcd://USER:PASSWORD@HOST:PORT "
                          "or no '@'.")
    return EtcdSpec(endpoints, protocol=protocol or "http", user=user or None, password=password if colon else None)


def from_torchrun(spec: Spec, text: Optional[str], conf: Mapping[str, str], env: Mapping) -> Spec:
    """torchrun's ``--rdzv-endpoint HOST:PORT,...`` of etcd, with its etcd keys of ``--rdzv-conf`` (``conf``)."""
    if text is None:
        raise LaunchError(f"--rdzv-backend {ROW.name} needs --rdzv-endpoint HOST:PORT of etcd (2379 is etcd's client "
                          "port), the same on every node.")
    endpoints, protocol = parse_endpoints(text, "--rdzv-endpoint")
    return placed(spec, with_conf(EtcdSpec(endpoints), conf, env, protocol))


def from_paddle3(spec: Spec, master: str, env: Mapping) -> Spec:
    """Paddle 3.x's ``--master etcd://[USER:PASSWORD@]HOST:PORT,...``."""
    return placed(spec, with_conf(from_url(master, "--master"), {}, env, inline=URL_PASSWORD))


def from_paddle2(spec: Spec, server, shown: str, env: Mapping) -> Spec:
    """Paddle 2.x's ``--elastic_server`` (``shown``: how the user gave it), ``HOST:PORT,...`` or ``etcd://...``;
    the job id is needed: one etcd keeps the membership of many jobs."""
    if spec.job_id is None:
        raise LaunchError(f"{shown} {without_password(server)} keeps the membership of many jobs in etcd: give "
                          "--job_id ID (or PADDLE_ELASTIC_JOB_ID), the same on every node of this job.")
    text = str(server).strip()
    if text.lower().startswith(f"{ROW.url_scheme}://"):
        etcd_spec = from_url(text, shown)
    else:  # HOST:PORT,... (http:// or https:// before them say the protocol)
        endpoints, protocol = parse_endpoints(text, shown)
        etcd_spec = EtcdSpec(endpoints, protocol=protocol or "http")
    return placed(spec, with_conf(etcd_spec, {}, env, inline=URL_PASSWORD))


def placed(spec: Spec, etcd_spec: EtcdSpec) -> Spec:
    """The spec with its membership in etcd; ``host``:``port`` name etcd's first endpoint (the default job id)."""
    host, port = etcd_spec.endpoints[0]
    return replace(spec, etcd=etcd_spec, host=host, port=port)


def with_conf(spec: EtcdSpec, conf: Mapping[str, str], env: Mapping[str, str], protocol: Optional[str] = None,
              inline: str = "user=NAME:PASSWORD") -> EtcdSpec:
    """The spec with torchrun's etcd keys (``--rdzv-conf``), the protocol of the endpoints, and the password
    from ``LAUNCHER_ETCD_PASSWORD`` when no option gave one; ``inline``: how the messages spell a password
    given with the user (Paddle's ``etcd://NAME:PASSWORD@HOST:PORT``)."""
    given = {k: v for k, v in conf.items() if v != ""}
    chosen = given.get("protocol", protocol or ("https" if {"cacert", "cert", "key"} & set(given) else spec.protocol))
    if chosen.lower() not in PROTOCOLS:
        raise LaunchError(f"--rdzv-conf protocol={chosen} is not http or https; give protocol=https for TLS, or "
                          "leave it out.")
    if protocol is not None and "protocol" in given and given["protocol"].lower() != protocol:
        raise LaunchError(f"--rdzv-conf protocol={given['protocol']} disagrees with the {protocol}:// endpoints; "
                          "give one of them.")
    if ("cert" in given) != ("key" in given):
        raise LaunchError("--rdzv-conf gives cert without key (or key without cert); a client certificate needs "
                          "both: cert=CLIENT.pem,key=CLIENT-key.pem.")
    user, password = given.get("user", spec.user), given.get("password", spec.password)
    if user is not None and ":" in user and password is None:
        user, _, password = user.partition(":")
    if user is not None and password is None:
        password = env.get(PASSWORD_VAR) or None
    if password is not None and not user:
        raise LaunchError("an etcd password was given without a user; give --rdzv-conf user=NAME too.")
    if user is not None and password is None:
        raise LaunchError(f"the etcd user {user} has no password; give it in {PASSWORD_VAR} (or {inline}).")
    return replace(spec, protocol=chosen.lower(), cacert=given.get("cacert"), cert=given.get("cert"),
                   key=given.get("key"), user=user, password=password)


def _endpoint(item: str, text, option: str) -> Tuple[str, int]:
    """``HOST[:PORT]`` (``launcher.addresses``) as (host, port); no port: etcd's 2379."""
    try:
        return addresses.split(item, ETCD_PORT)
    except addresses.NotAnAddress:
        raise LaunchError(f"{option} {text} has the endpoint {item!r}, which is not HOST:PORT; give etcd's address "
                          "and client port, such as 10.0.0.1:2379.") from None
