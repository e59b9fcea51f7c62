"""The tune link between the tuners of a job's nodes (launcher.nodes.tune), on real sockets on 127.0.0.1 with no
launcher: who is welcomed (the job token proven both ways), what reaches the leader from a follower (its lines of
the trial ordered, its ends), and what costs a follower its place (junk, a message no tuner sends); the messages read
off the wire never raise; where the leader is, pure (launcher.plan.tune_nodes). No test asserts a duration."""

import socket
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import LaunchError
from launcher.nodes.transport import wire
from launcher.nodes.transport.messages import Unknown, from_wire
from launcher.nodes.transport.tune_messages import TrialEnded, TrialLines, TrialOrder, TrialStop, TuneOver
from launcher.nodes.tune.follower import Leader, LeaderGone
from launcher.nodes.tune.leader import Followers
from launcher.plan import elastic_backends
from launcher.plan.elastic_spec import ElasticSpec
from launcher.plan.tune_nodes import tune_nodes
from tests.conftest import free_port

BOUND = 60.0


class Pumped:
    """The leader's end, pumped by a thread of its own, the lines it takes kept."""

    def __init__(self, token="secret") -> None:
        self.port = free_port()
        self.followers = Followers.bind("127.0.0.1", self.port, token)
        self.lines, self.lock, self.stopped = [], threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            with self.lock:
                self.followers.pump(0.02, lambda follower, node, lines: self.lines.append((follower, node, lines)))
            time.sleep(0.001)

    def until(self, condition, what: str) -> None:
        deadline = time.monotonic() + BOUND
        while True:
            with self.lock:
                if condition():
                    return
            assert time.monotonic() < deadline, f"not within {BOUND:g} s: {what}"
            time.sleep(0.01)

    def join(self, token="secret", name="127.0.0.2", within=BOUND) -> Leader:
        return Leader.join("127.0.0.1", self.port, token, name, time.monotonic() + within)

    def close(self, reason=None) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            self.thread.join(BOUND)
            self.followers.close(reason)


@pytest.fixture
def leader():
    pumped = Pumped()
    yield pumped
    pumped.close()


def next_message(follower: Leader, kind):
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        message = follower.receive(0.1)
        if message is not None:
            assert isinstance(message, kind), message
            return message
    raise AssertionError(f"no {kind.__name__} within {BOUND:g} s")


def test_a_follower_is_ordered_each_trial_and_only_its_lines_of_that_trial_reach_the_leader(leader):
    follower = leader.join()
    leader.until(lambda: len(leader.followers.joined) == 1, "the follower joined")
    sock = follower.conn.sock  # a leader whose machine is lost is noticed by TCP, not waited for forever
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    with leader.lock:
        leader.followers.order(7, (("env.A", 1), ("strategy.use_local_sgd", True)), "tune-x-7")
    order = next_message(follower, TrialOrder)
    assert (order.trial, order.follower, order.point, order.job_id) == \
        (7, 1, (("env.A", 1), ("strategy.use_local_sgd", True)), "tune-x-7")
    follower.send(TrialLines(6, 1, ['{"rank": 1}']))  # an earlier trial's: dropped
    follower.send_lines(7, 1, [b'{"rank": 1, "t": %d}' % i for i in range(600)])  # three messages
    follower.send(TrialEnded(7, 2, "launcher: error: no such script"))  # while the trial runs: it failed
    leader.until(lambda: leader.followers.ended(7), "the follower's trial ended")
    assert leader.followers.failed == ["127.0.0.2's part: exit code 2: launcher: error: no such script"]
    with leader.lock:
        leader.followers.order(8, (), "tune-x-8")
        leader.followers.stop(8)
    follower.send(TrialEnded(8, 143, "the job stopped"))  # after its stop: no failure
    leader.until(lambda: leader.followers.ended(8), "the follower's second trial ended")
    assert leader.followers.failed == []
    assert [len(lines) for _, _, lines in leader.lines] == [256, 256, 88] and {n for _, n, _ in leader.lines} == {1}
    leader.close("done")
    assert next_message(follower, TrialOrder).trial == 8 and next_message(follower, TrialStop).trial == 8
    assert next_message(follower, TuneOver).reason == "done"
    with pytest.raises(LeaderGone):
        next_message(follower, TuneOver)


def test_a_tuner_that_does_not_prove_the_token_is_never_welcomed(leader):
    with pytest.raises(LaunchError, match="could not join the leading tuner at 127.0.0.1:"):
        leader.join(token="wrong", within=3.0)
    with pytest.raises(LaunchError, match="the leading tuner refused this node's tuner: wrong job or job token"):
        leader.join(token=None, within=3.0)  # it cannot tell a stranger's refusal from the leader's: it obeys
    assert not leader.followers.joined and not leader.followers.lost
    follower = leader.join()  # the right one still is
    leader.until(lambda: len(leader.followers.joined) == 1, "the follower joined")
    follower.close()


@pytest.mark.parametrize("sent,why", [(b"\x00\x00\x00\x02{]", "sent junk"),
                                      (None, "sent a trial_order message, which no tuner sends")])
def test_a_follower_that_sends_junk_or_what_no_tuner_sends_is_dropped_and_named(leader, sent, why):
    follower = leader.join(name="node-b")
    leader.until(lambda: len(leader.followers.joined) == 1, "the follower joined")
    if sent is None:
        follower.send(TrialOrder(1, 1, (), "x"))
    else:
        follower.conn.sock.sendall(sent)
    leader.until(lambda: leader.followers.lost, "the follower dropped")
    assert leader.followers.lost[0].startswith("the tuner of node-b (127.0.0.1:") and why in leader.followers.lost[0]
    assert not leader.followers.joined
    follower.close()


def test_a_stranger_that_is_no_tuner_is_dropped_before_it_joins(leader):
    with socket.create_connection(("127.0.0.1", leader.port), timeout=BOUND) as sock:
        sock.sendall(wire.encode({"type": "hello", "node": 1, "nonce": "n" * 32}))
        sock.settimeout(BOUND)
        while sock.recv(65536):  # its challenge, then nothing: closed
            pass
    assert not leader.followers.joined and not leader.followers.lost


KINDS = ["tune_hello", "trial_order", "trial_stop", "trial_lines", "trial_ended", "tune_over"]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KINDS), st.dictionaries(st.sampled_from(["trial", "follower", "point", "job_id", "node",
                                                                "lines", "code", "reason", "host", "nonce", "proof"]),
                                               JSON, max_size=8))
def test_a_tune_message_off_the_wire_never_raises_and_its_fields_have_their_types(kind, fields):
    message = from_wire({**fields, "type": kind})
    assert not isinstance(message, Unknown)
    for name in ("trial", "follower", "node"):
        assert getattr(message, name, None) is None or type(getattr(message, name)) is int
    point = getattr(message, "point", None)
    assert point is None or all(isinstance(n, str) and isinstance(v, (str, int, float, bool)) for n, v in point)
    lines = getattr(message, "lines", None)
    assert lines is None or all(isinstance(x, str) for x in lines)


def options(**given):
    return SimpleNamespace(**{"cluster_node_ips": "127.0.0.1", "master_addr": None, **given})


def test_where_the_leading_tuner_is():
    assert tune_nodes(options(), None, None, 29600, False) is None  # one node
    assert tune_nodes(options(cluster_node_ips="10.0.0.1,10.0.0.2,10.0.0.3"), None, None, 29600, True) is None
    three = tune_nodes(options(cluster_node_ips="10.0.0.1,10.0.0.2,10.0.0.3"), None, None, 29600, False)
    assert (three.address, three.port, three.followers, three.elastic) == ("10.0.0.1", 29600, 2, False)
    torchrun = tune_nodes(options(master_addr="10.0.0.9"), None, 4, 29601, False)  # same command, no node rank
    assert (torchrun.address, torchrun.followers) == ("10.0.0.9", 3)
    c10d = ElasticSpec(2, 4, elastic_backends.C10D.name, host="10.0.0.5", port=29400)
    assert tune_nodes(options(), c10d, None, 29600, False) == \
        type(three)("10.0.0.5", 29600, 1, True)
    etcd = next(row for row in elastic_backends.ROWS if not row.has_node_0)
    with pytest.raises(LaunchError, match="needs a rendezvous with a node 0"):
        tune_nodes(options(), ElasticSpec(2, 4, etcd.name), None, 29600, False)


def test_a_follower_runs_only_its_own_spaces_points():
    from launcher.plan.tune_space import ENV, Knob, Space
    from launcher.run.tune_follow import ordered_outside

    space = Space((Knob("env.A", ENV, "A", (1, 2)), Knob("arg.--b", "arg", "--b", (True,))))
    assert ordered_outside(space, TrialOrder(1, 1, (("env.A", 2), ("arg.--b", True)), "tune-x-1")) is None
    assert "knob env.Z, which this node's space" in ordered_outside(space, TrialOrder(1, 1, (("env.Z", 1),), "j"))
    assert "env.A=3, a value this node's space does not list" in \
        ordered_outside(space, TrialOrder(1, 1, (("env.A", 3),), "j"))
    assert "env.A='1'" in ordered_outside(space, TrialOrder(1, 1, (("env.A", "1"),), "j"))  # text is not the number
    assert "without a job id" in ordered_outside(space, TrialOrder(1, 1, (), None))
    assert "without a job id" in ordered_outside(space, TrialOrder(1, 1, (), "a\nb"))


def test_a_follower_whose_trial_does_not_end_in_time_is_dropped_and_named(leader):
    follower = leader.join(name="node-c")
    leader.until(lambda: len(leader.followers.joined) == 1, "the follower joined")
    with leader.lock:
        leader.followers.order(3, (), "tune-x-3")
        leader.followers.stop(3)
        leader.followers.drop_unended(3, 70.0)  # it said nothing of its trial's end
    [lost] = leader.followers.lost
    assert lost.startswith("the tuner of node-c (127.0.0.1:") and lost.endswith("did not end trial 3 within 70 s of its stop")
    assert not leader.followers.joined
    follower.close()
