"""Who sits where in an elastic job's membership, pure: the members and standbys seated with the index of the ids
known, why a node may not join, whose place a lost member's goes to, and the sentence of a job that gave up waiting
(``membership`` applies them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Tuple

from launcher.nodes.elastic.model import Node, State
from launcher.nodes.elastic.persistent import Row


def seated(state: State, members: Row, standbys: Row, came=(), gone=(), **changes) -> State:
    """``state`` with these members and standbys, its index of the ids known changed by the nodes that ``came``
    and the ids ``gone``."""
    known = state.index[2].update({n.node_id: n for n in came}, gone)
    return replace(state, members=members, standbys=standbys, index=(members, standbys, known), **changes)


def refusal(state: State, node: Node, job_id: str) -> Optional[str]:
    """Why a node may not join, or None."""
    if job_id != state.job_id:
        return f"its job id is {job_id!r}, this job's is {state.job_id!r}"
    taken = state.known(node.node_id)
    if taken is not None:
        return (f"the node id {node.node_id!r} is taken by a launcher already in the job (on {taken.host}); "
                "each launcher makes an id of its own")
    if not (isinstance(node.node_id, str) and node.node_id and isinstance(node.host, str) and node.host):
        return f"its node id {node.node_id!r} or host {node.host!r} is not a name"
    if type(node.workers) is not int or node.workers < 1:
        return f"it has {node.workers!r} workers; a node needs one at least"
    if state.spec.node_hosts and node.host not in state.spec.node_hosts:
        return f"its host {node.host} is not one of the job's nodes ({','.join(state.spec.node_hosts)})"
    return None  # past MAX a node waits as a standby, however many wait already: no count of arrivals ends a launcher


def promote(state: State, node: Node) -> Tuple[Row, Row, str]:
    """(members, standbys, what became of the place) once member ``node`` is gone: the first standby of its size
    takes its place (every rank stays); none of its size, the first standby joins last, as a newcomer (the ranks
    after the lost node's move); no standby, the members close up. Standbys set aside (``aside``) are passed over."""
    staying = Row(n for n in state.members if n != node)
    fit = [n for n in state.standbys if n.node_id not in state.aside]  # one set aside by its checks is never promoted
    same = next((n for n in fit if n.workers == node.workers), None)
    if same is not None:
        members = Row(same if n == node else n for n in state.members)
        return members, Row(n for n in state.standbys if n != same), f"; standby {same.label} takes its place"
    if not fit:
        return staying, state.standbys, ""
    other = fit[0]
    return (staying.plus(other), Row(n for n in state.standbys if n != other),
            f"; standby {other.label} joins last ({other.workers} worker(s), not {node.workers}: the ranks after move)")


def gave_up(state: State) -> str:
    spec = state.spec
    wanted = f"{spec.min_nodes} needed (--nnodes {spec.nodes})"
    waited = f"{spec.rendezvous.join_timeout:g} s (join_timeout)"
    if state.round is None:
        return f"only {len(state.members)} node(s) joined within {waited}, {wanted}"
    lost = ", ".join(f"{node.label} ({reason})" for node, reason in state.left)
    return f"{len(state.members)} node(s) left after {waited}, {wanted}; lost: {lost}"
