"""Forming an etcd elastic job's link: this launcher's lease and node key, then its first round."""

from __future__ import annotations

import socket
import time
from typing import Callable, Optional

from launcher.nodes.elastic.etcd.client import KeyValue
from launcher.nodes.elastic.etcd.lease import request_timeout
from launcher.nodes.elastic.etcd.link import EtcdLink
from launcher.plan.elastic import ElasticSpec


def form(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic, client: Optional[KeyValue] = None, health=None) -> EtcdLink:
    """This launcher's link once its first round started (its ``first`` is None: a standby whose job ended
    with 0). StartFailed when the job does not take it or cannot start; without ``client``, etcd's client of the
    etcd extra, or one sentence that says how to install it (before anything starts). ``health``: its checkup goes in
    its node key, which the keeper judges (a launcher kept out checks again every interval)."""
    if client is None:
        from launcher.nodes.elastic.etcd.client import Etcd3gwClient, check_extra

        check_extra()
        client = Etcd3gwClient(spec.etcd, request_timeout(spec))
    return first_round(EtcdLink(spec, job_id, workers, token, clock, client, source_address(spec), health=health))


def first_round(link: EtcdLink) -> EtcdLink:
    """``link`` once it joined and its first round started (closed again if that fails)."""
    try:
        link.start()
        link.first = link.await_first_round()
    except BaseException:
        link.close()
        raise
    return link


def source_address(spec: ElasticSpec) -> str:
    """This machine's address on the way to etcd's first endpoint (how the other nodes reach it)."""
    host, port = spec.etcd.endpoints[0]
    try:
        family = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as s:
            s.connect(family[4])
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()  # the other nodes resolve it as this machine's address
