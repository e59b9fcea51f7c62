"""The membership's backends by name, and this launcher's link to the job through the one its spec names:
a new backend is one subpackage (its ``form``) and one line here."""

from __future__ import annotations

from typing import Callable, Dict, Optional

from launcher.nodes.elastic.link import Link
from launcher.plan.elastic import ElasticSpec


def _c10d(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str]) -> Link:
    from launcher.nodes.elastic.c10d import start

    return start.form(spec, job_id, workers, token)


def _etcd(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str]) -> Link:
    from launcher.nodes.elastic.etcd import client, start  # only an etcd job imports etcd's client (its extra)

    client.check_extra()
    return start.form(spec, job_id, workers, token)


BACKENDS: Dict[str, Callable[[ElasticSpec, str, int, Optional[str]], Link]] = {"c10d": _c10d, "etcd": _etcd}


def form(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str]) -> Link:
    """This launcher's link to the job's membership once its first round started (``StartFailed`` if it cannot)."""
    return BACKENDS[spec.backend](spec, job_id, workers, token)
