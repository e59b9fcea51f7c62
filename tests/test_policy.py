"""The supervisor's rules as tables: (state, event, time) -> (state, actions), no processes."""

import logging
import signal

import pytest

from launcher.plan import policy as p

GRACE = 10.0


def run(events, ranks=(0, 1, 2), grace=GRACE):
    """Feed (time, event) pairs; the final state and every action with its time."""
    state = p.start(ranks, grace)
    seen = []
    for now, event in events:
        state, actions = p.decide(state, event, now)
        seen += [(now, a) for a in actions]
    return state, seen


def sends(seen):
    return [(t, type(a).__name__, getattr(a, "sig", None)) for t, a in seen if not isinstance(a, p.Say)]


def test_all_exit_zero_means_exit_zero_and_no_action():
    state, seen = run([(1, p.WorkerExited(0, 0)), (2, p.WorkerExited(1, 0)), (3, p.WorkerExited(2, 0))])
    assert seen == [] and not state.running and p.exit_code(state) == 0


@pytest.mark.parametrize("returncode, code", [(7, 7), (-signal.SIGKILL, 137), (-signal.SIGSEGV, 139), (255, 255)])
def test_a_failure_stops_the_others_and_gives_its_code(returncode, code):
    state, seen = run([(1.0, p.WorkerExited(1, returncode)), (1.1, p.WorkerExited(0, -signal.SIGTERM))])
    assert sends(seen) == [(1.0, "Send", signal.SIGTERM)]
    assert p.exit_code(state) == code
    assert state.failure == (1, returncode)
    assert "rank 1 failed" in seen[0][1].text and seen[0][1].level == logging.ERROR


def test_only_the_first_failure_counts():
    state, _ = run([(1, p.WorkerExited(2, 3)), (1.1, p.WorkerExited(0, 9)), (1.2, p.WorkerExited(1, -15))])
    assert p.exit_code(state) == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_a_stop_signal_is_passed_on_then_sigterm_then_sigkill(sig):
    state, seen = run([(0.0, p.StopSignal(sig)), (1.0, p.TimePassed()), (5.0, p.TimePassed()), (10.0, p.TimePassed())])
    assert sends(seen) == [(0.0, "Send", sig), (1.0, "Send", signal.SIGTERM), (10.0, "Kill", None)]
    assert p.exit_code(state) == 128 + sig


def test_sigterm_is_not_sent_twice():
    state, seen = run([(0.0, p.StopSignal(signal.SIGTERM)), (1.0, p.TimePassed()), (10.0, p.TimePassed())])
    assert sends(seen) == [(0.0, "Send", signal.SIGTERM), (10.0, "Kill", None)]


def test_sigterm_follows_within_half_a_short_grace():
    _, seen = run([(0.0, p.StopSignal(signal.SIGINT)), (0.25, p.TimePassed()), (0.5, p.TimePassed())], grace=0.5)
    assert sends(seen) == [(0.0, "Send", signal.SIGINT), (0.25, "Send", signal.SIGTERM), (0.5, "Kill", None)]


def test_a_second_stop_signal_kills_at_once_and_says_the_true_time():
    state, seen = run([(0.0, p.StopSignal(signal.SIGTERM)), (0.3, p.StopSignal(signal.SIGINT)), (10.0, p.TimePassed())])
    assert sends(seen) == [(0.0, "Send", signal.SIGTERM), (0.3, "Kill", None)]
    text = [a.text for _, a in seen if isinstance(a, p.Say)][-1]
    assert "0.3 s after the stop began" in text
    assert p.exit_code(state) == 128 + signal.SIGTERM


def test_a_signal_while_stopping_after_a_failure_kills_and_keeps_the_failure_code():
    state, seen = run([(0.0, p.WorkerExited(0, 4)), (2.0, p.StopSignal(signal.SIGINT))])
    assert sends(seen) == [(0.0, "Send", signal.SIGTERM), (2.0, "Kill", None)]
    assert p.exit_code(state) == 4


def test_leftovers_get_the_same_stop_sequence_and_a_signal_ends_the_wait():
    events = [(0, p.WorkerExited(0, 0)), (0, p.WorkerExited(1, 0)), (0, p.WorkerExited(2, 0)),
              (1, p.LeftoversRunning(3)), (2, p.LeftoversRunning(3)), (3, p.StopSignal(signal.SIGINT))]
    state, seen = run(events)
    assert sends(seen) == [(1, "Send", signal.SIGTERM), (3, "Kill", None)]
    assert p.exit_code(state) == 128 + signal.SIGINT


def test_leftovers_not_stopped_in_time_are_killed():
    events = [(0, p.WorkerExited(0, 0)), (1, p.LeftoversRunning(1)), (11, p.TimePassed())]
    _, seen = run(events, ranks=(0,))
    assert sends(seen) == [(1, "Send", signal.SIGTERM), (11, "Kill", None)]
    assert "processes the workers left still running 10.0 s" in [a.text for _, a in seen if isinstance(a, p.Say)][-1]


def test_user_signals_are_passed_to_the_workers_only():
    state, seen = run([(0, p.UserSignal(signal.SIGUSR1))])
    assert sends(seen) == [(0, "Send", signal.SIGUSR1)]
    assert seen[-1][1].leftovers is False and not state.stopping


def test_a_worker_that_could_not_start_stops_the_rest_with_code_1():
    state, seen = run([(0, p.StartFailed(43, "could not start rank 43: Too many open files"))], ranks=range(43))
    assert sends(seen) == [(0, "Send", signal.SIGTERM)]
    assert "stopping the 43 worker(s) already started" in seen[0][1].text
    assert p.exit_code(state) == 1


def test_deadlines_and_giving_up_after_sigkill():
    state, _ = run([(0.0, p.StopSignal(signal.SIGINT))])
    assert p.next_deadline(state) == 1.0
    state, _ = p.decide(state, p.TimePassed(), 1.0)
    assert p.next_deadline(state) == GRACE
    state, _ = p.decide(state, p.TimePassed(), GRACE)
    assert p.next_deadline(state) == GRACE + p.KILL_WAIT
    assert not p.gave_up(state, GRACE + 1) and p.gave_up(state, GRACE + p.KILL_WAIT)


def test_nothing_happens_before_a_deadline():
    state, seen = run([(0.0, p.StopSignal(signal.SIGTERM)), (3.0, p.TimePassed())])
    assert sends(seen) == [(0.0, "Send", signal.SIGTERM)]


def test_a_stop_ordered_from_elsewhere_stops_with_sigterm_and_is_not_a_local_failure():
    state, seen = run([(0, p.StopOrdered("rank 3 on node 1 (10.0.0.2) failed (exit code 7)")), (1, p.WorkerExited(0, -15))])
    assert sends(seen) == [(0, "Send", signal.SIGTERM)]
    assert state.failure is None and "node 1" in seen[0][1].text


def test_a_hang_takes_stacks_then_stops():
    state, seen = run([(0, p.Hung(60.0))])
    assert [type(a).__name__ for _, a in seen] == ["Say", "TakeStacks", "Send"]
    assert state.hung == 60.0 and p.exit_code(state) == 1


def test_stacks_before_a_failure_stop_only_when_asked():
    _, plain = run([(0, p.WorkerExited(1, 3))])
    state = p.start((0, 1, 2), GRACE, stacks=True)
    _, asked = p.decide(state, p.WorkerExited(1, 3), 0)
    assert not any(isinstance(a, p.TakeStacks) for _, a in plain)
    assert [type(a).__name__ for a in asked] == ["Say", "TakeStacks", "Send"]


def test_no_stacks_when_no_worker_is_left():
    state = p.start((0,), GRACE, stacks=True)
    _, actions = p.decide(state, p.WorkerExited(0, 3), 0)
    assert not any(isinstance(a, p.TakeStacks) for a in actions)


CAUSE = p.Cause(1, "worker", 7, "rank 3 on node 1 failed")


@pytest.mark.parametrize("attempt, restarts, cause, decision", [
    (0, 0, None, ("end", 0)),
    (0, 0, CAUSE, ("end", 7)),
    (0, 2, CAUSE, ("restart", 1)),
    (1, 2, CAUSE, ("restart", 2)),
    (2, 2, CAUSE, ("end", 7)),
    (0, 2, p.Cause(0, "signal", 130, "node 0 received SIGINT"), ("end", 130)),
    (0, 2, p.Cause(1, "lost", 1, "node 1 lost"), ("end", 1)),
    (0, 2, p.Cause(1, "join", 1, "node 1 never joined"), ("end", 1)),
    (0, 2, p.Cause(0, "start", 1, "could not start rank 4"), ("end", 1)),
    (0, 2, p.Cause(0, "hang", 1, "no worker wrote"), ("restart", 1)),
])
def test_after_an_attempt(attempt, restarts, cause, decision):
    assert p.after_attempt(attempt, restarts, cause) == decision


@pytest.mark.parametrize("joined, reported, gone, due", [
    ((), (), (), ()),  # node 1 never joined: node 0's job is done once its own workers are
    ((1,), (), (), (1,)),  # joined and still running: waited for
    ((1, 2), (2,), (), (1,)),
    ((1,), (1,), (), ()),
    ((1,), (), (1,), ()),  # lost: the job stops on that cause instead
    ((2,), (), (), (2,)),  # node 1 never joined, node 2 runs
])
def test_node_0_waits_for_the_joined_nodes_only(joined, reported, gone, due):
    assert p.still_due(joined, reported, gone) == due


@pytest.mark.parametrize("nodes, ever_joined, absent", [
    (1, (), ()), (2, (), (1,)), (2, (1,), ()), (4, (2,), (1, 3)),
])
def test_the_nodes_that_never_joined(nodes, ever_joined, absent):
    assert p.never_joined(nodes, ever_joined) == absent


@pytest.mark.parametrize("wire", [None, "junk", {}, {"node": "x", "kind": "worker", "code": 7, "text": "t"},
                                  {"node": 1, "kind": "worker", "code": 999, "text": "t"}])
def test_a_cause_from_a_peer_is_checked(wire):
    assert p.Cause.from_dict(wire) is None


def test_a_cause_survives_the_wire():
    assert p.Cause.from_dict(CAUSE.as_dict()) == CAUSE


# ---------------------------------------------------------------- parameter-server mode

PS_NAMES = {0: "server 0", 1: "server 1", 2: "trainer 0", 3: "trainer 1"}


def run_ps(events, trainers=(2, 3)):
    state = p.start(PS_NAMES, GRACE, names=PS_NAMES, trainers=trainers)
    seen = []
    for now, event in events:
        state, actions = p.decide(state, event, now)
        seen += [(now, a) for a in actions]
    return state, seen


def test_servers_are_stopped_once_the_trainers_are_done_and_the_job_succeeds():
    state, _ = run_ps([(1, p.WorkerExited(2, 0))])
    assert not state.trainers_done
    state, seen = run_ps([(1, p.WorkerExited(2, 0)), (2, p.WorkerExited(3, 0))])
    assert state.trainers_done
    state, seen = run_ps([(1, p.WorkerExited(2, 0)), (2, p.WorkerExited(3, 0)), (2.1, p.TrainersDone("every trainer finished")),
                          (2.2, p.WorkerExited(0, -signal.SIGTERM)), (2.3, p.WorkerExited(1, -signal.SIGTERM))])
    assert sends(seen) == [(2.1, "Send", signal.SIGTERM)]
    assert "every trainer finished: stopping the 2 server(s)" in seen[0][1].text
    assert not state.running and p.exit_code(state) == 0


def test_a_server_failure_is_named_and_its_code_is_the_jobs():
    state, seen = run_ps([(1, p.WorkerExited(1, -signal.SIGKILL)), (1.1, p.TrainersDone("late"))])
    assert sends(seen) == [(1, "Send", signal.SIGTERM)]
    assert seen[0][1].text == "server 1 failed (killed by SIGKILL); stopping the other 3 process(es)"
    assert p.exit_code(state) == 137 and not state.trainers_done


def test_trainers_done_is_ignored_while_stopping_or_when_nothing_runs():
    _, seen = run_ps([(0, p.StopSignal(signal.SIGTERM)), (1, p.TrainersDone("x"))])
    assert sends(seen) == [(0, "Send", signal.SIGTERM)]
    _, seen = run_ps([(t, p.WorkerExited(r, 0)) for t, r in enumerate((0, 1, 2, 3))] + [(5, p.TrainersDone("x"))])
    assert seen == []


def test_a_trainers_done_message_never_stops_a_collective_job():
    state, seen = run([(1, p.TrainersDone("every trainer of the job finished"))])
    assert seen == [] and not state.stopping and state.running == {0, 1, 2}


def test_a_node_without_trainers_is_done_at_once_and_collective_never_is():
    assert run_ps([], trainers=())[0].trainers_done
    assert not run([(1, p.WorkerExited(0, 0))])[0].trainers_done


def test_the_kill_message_names_servers_and_trainers():
    _, seen = run_ps([(0, p.WorkerExited(2, 1)), (10, p.TimePassed())])
    assert "server 0, server 1, trainer 1 still running 10.0 s after the stop began" in seen[-2][1].text


def test_a_cause_fits_one_control_message_whatever_the_worker_printed():
    from launcher.nodes.transport.wire import encode, Framer

    line = "  | " + "\ufffd\x00" * 3000  # 6 bytes of JSON each character
    junk = "\n".join([line] * 20)
    cause = p.Cause(1, "worker", 7, "rank 5 failed" * 1000, "rank 5 failed; log: x\n" + junk + "\n  | the end")
    message = Framer().feed(encode({"type": "failed", "attempt": 0, "cause": cause.as_dict()}))[0]
    back = p.Cause.from_dict(message["cause"])
    assert back.code == 7 and back.summary.endswith("  | the end") and len(back.summary) <= p.WIRE_SUMMARY + 5


@pytest.mark.parametrize("server_exit, at, root", [
    (9, 1.05, (1, 9)),  # the server died first; the launcher saw its trainer's error first
    (-signal.SIGKILL, 1.05, (1, -signal.SIGKILL)),  # killed by someone else (the OOM killer)
    (1, 1.4, (1, 1)),  # still within SERVER_FIRST of the trainer's failure
    (-signal.SIGTERM, 1.05, (2, 1)),  # our SIGTERM: a consequence of the stop
    (128 + signal.SIGTERM, 1.05, (2, 1)),  # a server that exits 128 + SIGTERM on it: the same
    (0, 1.05, (2, 1)),  # a server that ended well
    (9, 1.0 + p.SERVER_FIRST + 0.01, (2, 1)),  # too long after: the stop's doing
])
def test_a_server_that_dies_right_around_a_trainer_failure_is_the_root_cause(server_exit, at, root):
    state, seen = run_ps([(1.0, p.WorkerExited(2, 1)), (at, p.WorkerExited(1, server_exit))])
    assert state.failure == root and p.exit_code(state) == p.shell_code(root[1])
    assert sends(seen) == [(1.0, "Send", signal.SIGTERM)]  # one stop: no second SIGTERM, no new deadline
    assert state.kill_at == 1.0 + GRACE
    if root[0] == 1:
        assert seen[-1][1].text == (f"server 1 failed ({p.describe_exit(server_exit)}): the root cause; "
                                    f"trainer 0 failed after it")


def test_a_trainer_failing_after_a_server_is_never_the_root_cause():
    state, seen = run_ps([(1.0, p.WorkerExited(1, 9)), (1.05, p.WorkerExited(2, 1)), (1.1, p.WorkerExited(3, 1))])
    assert state.failure == (1, 9) and p.exit_code(state) == 9 and len(seen) == 2


def test_a_collective_job_keeps_its_first_failure():
    state, _ = run([(1.0, p.WorkerExited(2, 1)), (1.05, p.WorkerExited(1, 9))])
    assert state.failure == (2, 1)


def test_a_cause_of_characters_that_take_12_bytes_of_json_still_fits_one_control_message():
    from launcher.nodes.transport.wire import encode, Framer

    astral = "\U0001F600" * 30000  # 12 bytes of JSON each (a surrogate pair, escaped)
    cause = p.Cause(1, "worker", 7, astral, astral + "\n  | the end", error='{"message": "' + astral + '"}')
    message = Framer().feed(encode({"type": "failed", "attempt": 0, "cause": cause.as_dict()}))[0]
    back = p.Cause.from_dict(message["cause"])
    assert back.code == 7 and back.summary.endswith("  | the end") and back.error == ""  # too big: sent without it
    small = p.Cause(1, "worker", 7, "rank 1 failed", "summary", error='{"message": "ValueError"}')
    assert p.Cause.from_dict(small.as_dict()) == small


# ---------------------------------------------------------------- a round's end (in-process re-form)


def test_a_round_over_keeps_workers_that_all_re_enter_in_place():
    state, seen = run([(0, p.OptedIn(0)), (0, p.OptedIn(1)), (0, p.OptedIn(2)), (1, p.RoundOver("node x lost"))])
    assert [a for _, a in seen if isinstance(a, p.Keep)] == [p.Keep(frozenset({0, 1, 2}))]
    assert sends(seen) == [(1, "Keep", None)]
    assert not state.running and state.kept == {0, 1, 2} and not state.stopping and state.failure is None
    assert "keeping the 3 worker(s) for the next round" in seen[0][1].text


def test_a_round_over_stops_them_all_when_one_does_not_re_enter_in_place():
    state, seen = run([(0, p.OptedIn(0)), (0, p.OptedIn(1)), (1, p.RoundOver("node x lost"))])
    assert sends(seen) == [(1, "Send", signal.SIGTERM)] and not state.kept and state.stopping


def test_a_round_over_after_a_failure_here_is_the_stop_already_under_way():
    events = [(0, p.OptedIn(r)) for r in (0, 1, 2)] + [(1, p.WorkerExited(1, 3)), (2, p.RoundOver("restart"))]
    state, seen = run(events)
    assert sends(seen) == [(1, "Send", signal.SIGTERM)] and not state.kept and state.failure == (1, 3)


def test_workers_kept_from_the_round_before_have_opted_in_already():
    state = p.start((0, 1), GRACE, opted_in=(0, 1))
    state, actions = p.decide(state, p.RoundOver("joined"), 0)
    assert p.Keep(frozenset({0, 1})) in actions and not state.running


def test_workers_that_finished_are_not_kept_the_others_are():
    state, seen = run([(0, p.OptedIn(0)), (0, p.OptedIn(1)), (0, p.WorkerExited(0, 0)), (1, p.RoundOver("lost"))],
                      ranks=(0, 1))
    assert [a for _, a in seen if isinstance(a, p.Keep)] == [p.Keep(frozenset({1}))]


def test_with_dump_stacks_the_stacks_are_taken_again_before_a_sigkill():
    """A worker that let SIGTERM pass: where it was when the grace ran out (--dump_stacks true)."""
    state = p.start((0, 1), GRACE, stacks=True)
    state, first = p.decide(state, p.StopSignal(signal.SIGTERM), 0.0)
    state, late = p.decide(state, p.TimePassed(), GRACE)
    assert [type(a).__name__ for a in late] == ["Say", "TakeStacks", "Kill"]
    plain = p.start((0, 1), GRACE)
    plain, _ = p.decide(plain, p.StopSignal(signal.SIGTERM), 0.0)
    _, late = p.decide(plain, p.TimePassed(), GRACE)
    assert [type(a).__name__ for a in late] == ["Say", "Kill"]
