"""The keys of an elastic job in etcd, and the values each launcher writes under its lease: its node key (who it is,
its proof of the job token, its liveness ring's address) and its reports, each read back as the membership's
model. Pure: no etcd, no clock. The layout of the keys is in ``state``'s docstring."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Tuple
from urllib.parse import quote, unquote

from launcher.nodes.elastic import model as mb
from launcher.nodes.transport import auth
from launcher.untrusted import json_object

ROOT = "/launcher/"
KINDS = ("stopped", "done", "failed")


def job_prefix(job_id: str) -> str:
    return f"{ROOT}{quote(job_id, safe='')}/"


def node_key(prefix: str, node_id: str) -> str:
    return f"{prefix}nodes/{quote(node_id, safe='')}"


def report_key(prefix: str, node_id: str, kind: str) -> str:
    return f"{prefix}report/{quote(node_id, safe='')}/{kind}"


def record_key(prefix: str) -> str:
    return f"{prefix}record"


def orders_span(prefix: str) -> Tuple[str, str]:
    """The keys a launcher that does not keep the membership reads: the node keys (who keeps it), the paces and the
    record (its orders), not the reports (a report of each node's stop would go to every launcher: N² at a round's end).
    A range from the first node key up to, not including, the key just after the record."""
    return f"{prefix}nodes/", record_key(prefix) + "\0"


def read_node_id(key: str, prefix: str) -> str:
    """The node id of a report key (``report/NODE/KIND``)."""
    return unquote(key[len(prefix) + len("report/"):].rpartition("/")[0])


def node_value(node: mb.Node, lease: int, token: Optional[str], job_id: str, ring: Optional[tuple] = None,
               checkup: Optional[dict] = None) -> str:
    """``ring``: where this launcher's liveness ring listens (``etcd.ring``), (host, port); ``checkup``: its health
    checkup (``health.Checkup.to_wire``), which the keeper judges each time the key is written."""
    proof = auth.proof(token, f"lease {lease}", job_id, node.node_id) if token else None
    return json.dumps({"id": node.node_id, "host": node.host, "workers": node.workers, "proof": proof,
                       "ring": list(ring) if ring else None, "checkup": checkup})


def report_value(node_id: str, lease: int, kind: str, round_: int, code: int = 0, reason: str = "",
                 token: Optional[str] = None, job_id: str = "", checkup: Optional[dict] = None) -> str:
    """``checkup``: a failure's, made after it (the keeper judges it before the failure spends a restart)."""
    body = {"id": node_id, "kind": kind, "round": round_, "code": code, "reason": reason,
            **({"checkup": checkup} if checkup is not None else {})}
    text = json.dumps(body, sort_keys=True)
    proof = auth.proof(token, f"{text} lease {lease}", job_id, node_id) if token else None
    return json.dumps({**body, "proof": proof})


@dataclass(frozen=True)
class Joiner:
    """A launcher as its node key shows it, with the lease its key is under and its key's create revision."""

    node: mb.Node
    lease: int
    created: int
    proven: bool  # it proves the job token (or the job has none and it proves none)
    ring: Optional[tuple] = None  # where its liveness ring listens (host, port), if it has one
    checkup: object = None  # its health checkup as written (judged by the keeper, never trusted)
    version: int = 0  # its key's mod revision: a checkup written again is judged again


def read_node(value: str, lease: int, created: int, token: Optional[str], job_id: str,
              version: int = 0) -> Optional[Joiner]:
    """A node key's value as a Joiner (None: not one of ours)."""
    data = json_object(value)
    if data is None or not isinstance(data.get("id"), str) or not data["id"]:
        return None
    node = mb.Node(data["id"], data.get("host") if isinstance(data.get("host"), str) else "", data.get("workers"))
    return Joiner(node, lease, created, proven(data.get("proof"), token, f"lease {lease}", job_id, node.node_id),
                  _ring_address(data.get("ring")), data.get("checkup"), version)


def _ring_address(value) -> Optional[tuple]:
    """A node key's ring address, (host, port), if it is one."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and 0 < len(value[0]) <= 255
            and type(value[1]) is int and 0 < value[1] < 65536):
        return None
    return value[0], value[1]


def read_report(value: str, lease: int, node_lease: int, token: Optional[str], job_id: str):
    """A report key's value as the membership's event (None: malformed, unproven, or not under the node's lease)."""
    data = json_object(value)
    if data is None or lease != node_lease or not isinstance(data.get("id"), str):
        return None
    body = {k: data.get(k) for k in ("id", "kind", "round", "code", "reason", "checkup") if k in data or k != "checkup"}
    if not proven(data.get("proof"), token, f"{json.dumps(body, sort_keys=True)} lease {lease}", job_id, body["id"]):
        return None
    round_, code, reason = body["round"], body["code"], body["reason"]
    if type(round_) is not int or type(code) is not int or not isinstance(reason, str):
        return None
    if body["kind"] == "stopped":
        return mb.WorkersStopped(body["id"], round_)
    if body["kind"] == "done":
        return mb.RoundDone(body["id"], round_)
    if body["kind"] == "failed":
        return mb.WorkerFailed(body["id"], round_, code, reason or "a worker failed", checkup=body.get("checkup"))
    return None


def proven(given, token: Optional[str], nonce: str, job_id: str, node_id: str) -> bool:
    """Whether ``given`` proves the job token on ``nonce`` for ``node_id`` (with no token: that it proves none)."""
    if token is None:
        return given is None
    return auth.proves(given, auth.proof(token, nonce, job_id, node_id))
