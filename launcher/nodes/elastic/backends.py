"""This launcher's link to the job through the backend its spec names: the ``form`` of the module its row
names (``launcher.plan.elastic_backends``), in the backend's own subpackage. A new backend is one row there and
one subpackage here; nothing in this module names one."""

from __future__ import annotations

import importlib
from typing import Optional

from launcher.nodes.elastic.link import Health, Link
from launcher.plan.elastic import ElasticSpec


def form(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str], health: Optional[Health] = None) -> Link:
    """This launcher's link to the job's membership once its first round started (``StartFailed`` if it cannot);
    the backend's ``form`` makes any check it needs first (etcd's: its extra installed). ``health``: this launcher's
    health checks, judged as it joins and after each of its worker failures."""
    row = spec.backend_row
    if row.forms is None or not row.forms.startswith(f"{__package__}."):
        raise ValueError(f"the {row.name} rendezvous forms no elastic job")  # static: a fixed job, never here
    return importlib.import_module(row.forms).form(spec, job_id, workers, token, health=health)
