"""The rendezvous backends of an elastic job, one row each: its names, how its endpoint is parsed, whether any
node may be lost, and how it forms. Pure.

A row is everything the rest of the launcher may know of a backend: no module outside this one and the
backend's own (its endpoint's module in ``launcher.plan``, its subpackage of ``launcher.nodes.elastic``)
tests a backend's name (``tests/test_elastic_backends.py`` checks it). A new backend is one row here, one
subpackage with its ``start.form``, and one line in the link contract suite's parameters
(``tests/test_link_contract.py``).

A row names its modules by their dotted names, imported only when a job uses that backend: the endpoint's
(``endpoint``, in ``launcher.plan``: ``from_torchrun(spec, text, conf, env)`` places the spec at the
``--rdzv-endpoint`` given, with its own ``--rdzv-conf`` keys; one that Paddle names also has
``from_paddle3`` and ``from_paddle2``), and the one that forms this launcher's link (``forms``, in its
subpackage: ``form(spec, job_id, workers, token)``, with any check it needs first, such as an extra
installed; ``launcher.nodes.elastic.backends`` imports it, never this layer). ``static`` is torchrun's
rendezvous of a fixed job: a row of its own, with nothing to form.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, Optional, Tuple

from launcher.errors import LaunchError


@dataclass(frozen=True)
class Backend:
    """One rendezvous backend: how it is named, reached, and what it means for a job's nodes."""

    name: str  # its canonical name: ``ElasticSpec.backend``
    aliases: Tuple[str, ...] = ()  # other names of it on the command line
    elastic: bool = True  # node ranks come from the rendezvous, so a range of nodes may use it (static: fixed ones)
    # a launcher at the endpoint, node 0, keeps the membership: the workers' master_addr and ports follow the
    # endpoint, its launcher may serve the workers' store, and losing it ends the job. Without one, no node is
    # special: any may be lost, and each round's rank 0 hosts the store
    has_node_0: bool = True
    fixed_count_elastic: bool = False  # a fixed --nnodes N is elastic too: a lost node's place may be taken
    heartbeat_timeout: Optional[float] = None  # its default heartbeat_timeout (None: the rendezvous's)
    # None: a crashed node is seen at once (its connection closes); else it is seen when its lease expires,
    # heartbeat_timeout after its last renewal, and this many seconds more
    expiry_lag: Optional[float] = None
    conf_keys: Tuple[str, ...] = ()  # its own --rdzv-conf keys (refused with another backend)
    url_scheme: Optional[str] = None  # Paddle 3.x's ``--master SCHEME://...`` names this backend
    elastic_server: bool = False  # Paddle 2.x's ``--elastic_server`` (PADDLE_ELASTIC_SERVER) is this backend's
    endpoint: Optional[str] = None  # the module (launcher.plan) that parses its endpoint
    forms: Optional[str] = None  # the module (its subpackage) whose ``form`` returns this launcher's link

    @property
    def names(self) -> Tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def any_node_may_be_lost(self) -> bool:
        """No node is special: the job goes on without any one of them, the first included."""
        return not self.has_node_0

    @property
    def subpackage(self) -> Optional[str]:
        """Its subpackage of ``launcher.nodes.elastic`` (the package of ``forms``)."""
        return self.forms.rpartition(".")[0] if self.forms else None

    def failure_grace(self, heartbeat_timeout: float) -> float:
        """How long the verdict on a worker failure waits for a loss that would explain it: a backend that finds
        a crashed node only when its lease expires waits that long, and its lag in deleting the lease's keys;
        one that sees a connection close at once does not wait."""
        return 0.0 if self.expiry_lag is None else heartbeat_timeout + self.expiry_lag

    def endpoint_module(self) -> ModuleType:
        """Its endpoint's module, imported now (an elastic job's line only: every launch would pay its import)."""
        return importlib.import_module(self.endpoint)


STATIC = Backend("static", elastic=False)
C10D = Backend("c10d", endpoint="launcher.plan.c10d", forms="launcher.nodes.elastic.c10d.start")
ETCD = Backend(  # etcd-v2 (torchrun's newer etcd backend) is etcd here
    "etcd", aliases=("etcd-v2",), has_node_0=False, fixed_count_elastic=True,
    heartbeat_timeout=10.0,  # torchrun's etcd lease; it outlasts the election of etcd's next leader (1-2 s)
    expiry_lag=1.0,  # etcd's leader looks for expired leases every 500 ms, then deletes their keys through Raft
    conf_keys=("cacert", "cert", "key", "password", "protocol", "user"), url_scheme="etcd", elastic_server=True,
    endpoint="launcher.plan.etcd", forms="launcher.nodes.elastic.etcd.start")

ROWS = (STATIC, C10D, ETCD)
FIXED = STATIC  # a job of fixed nodes: torchrun's default rendezvous
RANGE = C10D  # a range of nodes around node 0 when no backend is named (Paddle's --master IP:PORT)
NAMES = tuple(name for row in ROWS for name in row.names)  # every name the command line takes
BY_NAME: Dict[str, Backend] = {name: row for row in ROWS for name in row.names}


def backend_named(name, option: str = "--rdzv-backend") -> Backend:
    """The row of ``name`` (any case), or one sentence that lists the backends."""
    text = str(name).strip().lower()
    if text not in BY_NAME:
        known = sorted(row.name for row in ROWS)
        raise LaunchError(f"{option} {text} is not a rendezvous backend of this launcher; give "
                          f"{', '.join(known[:-1])} or {known[-1]}.")
    return BY_NAME[text]


def for_url(text, option: str = "--master") -> Optional[Backend]:
    """The row that Paddle 3.x's ``--master SCHEME://...`` names (None: no ``://``, node 0's IP:PORT); a scheme of no
    row's is refused, naming the ones there are."""
    if text is None or "://" not in str(text):
        return None
    scheme = str(text).strip().partition("://")[0].lower()
    row = next((row for row in ROWS if row.url_scheme and row.url_scheme == scheme), None)
    if row is None:
        urls = " or ".join(f"{row.url_scheme}://HOST:PORT of {row.name}" for row in ROWS if row.url_scheme)
        raise LaunchError(f"{option} {without_password(text)} is not IP:PORT; give node 0's address and a free port, "
                          f"such as 10.0.0.1:8090 (or {urls}, with --nnodes).")
    return row


def without_password(text) -> str:
    """``SCHEME://USER:PASSWORD@HOSTS`` as ``SCHEME://...@HOSTS``: how a message names a value (never its password)."""
    scheme, sep, rest = str(text).strip().partition("://")
    _, at, hosts = rest.rpartition("@")
    return f"{scheme}{sep}...@{hosts}" if sep and at else str(text).strip()


def elastic_server() -> Backend:
    """The backend of Paddle 2.x's ``--elastic_server``."""
    return next(row for row in ROWS if row.elastic_server)


def split_conf(text: Optional[str], row: Backend) -> Tuple[str, dict]:
    """torchrun's ``--rdzv-conf`` as (its rendezvous settings, the keys of ``row``'s own); a key of another
    backend's is refused, and so is a key given twice with two values."""
    kept, own, foreign = [], {}, {}
    for item in (part.strip() for part in str(text or "").split(",")):
        key, eq, value = (s.strip() for s in item.partition("="))
        owner = next((r for r in ROWS if key in r.conf_keys), None) if eq else None
        if owner is None:
            if item:
                kept.append(item)
            continue
        given = own if owner is row else foreign.setdefault(owner, {})
        if key in given and given[key] != value:
            raise LaunchError(f"--rdzv-conf gives {key} twice ({key}={given[key]}, {key}={value}); give it once.")
        given[key] = value
    for owner, keys in foreign.items():
        raise LaunchError(f"--rdzv-conf {','.join(keys)}= is for an {owner.name} rendezvous; give --rdzv-backend "
                          f"{owner.name}, or drop it.")
    return ",".join(kept), own
