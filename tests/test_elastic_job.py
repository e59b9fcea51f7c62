"""An elastic job's coordinator (``launcher.nodes.elastic.job``) driven by the attempt driver, replaying
histories against the fake process starter and clock of tests/test_attempts.py and a fake link to node
0 whose inbox is the real one (a pipe the event loop watches): milliseconds each. The histories: a
membership change (stop, the next round with its own plan, no restart spent), a round stopped before it
began here, a worker failure here
(told to node 0, which restarts the round: TORCHELASTIC_RESTART_COUNT 1), the job's end ordered while
the workers run, a stop signal to a launcher that is not node 0 (it leaves the job), and the state
file's membership history as ``launcher status`` shows it (untrusted input included)."""

from __future__ import annotations

import json
import signal
from dataclasses import replace

from launcher.nodes.transport import messages as m
from launcher.nodes.elastic.job import ElasticJob
from launcher.nodes.elastic.link import Inbox, JobOver
from launcher.nodes.transport.messages import StopWorkers
from launcher.output import state_file as state
from launcher.run import attempts
from launcher.tools import status
from test_attempts import START, Behaviour, FakeClock, FakeStarter, make_plan


def round_(number, world_nodes, restarts=0, me_rank=1):
    members = tuple(m.Seat("me" if i == me_rank else f"n{i}", "127.0.0.1", 2, i, 2 * i) for i in range(world_nodes))
    return m.RoundStart(number, members, 2 * world_nodes, restarts, f"round {number}: {world_nodes} node(s)")


class FakeLink:
    """Node 0 as this node sees it: ``react(call)`` puts node 0's answers in the inbox."""

    says_rounds = False  # another node's link: the coordinator says each round

    def health_states(self) -> dict:
        return {}

    def heartbeat_ages(self) -> dict:
        return {}

    def __init__(self, clock: FakeClock, first: m.RoundStart, react) -> None:
        self.inbox, self.node_id, self.first, self.clock = Inbox(), "me", first, clock
        self.react = react
        self.calls: list = []

    def later(self, after: float, item) -> None:
        self.clock.at(self.clock.now - START + after, lambda: self.inbox.put(item))

    def _call(self, *call) -> None:
        self.calls.append(call)
        self.react(self, call)

    def serve(self) -> None:
        pass

    def stopped(self, round_no):
        self._call("stopped", round_no)

    def done(self, round_no):
        self._call("done", round_no)

    def failed(self, round_no, code, reason):
        self._call("failed", round_no, code)

    def leave(self, code, reason):
        self._call("leave", code)

    def close(self) -> None:
        self.inbox.close()


def replay(behave, first, react, at=()):
    """(exit code, starter, link, plans made): ``at``: (seconds, item) put in the inbox while it runs."""
    clock = FakeClock()
    starter = FakeStarter(clock, behave)
    link = FakeLink(clock, first, react)
    plans = []

    def replan(round_start):
        plans.append(round_start.number)
        return replace(make_plan(workers=2, max_restarts=1), world_size=round_start.world_size)

    for seconds, item in at:
        link.later(seconds, item)
    code = attempts.run(make_plan(workers=2, max_restarts=1), starter=starter, clock=clock,
                        coordinator=lambda plan: ElasticJob(plan, link, replan))
    return code, starter, link, plans


def test_a_membership_change_stops_the_round_and_starts_the_next_with_its_plan_spending_no_restart():
    def react(link, call):
        if call == ("stopped", 1):
            link.later(0.2, round_(2, 2, me_rank=1))
        if call == ("done", 2):
            link.later(0.1, JobOver(0, "every worker of round 2 finished"))

    starts: list = []

    def behave(attempt, rank):  # round 1's workers run until stopped, round 2's finish
        starts.append(rank)
        return Behaviour() if len(starts) <= 2 else Behaviour(runs=1.0)

    code, starter, link, plans = replay(behave, round_(1, 3), react, at=[(1.0, StopWorkers(1, "node n2 lost"))])
    assert code == 0
    assert link.calls == [("stopped", 1), ("done", 2)] and plans == [2]
    assert [p.attempt for p in starter.started] == [0, 0, 0, 0]  # TORCHELASTIC_RESTART_COUNT stays 0
    assert all(p.signals == [signal.SIGTERM] for p in starter.started[:2])


def test_a_round_stopped_before_it_began_here_is_reported_stopped_without_starting_its_workers():
    def react(link, call):
        if call == ("stopped", 1):  # node 0's next round, and its stop at once (a loss just after the start)
            link.later(0.1, round_(2, 3))
            link.later(0.1, StopWorkers(2, "node n2 lost"))
        if call == ("stopped", 2):
            link.later(0.1, round_(3, 2))
        if call == ("done", 3):
            link.later(0.1, JobOver(0, "done"))

    starts: list = []

    def behave(attempt, rank):
        starts.append(rank)
        return Behaviour() if len(starts) <= 2 else Behaviour(runs=1.0)

    code, starter, link, plans = replay(behave, round_(1, 3), react, at=[(1.0, StopWorkers(1, "node n3 lost"))])
    assert code == 0
    assert link.calls == [("stopped", 1), ("stopped", 2), ("done", 3)] and plans == [3]
    assert len(starter.started) == 4  # round 1's two workers and round 3's: none for round 2


def test_a_worker_failure_here_is_told_to_node_0_and_its_restart_counts_on_every_worker():
    def react(link, call):
        if call[0] == "failed":
            link.later(0.1, StopWorkers(1, "restarting the job (1 of 1 restarts)"))
        if call == ("stopped", 1):
            link.later(0.1, round_(2, 3, restarts=1))
        if call == ("done", 2):
            link.later(0.1, JobOver(0, "done"))

    def behave(attempt, rank):  # rank 1 fails in round 1; round 2's workers finish
        if attempt == 0:
            return Behaviour(runs=1.0, code=3) if rank == 1 else Behaviour()
        return Behaviour(runs=1.0)

    code, starter, link, _ = replay(behave, round_(1, 3), react)
    assert code == 0
    assert link.calls == [("failed", 1, 3), ("stopped", 1), ("done", 2)]
    assert sorted({p.attempt for p in starter.started}) == [0, 1]  # round 2: TORCHELASTIC_RESTART_COUNT 1


def test_the_end_ordered_while_the_workers_run_stops_them_and_exits_with_its_code(capfd):
    code, starter, link, _ = replay(lambda attempt, rank: Behaviour(), round_(1, 2), lambda link, call: None,
                                    at=[(1.0, JobOver(3, "rank 5 on node 2 (127.0.0.1) failed (exit code 3)"))])
    assert code == 3 and link.calls == []
    assert all(p.signals == [signal.SIGTERM] for p in starter.started)
    assert "the job stopped: rank 5 on node 2 (127.0.0.1) failed (exit code 3); exit code 3" in capfd.readouterr().err


def test_a_stop_signal_to_a_launcher_that_is_not_node_0_takes_its_node_out_of_the_job():
    signalled = []

    def behave(attempt, rank):  # SIGTERM to the launcher as its first worker starts
        if not signalled:
            signalled.append(True)
            signal.raise_signal(signal.SIGTERM)
        return Behaviour()

    code, starter, link, _ = replay(behave, round_(1, 2), lambda link, call: None)
    assert code == 128 + signal.SIGTERM
    assert link.calls == [("leave", 128 + signal.SIGTERM)]  # no word of stopped workers: the node leaves


def test_the_rounds_are_kept_in_the_state_file_and_shown_by_status_and_untrusted_lines_are_not():
    rounds = ("round 1 (start): 3 node(s), world size 3",
              "round 2 (lost): 2 node(s), world size 2; left: node a (127.0.0.1) (its connection closed)")
    s = state.NodeState(node=1, node_ip="127.0.0.1", nodes=2, host="h", run_id="r", launcher_pid=9, launcher_start=1,
                        attempt=0, max_restarts=0, phase="ended", exit_code=0, started=1e9, updated=1e9, rounds=rounds)
    back = state.from_json(state.to_json(s))
    assert tuple(back.rounds) == rounds
    assert status.format_status([back], ["gone"], [[]], 1e9).splitlines()[1:3] == [f"  {line}" for line in rounds]
    raw = json.loads(state.to_json(s))
    for bad in (["\x1b[2Jspoofed"], "round 1", [1, 2], ["x"] * (state.ROUNDS_KEPT + 1), [["nested"]]):
        raw["rounds"] = bad
        assert state.from_json(json.dumps(raw).encode()).rounds is None


def test_a_stop_signal_while_waiting_for_the_membership_after_a_failure_here_takes_the_node_out():
    """The keeper never answers (it is gone too): the signal is not lost behind this node's own failure."""
    def react(link, call):
        if call == ("stopped", 1):
            link.clock.at(link.clock.now - START + 0.5, lambda: signal.raise_signal(signal.SIGTERM))

    def behave(attempt, rank):  # rank 1 fails; rank 0 runs until stopped
        return Behaviour(runs=1.0, code=3) if rank == 1 else Behaviour()

    code, starter, link, _ = replay(behave, round_(1, 2), react)
    assert code == 128 + signal.SIGTERM
    assert link.calls == [("failed", 1, 3), ("stopped", 1), ("leave", 128 + signal.SIGTERM)]


def test_a_stop_signal_while_the_round_stops_after_a_failure_here_takes_the_node_out():
    fired = []

    def behave(attempt, rank):  # rank 1 fails; rank 0 ignores SIGTERM (the stop takes its grace time)
        return Behaviour(runs=1.0, code=3) if rank == 1 else Behaviour(ignores_term=True)

    def signal_during_the_stop(link, call):
        if call[0] == "failed" and not fired:
            fired.append(True)
            link.clock.at(link.clock.now - START + 0.5, lambda: signal.raise_signal(signal.SIGTERM))

    code, starter, link, _ = replay(behave, round_(1, 2), signal_during_the_stop)
    assert code == 128 + signal.SIGTERM
    assert link.calls == [("failed", 1, 3), ("leave", 128 + signal.SIGTERM)]
