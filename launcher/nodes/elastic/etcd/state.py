"""An elastic job's membership in etcd: the record the keeper writes (the membership and its orders), how the keys
feed the rules, and what a launcher reads from the record. Pure: no etcd, no clock (``now`` is given). What each
launcher writes under its lease is in ``keys``.

The keys of job ID (every one under ``/launcher/ID/``, the ID quoted so that no job's keys are
another's prefix):

- ``nodes/NODE``: each launcher's, under its lease (its heartbeat): its host, its workers, its proof
  of the job token. Its create revision orders the launchers: the live one that came first keeps
  the membership (it is the *keeper*), so that when the keeper is lost the next one takes over.
- ``report/NODE/KIND``: what a launcher tells the keeper, under its lease: its workers of a round
  ``stopped``, all ``done``, or one ``failed`` (the last of each kind; a later round's replaces it).
- ``pace/NODE``: each launcher's speed entry (``launcher.nodes.transport.messages.NodeSpeed``), under its lease, rewritten
  every few seconds while its workers report steps: every launcher reads every one and judges the job itself.
- ``gone/NODE``: why a launcher left, under no lease (``departures``): read by the keeper only.
- ``record``: the membership as the keeper decided it (``membership.State``) and its orders: the
  round to run, the stop of a round, the launchers refused or dropped, the job's end. Written only
  in a transaction guarded by its own last revision and the keeper's node key, so no two keepers
  can race each other into two memberships; proven with the job token when the job has one.

The keeper runs the same rules as node 0's launcher (``membership.decide``): ``reconcile`` feeds
them what the keys say that the state does not know yet (a launcher that came or left, a report),
so that a new keeper that takes over the record continues where the last one stopped. What
launchers read is ``view``: their orders in the record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from launcher.nodes.transport import auth
from launcher.nodes.elastic.etcd import keys as ek
from launcher.nodes.elastic import membership as mb
from launcher.nodes.elastic.model import round_start
from launcher.nodes.transport import messages as m
from launcher.plan.elastic import ElasticSpec
from launcher.untrusted import json_object

# ---------------------------------------------------------------- the keeper's record


@dataclass(frozen=True)
class Record:
    """The membership and the keeper's orders."""

    state: mb.State
    stop: Optional[Tuple[int, str]] = None  # the running round's stop (round, reason), until the next round
    refused: Mapping[str, str] = field(default_factory=dict)  # node id -> why it may not join
    dropped: Mapping[str, Tuple[int, str]] = field(default_factory=dict)  # node id -> (code, reason): counted out
    kept_out: Mapping[str, Tuple[int, str]] = field(default_factory=dict)  # id -> (its key's version, why): unfit
    checked: Mapping[str, int] = field(default_factory=dict)  # standby id -> its key's version judged (not written)


def apply(record: Record, state: mb.State, actions: Iterable) -> Record:
    """The record after ``membership.decide`` gave ``state`` and ``actions``."""
    stop, refused, dropped, kept_out = record.stop, dict(record.refused), dict(record.dropped), dict(record.kept_out)
    for action in actions:
        if isinstance(action, mb.KeepOut) and action.admitted:  # set aside: told why in its view
            kept_out[action.node_id] = (-1, action.reason)
        elif isinstance(action, mb.Admit):
            kept_out.pop(action.node_id, None)
        elif isinstance(action, mb.Refuse):
            refused[action.node_id] = action.reason
        elif isinstance(action, mb.Drop):
            dropped[action.node_id] = (action.code, action.reason)
        elif isinstance(action, mb.StopWorkers):
            stop = (action.round, action.reason)
        elif isinstance(action, mb.StartRound):
            stop = None
    return Record(state, stop, refused, dropped, kept_out, record.checked)


def orders(record: Record) -> Record:
    """The record without who has stopped or is done: the keeper writes the record when this changes, not at
    each launcher's report (each write goes to every launcher: a round's end would be N writes read by N
    launchers). No launcher's orders depend on the rest, and a keeper that takes over reads the reports again."""
    return replace(record, state=replace(record.state, unstopped=frozenset(), done=frozenset()))


def encode(record: Record, token: Optional[str], job_id: str) -> str:
    s = record.state
    body = json.dumps({
        "keeper": s.keeper, "phase": s.phase, "members": [_node(n) for n in s.members],
        "standbys": [_node(n) for n in s.standbys], "round": _round(s.round) if s.round else None,
        "unstopped": sorted(s.unstopped), "why": s.why, "left": [[_node(n), r] for n, r in s.left],
        "restarts": s.restarts, "end": list(s.end) if s.end else None, "done": sorted(s.done),
        "stop": list(record.stop) if record.stop else None, "refused": dict(record.refused),
        "dropped": {k: list(v) for k, v in record.dropped.items()},
        "kept_out": {k: list(v) for k, v in record.kept_out.items()},
        "aside": sorted(s.aside),
        "failure": [s.failure[0].node_id, s.failure[0].round, s.failure[0].code, s.failure[0].reason]
        if s.failure else None,
    }, sort_keys=True)
    return json.dumps({"body": body, "proof": _record_proof(token, body, job_id)})


def decode(value: str, spec: ElasticSpec, job_id: str, token: Optional[str], now: float) -> Optional[Record]:
    """The record in ``value`` (None: malformed, or it does not prove the job token); the state's clocks
    start at ``now`` (a keeper that takes over gives each deadline its whole time again)."""
    outer = json_object(value)
    if outer is None or not isinstance(outer.get("body"), str):
        return None
    if not _proven_record(outer.get("proof"), token, outer["body"], job_id):
        return None
    data = json_object(outer["body"])
    try:
        return _record(data, spec, job_id, now) if data is not None else None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        return None


def _record(data: dict, spec: ElasticSpec, job_id: str, now: float) -> Record:
    members, standbys = tuple(_read_node(n) for n in data["members"]), tuple(_read_node(n) for n in data["standbys"])
    round_ = _read_round(data["round"]) if data["round"] is not None else None
    phase = data["phase"]
    if phase not in (mb.WAITING, mb.REFORMING, mb.RUNNING, mb.ENDED):
        raise ValueError(phase)
    unstopped = frozenset(str(x) for x in data["unstopped"])
    end = (int(data["end"][0]), str(data["end"][1])) if data["end"] else None
    heard = {n.node_id: now for n in members + standbys}
    state = mb.State(spec=spec, keeper=str(data["keeper"]), job_id=job_id, phase=phase, members=members,
                     standbys=standbys, heard=heard, rounds=(round_,) if round_ else (), unstopped=unstopped,
                     stop_began=now if unstopped else None, why=str(data["why"]),
                     left=tuple((_read_node(n), str(r)) for n, r in data["left"]), restarts=int(data["restarts"]),
                     wait_began=now if phase == mb.WAITING else None,
                     min_reached=now if phase == mb.WAITING and len(members) >= spec.min_nodes else None,
                     end=end, done=frozenset(str(x) for x in data["done"]),
                     failure=_read_failure(data.get("failure"), now),
                     aside=frozenset(str(x) for x in data.get("aside") or ()))
    stop = (int(data["stop"][0]), str(data["stop"][1])) if data["stop"] else None
    refused = {str(k): str(v) for k, v in dict(data["refused"]).items()}
    dropped = {str(k): (int(v[0]), str(v[1])) for k, v in dict(data["dropped"]).items()}
    kept_out = {str(k): (int(v[0]), str(v[1])) for k, v in dict(data.get("kept_out") or {}).items()}
    return Record(state, stop, refused, dropped, kept_out)


# ---------------------------------------------------------------- the keeper


def keeper_of(joiners: Iterable[ek.Joiner]) -> Optional[str]:
    """The launcher that keeps the membership: the live one whose key is the oldest."""
    first = min(joiners, key=lambda j: j.created, default=None)
    return first.node.node_id if first is not None else None


def take_over(record: Optional[Record], spec: ElasticSpec, me: mb.Node, job_id: str, alive: Mapping[str, ek.Joiner],
              now: float) -> Tuple[Record, tuple]:
    """The keeper's record when this launcher becomes the keeper: the one in etcd, kept by this launcher now;
    a new one (``membership.begin``) when there is none, or it is of a run whose launchers are all gone or
    that ended."""
    stale = record is None or record.state.end is not None or not any(
        n.node_id in alive for n in record.state.members + record.state.standbys)
    if stale:
        state, actions = mb.begin(spec, me, job_id, now)
        return apply(Record(state), state, actions), actions
    state = replace(record.state, keeper=me.node_id)
    if state.known(me.node_id) is None:  # this launcher came, but the last keeper never admitted it
        state, actions = mb.decide(state, mb.JoinAsked(me, job_id), now)
        return apply(replace(record, state=state), state, actions), actions
    return replace(record, state=state), ()


def reconcile(record: Record, alive: Mapping[str, ek.Joiner], reports: List[Tuple[int, object]], fed: set,
              now: float, why_gone: Callable[[str], str] = lambda _: "its key in etcd is gone (its lease expired, or "
                                                                       "it left)",
              judge: Callable[[mb.Node, object], Optional[str]] = lambda *_: None) -> Tuple[Record, tuple, set]:
    """What the keys say that the keeper's state does not know yet, fed to the membership's rules: each launcher that
    left (its key gone: ``Closed``, with ``why_gone``'s reason), each that came (``JoinAsked``, in the order they came,
    its health checkup as ``judge`` finds it: one kept out is judged again once it writes its key again), each
    standby's key written again (``Checked``), each report not fed before (``fed``: their (key, revision); a failure's
    checkup judged), then the time. Returns the record, the actions to carry out, and the reports fed."""
    state, actions = record.state, []

    def feed(event):
        nonlocal state, record
        state, more = mb.decide(state, event, now)
        record = apply(record, state, more)
        actions.extend(more)

    for node in state.members + state.standbys:
        if node.node_id not in alive and node.node_id != state.keeper:
            feed(mb.Closed(node.node_id, why_gone(node.node_id)))
    state = replace(state, heard={k: now for k in state.heard if k in alive})
    record = replace(record, state=state)
    for joiner in sorted(alive.values(), key=lambda j: j.created):
        node_id = joiner.node.node_id
        if state.known(node_id) or node_id in record.refused or node_id in record.dropped:
            continue
        if not joiner.proven:
            record = replace(record, refused={**record.refused, node_id: "wrong job or job token"})
            actions.append(mb.Refuse(node_id, "wrong job or job token"))
            continue
        if record.kept_out.get(node_id, (None,))[0] == joiner.version:
            continue  # judged unfit as it is: judged again once it writes its key again
        unfit = judge(joiner.node, joiner.checkup)
        kept_out = {k: v for k, v in record.kept_out.items() if k in alive and k != node_id}
        record = replace(record, kept_out={**kept_out, node_id: (joiner.version, unfit)} if unfit else kept_out)
        feed(mb.JoinAsked(joiner.node, state.job_id, unfit))
    for node in state.standbys:  # each checks itself again every interval: its key written again
        joiner = alive.get(node.node_id)
        if joiner is not None and record.checked.get(node.node_id, joiner.version) != joiner.version:
            feed(mb.Checked(node.node_id, judge(node, joiner.checkup)))
        if joiner is not None:
            record = replace(record, checked={**record.checked, node.node_id: joiner.version})
    fed = set(fed)
    for ident, event in sorted(reports, key=lambda r: r[0][1]):
        if ident not in fed:
            fed.add(ident)
            checked = isinstance(event, mb.WorkerFailed) and event.checkup is not None and state.known(event.node_id)
            feed(replace(event, unfit=judge(checked, event.checkup)) if checked else event)
    feed(mb.TimePassed())
    return record, tuple(actions), fed


# ---------------------------------------------------------------- what a launcher reads


@dataclass(frozen=True)
class View:
    """This launcher's orders in the record."""

    round: Optional[m.RoundStart] = None  # the round it is a member of (the record's current one)
    stop: Optional[Tuple[int, str]] = None
    over: Optional[Tuple[int, str]] = None  # the job ended, or this launcher is out of it
    refused: Optional[str] = None
    standby: bool = False
    round_number: int = 0  # the record's current round, whether or not this launcher is in it
    job_ended: bool = False  # ``over`` is the job's end (not this launcher dropped)
    kept_out: Optional[str] = None  # why its health checks keep it out (it checks again and writes its key again)


def view(record: Record, node_id: str) -> View:
    s = record.state
    number = s.round.number if s.round else 0
    if node_id in record.dropped:
        code, reason = record.dropped[node_id]
        return View(over=(code, reason), round_number=number)
    if node_id in record.refused:
        return View(refused=record.refused[node_id], round_number=number)
    kept_out = record.kept_out.get(node_id, (0, None))[1]
    if kept_out is not None and s.known(node_id) is None:
        return View(round_number=number, kept_out=kept_out)
    over = s.end
    current = s.round if s.round is not None and s.round.member(node_id) is not None else None
    start = round_start(current) if current is not None else None
    stop = record.stop if record.stop is not None and current is not None and record.stop[0] == current.number else None
    standby = any(n.node_id == node_id for n in s.standbys)
    return View(start, stop, over, None, standby, number, over is not None, kept_out)


# ---------------------------------------------------------------- the parts


def _record_proof(token: Optional[str], body: str, job_id: str) -> Optional[str]:
    return auth.proof(token, hashlib.sha256(body.encode()).hexdigest(), job_id, "record") if token else None


def _proven_record(given, token: Optional[str], body: str, job_id: str) -> bool:
    if token is None:
        return given is None
    return auth.proves(given, _record_proof(token, body, job_id))


def _read_failure(item, now: float) -> Optional[tuple]:
    if item is None:
        return None
    node_id, round_, code, reason = item
    return mb.WorkerFailed(str(node_id), int(round_), int(code), str(reason)), now


def _node(node: mb.Node) -> list:
    return [node.node_id, node.host, node.workers]


def _read_node(item) -> mb.Node:
    node_id, host, workers = item
    if not isinstance(node_id, str) or not isinstance(host, str) or type(workers) is not int:
        raise ValueError(item)
    return mb.Node(node_id, host, workers)


def _round(round_: mb.Round) -> dict:
    return {"number": round_.number, "members": [[_node(x.node), x.node_rank, x.first_rank] for x in round_.members],
            "world_size": round_.world_size, "why": round_.why, "joined": [_node(n) for n in round_.joined],
            "left": [[_node(n), r] for n, r in round_.left], "restarts": round_.restarts}


def _read_round(data: dict) -> mb.Round:
    members = tuple(mb.Member(_read_node(n), int(rank), int(first)) for n, rank, first in data["members"])
    return mb.Round(number=int(data["number"]), members=members, world_size=int(data["world_size"]),
                    why=str(data["why"]), joined=tuple(_read_node(n) for n in data["joined"]),
                    left=tuple((_read_node(n), str(r)) for n, r in data["left"]), restarts=int(data["restarts"]))


Reports = List[Tuple[Tuple[str, int], object]]  # ((key, mod revision), membership event)
Alive = Dict[str, ek.Joiner]
