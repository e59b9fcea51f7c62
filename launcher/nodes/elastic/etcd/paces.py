"""Each launcher's speed in an etcd job (``messages.NodeSpeed``): its key ``pace/NODE`` under its lease, rewritten
while its workers report steps, at most every SHARE_EVERY seconds (longer in a job of many nodes: every write goes to
every launcher's watch), and proven with the job token where there is one; and every member's entry of the running
round, read from the mirror, for the event loop. A launcher speaks for itself only: an entry counts under its
writer's node key's lease, of its own id, of its seat in the round."""

from __future__ import annotations

import json
from typing import Optional
from urllib.parse import quote, unquote

from launcher.nodes.elastic.etcd import keys as ek
from launcher.nodes.elastic.etcd.client import Refused, Unavailable
from launcher.nodes.elastic.link import member
from launcher.nodes.transport import auth, messages
from launcher.output.messages import log
from launcher.plan.policy import one_line
from launcher.untrusted import json_object

NODES_PER_PERIOD = 16  # a job of more members writes its paces less often, in proportion


def pace_key(prefix: str, node_id: str) -> str:
    return f"{prefix}pace/{quote(node_id, safe='')}"


def node_id_of(key: str, prefix: str) -> str:
    """The node id of a pace key."""
    return unquote(key[len(prefix) + len("pace/"):])


def pace_value(node_id: str, lease: int, entry: messages.NodeSpeed, token: Optional[str], job_id: str) -> str:
    body = {"id": node_id, "entry": entry.as_list()}
    text = json.dumps(body, sort_keys=True)
    return json.dumps({**body, "proof": auth.proof(token, f"{text} lease {lease}", job_id, node_id) if token else None})


def read_pace(value: str, lease: int, node_lease: int, token: Optional[str], job_id: str):
    """(node id, NodeSpeed) of a pace key's value; None when malformed, unproven, or not under its node's lease."""
    data = json_object(value)
    if data is None or lease != node_lease or not isinstance(data.get("id"), str):
        return None
    body = {"id": data["id"], "entry": data.get("entry")}
    if not ek.proven(data.get("proof"), token, f"{json.dumps(body, sort_keys=True)} lease {lease}", job_id, body["id"]):
        return None
    entries = messages.read_speeds([body["entry"]])
    return (body["id"], entries[0]) if entries else None


class Paces:
    """This launcher's pace key, and the members' entries last given to its event loop."""

    def __init__(self, prefix: str, node_id: str, token: Optional[str], job_id: str, where: str) -> None:
        self.prefix, self.node_id, self.token, self.job_id, self.where = prefix, node_id, token, job_id, where
        self.written_at = float("-inf")
        self.given: tuple = ()

    @staticmethod
    def spacing(round_) -> float:
        """Seconds between two writes of this node's pace beyond the event loop's own spacing (SHARE_EVERY, which
        it keeps already): none in a job of up to NODES_PER_PERIOD nodes, where a second limit of the same period
        would drop every other entry that came a moment early; in a larger one its writes spread further, each
        within a tenth of its period (every launcher watches every write)."""
        members = len(round_.members or ()) if round_ is not None else 1
        periods = members // NODES_PER_PERIOD
        return 0.0 if periods <= 1 else 0.9 * messages.SHARE_EVERY * periods

    def write(self, client, lease: int, entry, round_, now: float) -> None:
        if entry is None or now - self.written_at < self.spacing(round_):
            return
        self.written_at = now
        try:
            client.put(pace_key(self.prefix, self.node_id), pace_value(self.node_id, lease, entry, self.token,
                                                                       self.job_id), lease)
        except (Unavailable, Refused) as e:
            log.debug("elastic job: could not write this node's pace in %s (%s)", self.where, one_line(str(e), 200))

    def news(self, paces: dict, round_) -> Optional[tuple]:
        """The members' entries of ``round_`` (node id -> entry as the mirror read them), each of its member's seat,
        when they changed since last given; else None."""
        if round_ is None:
            return None
        entries = []
        for node_id, entry in paces.items():
            seat = member(round_, node_id)
            if seat is not None and entry.round == round_.number and entry.node == seat.node_rank:
                entries.append(entry)
        entries = messages.shared(entries)
        if entries == self.given:
            return None
        self.given = entries
        return entries
