"""Why a launcher left an etcd job, told by whoever saw it go, in a key of its own: ``gone/NODE``, under no lease (it
outlives the lease it explains). The launcher that leaves on a stop signal writes ``left``; the one before a gone
launcher in the liveness ring writes ``lost``. Each is written before the lease is revoked, so that a keeper that
finds the node key gone has the marker too: its watch gives the events in revision order. A node key gone without
one is a lease that expired: the launcher was silent for heartbeat_timeout. With a job token, the launcher that
wrote a marker proves it. Pure: no etcd. The job's keys, these among them, are cleared by its last launcher."""

from __future__ import annotations

import json
from typing import Optional, Tuple
from urllib.parse import quote

from launcher.nodes.elastic.model import LEAVES, SILENT
from launcher.nodes.transport import auth
from launcher.untrusted import json_object

LEFT, LOST = "left", "lost"
REASON_WIDTH = 300


def gone_key(prefix: str, node_id: str) -> str:
    return f"{prefix}gone/{quote(node_id, safe='')}"


def gone_value(kind: str, reason: str, writer: str, token: Optional[str], job_id: str) -> str:
    body = {"kind": kind, "reason": reason[:REASON_WIDTH], "by": writer}
    proof = auth.proof(token, json.dumps(body, sort_keys=True), job_id, writer) if token else None
    return json.dumps({**body, "proof": proof})


def read_gone(value: str, token: Optional[str], job_id: str) -> Optional[Tuple[str, str]]:
    """(kind, reason) of a marker; None when it is not one (malformed, or unproven where the job has a token)."""
    data = json_object(value)
    if data is None:
        return None
    body = {"kind": data.get("kind"), "reason": data.get("reason"), "by": data.get("by")}
    if body["kind"] not in (LEFT, LOST) or not isinstance(body["reason"], str) or not isinstance(body["by"], str):
        return None
    if token and not auth.proves(data.get("proof"), auth.proof(token, json.dumps(body, sort_keys=True), job_id,
                                                                 body["by"])):
        return None
    return body["kind"], body["reason"][:REASON_WIDTH]


def why_gone(marker: Optional[Tuple[str, str]], heartbeat_timeout: float) -> str:
    """The reason the membership's rules get for a launcher whose node key is gone (``model.change_kind`` reads its
    kind back: left, lost or silent)."""
    if marker is None:
        return f"{SILENT} {heartbeat_timeout:g} s: its lease in etcd expired"
    kind, reason = marker
    return f"{reason}; {LEAVES}" if kind == LEFT else f"its launcher is gone ({reason})"
