"""What must hold of the elastic membership (launcher.nodes.elastic.membership) after every step of any history,
checked on random ones (hypothesis): joins good and bad, losses, silences, heartbeats, reports of the current and
of stale rounds, worker failures, the job's end, time passing on a fake clock, and (etcd) another launcher taking
the record over when the keeper is lost (``etcd.state.take_over``, then ``reconcile``, as that backend does).

Checked after EVERY ``decide``:

- each round started: node ranks 0..n-1, global ranks dense from 0 and contiguous per node (first ranks are the
  sums of the workers before), the world size their sum, MIN <= n <= MAX, no id twice, the keeper its node 0
  (c10d; with etcd a keeper that took over keeps the node rank it had), numbers up by exactly 1, ever;
- no node in two places (members and standbys apart, no id twice), each with a whole number of workers of its own
  (nodes of different sizes are admitted); a member lost while a standby of its size waits has its place taken by
  the first such standby, at its index (every rank stays); a member
  while a round runs is a member of that round, in its order; ``heard`` is of the nodes known but the keeper;
- an id becomes known only with an ``Admit`` of its own ``JoinAsked`` (a lost, dropped or refused launcher comes
  back only through a new hello); a node dropped is out; node 0 is never dropped;
- a report takes an id out of the stops awaited only when it is that node's (else the node is lost);
- after ``TimePassed`` the next deadline is in the future (no busy loop), and ``next_deadline`` is what the rule
  says it is (computed here the slow way, from plain values); ``EndJob`` at most once, then nothing but Refuse;
- the state given to ``decide`` reads the same after it, and ``decide`` on it again gives the same (the state is
  a value a caller can keep: the persistent containers' versions).

At the end of each history, time runs far ahead: every stop ordered has by then been reported or its node lost,
or the job has ended.

Deterministic (``derandomize``, no example database) and without timing: well under 20 s on a busy machine.
"""

from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from launcher.nodes.elastic import membership as m
from launcher.nodes.elastic.etcd import keys as ek, state as es
from launcher.plan.elastic import ElasticSpec, Rendezvous

JOB = "job"
FAR = 1e7  # past every deadline of any history here
SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def specs(draw) -> ElasticSpec:
    low = draw(st.sampled_from([1, 1, 2, 2, 3, 4, 5, 6]))
    rendezvous = Rendezvous(join_timeout=draw(st.sampled_from([60.0, 60.0, 5.0])),
                            last_call_timeout=draw(st.sampled_from([0.0, 1.0])),
                            close_timeout=draw(st.sampled_from([2.0, 30.0])),
                            heartbeat_timeout=draw(st.sampled_from([3.0, 10.0])))
    return ElasticSpec(low, draw(st.integers(low, 6)), draw(st.sampled_from(["c10d", "etcd"])), job_id=JOB,
                       rendezvous=rendezvous, max_restarts=draw(st.integers(0, 2)),
                       failed_node_leaves=draw(st.booleans()))


SMALL = st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.5, 1.0, 1.0, 2.0])  # most steps come close together
DT = st.one_of(SMALL, SMALL, SMALL, SMALL, st.sampled_from([3.0, 5.0, 10.0, 30.0, 60.0]),
               st.floats(0, 12, allow_nan=False, allow_infinity=False))
WHO = st.integers(0, 8)  # a known node by its place (8: a stranger)
JOINS = st.sampled_from(["ok", "ok", "ok", "ok", "wrong_job", "taken", "other_workers", "bad_id", "again"])
EVERYONE = 255
KINDS = (["join"] * 6 + ["joins"] * 4 + ["beat"] * 8 + ["time"] * 4 + ["stopped_all"] * 5 + ["stopped"] * 2
         + ["close"] * 3 + ["done"] + ["done_all"] + ["failed"] * 2 + ["ended"] + ["takeover"] * 2)


@st.composite
def steps(draw) -> tuple:
    """One step: (kind, seconds since the last, what else the kind needs)."""
    kind, dt = draw(st.sampled_from(KINDS)), draw(DT)
    if kind == "join":  # one launcher's hello, good or bad
        return kind, dt, draw(JOINS), draw(WHO)
    if kind == "joins":  # that many good ones at once
        return kind, dt, draw(st.integers(1, 6))
    if kind == "beat":  # the nodes whose bit is set beat; the others are silent
        return kind, dt, draw(st.one_of(st.just(EVERYONE), st.integers(0, EVERYONE)))
    if kind == "close":
        return kind, dt, draw(WHO)
    if kind in ("stopped", "done"):  # True: a report of the round before (stale)
        return kind, dt, draw(WHO), draw(st.booleans())
    if kind == "failed":
        return kind, dt, draw(WHO), draw(st.booleans()), draw(st.integers(1, 3))
    if kind == "ended":
        return kind, dt, draw(st.integers(0, 2))
    return kind, dt  # time, stopped_all, done_all, takeover (etcd only: another launcher takes the record over)


HISTORIES = st.tuples(specs(), st.integers(1, 2), st.lists(steps(), min_size=8, max_size=60))


def ids(nodes) -> list:
    return [n.node_id for n in nodes]


def plain(state: m.State) -> tuple:
    """Everything a state says, as plain values."""
    return (state.phase, state.keeper, tuple(state.members), tuple(state.standbys), dict(state.heard), state.rounds,
            frozenset(state.unstopped), state.stop_began, state.why, state.left, state.restarts, state.wait_began,
            state.min_reached, state.end, frozenset(state.done), state.failure)


def unpersisted(state: m.State) -> m.State:
    """The same state built from tuples, a dict and frozensets, as a state made outside the rules is."""
    return replace(state, members=tuple(state.members), standbys=tuple(state.standbys), heard=dict(state.heard),
                   unstopped=frozenset(state.unstopped), done=frozenset(state.done), index=None)


def slow_deadline(state: m.State):
    """``next_deadline`` as its rule says, from plain values."""
    if state.phase == m.ENDED:
        return None
    r = state.spec.rendezvous
    times = [at + r.heartbeat_timeout for at in dict(state.heard).values()]
    if state.unstopped:
        times.append(state.stop_began + r.close_timeout)
    if state.failure is not None:
        times.append(state.failure[1] + state.spec.failure_grace)
    if state.phase == m.WAITING and len(state.members) < state.spec.min_nodes:
        times.append(state.wait_began + r.join_timeout)
    elif state.phase == m.WAITING and state.min_reached is not None and not state.unstopped and state.failure is None:
        times.append(state.min_reached + r.last_call_timeout)
    return min(times, default=None)


class Replay:
    """One history, checked at each step."""

    def __init__(self, spec: ElasticSpec, workers: int) -> None:
        self.spec, self.workers, self.now, self.count = spec, workers, 0.0, 0
        self.lost: list = []  # ids once known, now gone
        self.came = {"k": 0}  # id -> when it was admitted last (its node key's create revision, with etcd)
        self.last_round, self.ends, self.took_over = 0, 0, False
        keeper = m.Node("k", "10.0.0.1", workers)
        self.state, actions = m.begin(spec, keeper, JOB, 0.0)
        self.check(None, m.State(spec, "k", JOB, members=(keeper,)), self.state, actions)

    def known(self) -> list:
        return list(self.state.members) + list(self.state.standbys)

    def who(self, k: int) -> str:
        nodes = self.known()
        return "stranger" if k >= 8 else nodes[k % len(nodes)].node_id

    def new_node(self, workers=None, node_id=None) -> m.Node:
        self.count += 1
        return m.Node(f"n{self.count}" if node_id is None else node_id, f"10.0.1.{self.count}",
                      self.workers if workers is None else workers)

    def step(self, step: tuple) -> None:
        kind, dt = step[0], step[1]
        self.now += dt
        state = self.state
        number = state.round.number if state.round else 0
        if kind == "join":
            variant, k = step[2], step[3]
            node = self.new_node(self.workers + 1 + k % 2 if variant == "other_workers" else None,
                                 self.who(k % 8) if variant == "taken" else "" if variant == "bad_id"
                                 else self.lost[k % len(self.lost)] if variant == "again" and self.lost else None)
            self.feed(m.JoinAsked(node, "other" if variant == "wrong_job" else JOB))
        elif kind == "joins":
            for _ in range(step[2]):
                self.feed(m.JoinAsked(self.new_node(), JOB))
        elif kind == "close":
            self.feed(m.Closed(self.who(step[2])))
        elif kind == "beat":
            beating = [n for i, n in enumerate(self.known()) if step[2] >> (i % 8) & 1]
            self.feed(m.Heartbeat(at={n.node_id: self.now for n in beating}))
        elif kind == "stopped_all":
            for node_id in sorted(state.unstopped):
                self.feed(m.WorkersStopped(node_id, number))
        elif kind == "done_all":
            for node_id in ids(state.members):
                self.feed(m.RoundDone(node_id, number))
        elif kind in ("stopped", "done", "failed"):
            node_id, round_ = self.who(step[2]), number - 1 if step[3] else number
            self.feed(m.WorkersStopped(node_id, round_) if kind == "stopped" else m.RoundDone(node_id, round_)
                      if kind == "done" else m.WorkerFailed(node_id, round_, step[4], f"rank failed ({step[4]})"))
        elif kind == "ended":
            self.feed(m.JobEnded(step[2], "told to end"))
        elif kind == "time":
            self.feed(m.TimePassed())
        elif kind == "takeover" and self.spec.backend == "etcd" and state.phase != m.ENDED and len(self.known()) > 1:
            self.take_over()

    def feed(self, event) -> None:
        before, kept = self.state, plain(self.state)
        after, actions = m.decide(before, event, self.now)
        assert plain(before) == kept, "decide changed the state it was given"
        again, same = m.decide(before, event, self.now)  # an older version, used again
        assert (plain(again), same) == (plain(after), actions)
        other, also = m.decide(unpersisted(before), event, self.now)
        assert (plain(other), also) == (plain(after), actions)
        self.check(event, before, after, actions)

    def take_over(self) -> None:
        """The keeper is lost: the oldest launcher left reads the record back from etcd and keeps it, as etcd's
        does (``keeper_of``)."""
        before, gone = self.state, self.state.keeper
        theirs = es.decode(es.encode(es.Record(before), None, JOB), self.spec, JOB, None, self.now)
        alive = {n.node_id: ek.Joiner(n, 1, self.came[n.node_id], True) for n in self.known() if n.node_id != gone}
        me = alive[es.keeper_of(alive.values())].node
        record, actions = es.take_over(theirs, self.spec, me, JOB, alive, self.now)
        record, more, _ = es.reconcile(record, alive, [], set(), self.now)
        self.took_over = True
        self.check(m.Closed(gone), before, record.state, actions + more)

    def finish(self) -> None:
        """Time runs far ahead: every stop ordered is by then reported or its node lost, or the job is over."""
        for far in (FAR, 2 * FAR):
            self.now = far
            self.feed(m.TimePassed())
        assert self.state.phase == m.ENDED or not self.state.unstopped, self.state.unstopped
        assert m.next_deadline(self.state) is None or m.next_deadline(self.state) > self.now

    @staticmethod
    def check_promotion(event, before: m.State, after: m.State) -> None:
        """A member whose connection closed: the first standby of its size, if any, is in its place."""
        lost = next((n for n in before.members if isinstance(event, m.Closed) and n.node_id == event.node_id), None)
        if lost is None or lost.node_id == before.keeper or after.phase == m.ENDED:
            return
        same = next((n for n in before.standbys if n.workers == lost.workers), None)
        if same is not None:
            assert after.members[list(before.members).index(lost)] is same

    def check(self, event, before: m.State, after: m.State, actions: tuple) -> None:
        spec, kinds = self.spec, [type(a) for a in actions if not isinstance(a, m.Say)]
        self.state = after
        if before.phase == m.ENDED:  # the end is the end
            assert set(kinds) <= {m.Refuse} and plain(after) == plain(before)
            return
        # every round started: ranks dense and contiguous, MIN to MAX nodes, numbers one up, node 0 the keeper's
        if m.StartRound in kinds:  # no round is started and stopped in one turn
            assert m.StopWorkers not in kinds[kinds.index(m.StartRound):]
        for round_ in (a.round for a in actions if isinstance(a, m.StartRound)):
            members = round_.members
            assert round_.number == self.last_round + 1
            self.last_round = round_.number
            assert spec.min_nodes <= len(members) <= spec.max_nodes
            assert [x.node_rank for x in members] == list(range(len(members)))
            assert [x.first_rank for x in members] == [sum(y.node.workers for y in members[:i])
                                                      for i in range(len(members))]
            assert round_.world_size == sum(x.node.workers for x in members)
            assert len(set(ids(x.node for x in members))) == len(members)
            assert self.took_over or members[0].node.node_id == after.keeper
            assert round_.restarts <= spec.max_restarts
        # no node in two places; all with the same workers; the index and ``heard`` of these very nodes
        known = ids(after.members) + ids(after.standbys)
        assert len(set(known)) == len(known) and len(after.members) <= spec.max_nodes  # standbys: any number
        assert all(after.known(n.node_id) is n for n in list(after.members) + list(after.standbys))
        assert len(after.index[2]) == len(known)
        assert all(type(n.workers) is int and n.workers >= 1 for n in list(after.members) + list(after.standbys))
        self.check_promotion(event, before, after)
        assert set(after.heard) == set(known) - {after.keeper}
        assert after.heard.low() == min(dict(after.heard).values(), default=None)
        assert not after.standbys or len(after.members) == spec.max_nodes  # a standby waits only for a place
        if after.phase != m.ENDED:
            assert after.keeper in ids(after.members) and (self.took_over or ids(after.members)[0] == after.keeper)
        assert after.restarts <= spec.max_restarts and not (spec.failed_node_leaves and after.restarts)
        if after.phase == m.RUNNING:
            assert [x.node for x in after.round.members] == list(after.members)
        if after.phase == m.REFORMING:
            assert set(after.unstopped) <= set(ids(x.node for x in after.round.members))
        # an id becomes known only with its Admit, which answers its own hello
        admitted = {a.node_id for a in actions if isinstance(a, m.Admit)}
        self.came.update(dict.fromkeys(admitted, len(self.came) + 1))
        assert admitted <= ({event.node.node_id} if isinstance(event, m.JoinAsked) else set())
        before_known = set(ids(before.members) + ids(before.standbys))
        assert set(known) - before_known == admitted - before_known
        assert admitted <= set(known) or after.phase == m.ENDED
        for action in actions:
            if isinstance(action, m.StopWorkers):  # the running round's members still in, from its node 0 on
                assert before.round is not None and action.round == before.round.number
                assert set(after.unstopped) <= set(action.nodes)
                assert list(action.nodes) == [x for x in ids(y.node for y in before.round.members) if x in action.nodes]
            if isinstance(action, m.EndJob):
                assert action.nodes == tuple(known)
            if isinstance(action, m.Drop):
                assert action.node_id != after.keeper and action.node_id not in known
            if isinstance(action, m.Refuse):
                assert action.node_id not in set(known) - before_known
        self.lost += sorted(before_known - set(known))
        # a stop awaited ends with that node's report, or with its loss
        for node_id in set(before.unstopped) - set(after.unstopped):
            reported = isinstance(event, (m.WorkersStopped, m.RoundDone)) and event.node_id == node_id
            assert node_id not in known or reported
        self.ends += kinds.count(m.EndJob)
        assert self.ends <= 1 and (after.phase == m.ENDED) == (self.ends == 1)
        if isinstance(event, m.TimePassed):
            assert m.next_deadline(after) is None or m.next_deadline(after) > self.now
        assert m.next_deadline(after) == slow_deadline(after)


def found(low, high, backend="c10d", join=60.0, last_call=0.0, restarts=0, leaves=False) -> ElasticSpec:
    """The spec of a history hypothesis found (close_timeout 2 s, heartbeat_timeout 3 s)."""
    return ElasticSpec(low, high, backend, job_id=JOB, rendezvous=Rendezvous(
        join_timeout=join, last_call_timeout=last_call, close_timeout=2.0, heartbeat_timeout=3.0),
        max_restarts=restarts, failed_node_leaves=leaves)


# the histories hypothesis shrank each bug it found to (tests/test_membership.py has each as a story of its own)
@example((found(1, 1, "etcd", join=5.0), 1, [("join", 0.0, "ok", 0), ("takeover", 0.0)])).via(
    "a keeper that took over was dropped for its own silence")
@example((found(2, 3, join=5.0), 1, [("join", 0.0, "ok", 0), ("time", 0.0), ("close", 0.0, 1),
                                     ("join", 0.0, "ok", 0)])).via(
    "a last call over while a stop is awaited gave a deadline in the past: node 0's keeper spun")
@example((found(1, 1, "etcd", restarts=1, leaves=True), 1, [
    ("joins", 0.0, 1), ("failed", 0.0, 0, False, 1), ("time", 0.0), ("stopped_all", 0.0), ("joins", 0.0, 1),
    ("joins", 0.0, 1), ("joins", 0.0, 1), ("join", 0.0, "ok", 0)])).via(
    "elastic level 0 with etcd: node 0's worker failure spent a restart instead of ending the job")
@example((found(1, 6, last_call=1.0), 1, [("joins", 0.0, 1), ("joins", 0.0, 1), ("join", 0.0, "ok", 0), ("time", 0.0),
                                          ("time", 0.0), ("time", 0.0), ("joins", 0.0, 1), ("time", 0.0)])).via(
    "silent nodes found together before a round: one started a round the next one stopped at once")
@SETTINGS
@given(HISTORIES)
def test_every_history_keeps_the_invariants(history):
    spec, workers, steps = history
    replay = Replay(spec, workers)
    for step in steps:
        replay.step(step)
    replay.finish()
