"""The attempt driver (``launcher.run.attempts.run``) replaying histories against a fake process
starter and a fake clock: no process is started and no time is waited for, each test takes
milliseconds. The histories: a clean end, a failure, restarts up to --max_restarts, a failure
during a restart, a stop signal, a worker that cannot be started, the stop after an internal
error of the launcher; and, against a fake coordinator, node 1's side of a job of two nodes: a
failure elsewhere, a lost node 0, a restart ordered by node 0, a failure here and elsewhere at once."""

from __future__ import annotations

import errno
import heapq
import itertools
import signal
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest

from launcher import envvars as ev
from launcher.plan import policy
from launcher.plan.model import Plan, WorkerSpec
from launcher.run import attempts

START = 1000.0


class FakeClock:
    """Time moves only when the driver waits: to the end of its wait or to the next scheduled happening."""

    def __init__(self) -> None:
        self.now = START
        self._due: list = []  # (when, order, what)
        self._order = itertools.count()
        self.waits = 0

    def at(self, when: float, what: Callable[[], None]) -> None:
        heapq.heappush(self._due, (START + when, next(self._order), what))

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + 1e9

    def sleep(self, seconds: float) -> None:
        self._advance(self.now + seconds)

    def select(self, selector, timeout):
        self.waits += 1
        assert self.waits < 10_000, "the driver keeps waiting"
        ready = selector.select(0)
        if ready:
            return ready
        until = None if timeout is None else self.now + timeout
        if self._due and (until is None or self._due[0][0] < until):
            until = self._due[0][0]
        assert until is not None, "the driver would wait forever: nothing is scheduled"
        self._advance(until)
        return selector.select(0)

    def _advance(self, until: float) -> None:
        self.now = max(self.now, until)
        while self._due and self._due[0][0] <= self.now:
            heapq.heappop(self._due)[2]()


@dataclass
class Behaviour:
    """What a fake worker does: exits with ``code`` after ``runs`` seconds (never, if None)."""

    runs: Optional[float] = None
    code: int = 0
    ignores_term: bool = False  # SIGTERM changes nothing; only SIGKILL ends it
    start_error: Optional[int] = None  # errno of a start that fails


@dataclass
class FakeProcess:
    pid: int
    rank: int
    attempt: int
    returncode: Optional[int] = None
    ended_with: Optional[int] = None  # the return code, once it ended (not reaped)
    signals: list = field(default_factory=list)
    ignores_term: bool = False

    def kill(self) -> None:
        self.end(-signal.SIGKILL)

    def end(self, code: int) -> None:
        """As a real child's end: SIGCHLD to the launcher, whose handler wakes its loop."""
        if self.ended_with is None:
            self.ended_with = code
            signal.raise_signal(signal.SIGCHLD)


class FakeStarter:
    """Workers that behave as ``behave(attempt, rank)`` says; every start and signal is noted."""

    def __init__(self, clock: FakeClock, behave: Callable[[int, int], Behaviour]) -> None:
        self.clock = clock
        self.behave = behave
        self.started: list = []  # FakeProcess, in order
        self._pids = itertools.count(4_000_000)

    def start(self, cmd, env, stdout, stderr, cgroup_fd=None, pass_fds=(), cpus=None):
        rank, attempt = int(env[ev.TRAINER_ID]), int(env[ev.RESTART_COUNT])
        behaviour = self.behave(attempt, rank)
        if behaviour.start_error is not None:
            raise OSError(behaviour.start_error, "injected")
        proc = FakeProcess(next(self._pids), rank, attempt, ignores_term=behaviour.ignores_term)
        self.started.append(proc)
        if behaviour.runs is not None:
            self.clock.at(self.clock.now - START + behaviour.runs, lambda: proc.end(behaviour.code))
        return proc

    def exit_status(self, pid):
        return self._by_pid(pid).ended_with

    def signal_group(self, pgid, sig):
        proc = self._by_pid(pgid)
        proc.signals.append(sig)
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and not proc.ignores_term):
            proc.end(-sig)

    def reap(self, pid, wait):
        return True

    def children(self):
        return []

    def descendants(self):
        return []

    def adopt_orphans(self):
        pass

    def make_cgroup(self, run_id, env):
        return None

    def start_watchdog(self, run_id, grace):
        return None

    def _by_pid(self, pid) -> FakeProcess:
        return next(p for p in self.started if p.pid == pid)

    def attempts(self) -> list:
        return sorted({p.attempt for p in self.started})


def make_plan(workers: int = 2, max_restarts: int = 0, grace: float = 10.0) -> Plan:
    specs = tuple(WorkerSpec(rank=r, local_rank=r, endpoint=f"127.0.0.1:{7000 + r}", gpu=None,
                             cmd=("fake-worker", str(r)), env={ev.TRAINER_ID: str(r), ev.RUN_ID: "test-run"},
                             log_file=None)
                  for r in range(workers))
    return Plan(node_ips=("127.0.0.1",), node_rank=0, world_size=workers, ports=(), device="cpu", workers=specs,
                base_env={}, log_dir=None, shutdown_timeout=grace, max_restarts=max_restarts)


def replay(behave, **plan_args) -> tuple:
    """The launcher's exit code for this history, and the fake starter that saw it."""
    clock = FakeClock()
    starter = FakeStarter(clock, behave)
    code = attempts.run(make_plan(**plan_args), starter=starter, clock=clock)
    return code, starter, clock


def test_a_clean_end_exits_0():
    code, starter, clock = replay(lambda attempt, rank: Behaviour(runs=1.0 + rank))
    assert code == 0
    assert [p.rank for p in starter.started] == [0, 1]
    assert all(p.signals == [] for p in starter.started)  # nothing was stopped
    assert clock.now - START < 2.5


def test_a_failure_stops_the_others_and_gives_its_exit_code():
    code, starter, clock = replay(lambda attempt, rank: Behaviour(runs=2.0, code=7) if rank == 1 else Behaviour())
    assert code == 7
    assert starter.started[0].signals == [signal.SIGTERM]
    assert starter.started[0].ended_with == -signal.SIGTERM
    assert clock.now - START < 3.0  # at once, not after the grace time


def test_a_failure_by_signal_gives_128_plus_the_signal():
    code, _, _ = replay(lambda attempt, rank: Behaviour(runs=1.0, code=-signal.SIGSEGV) if rank == 0 else Behaviour())
    assert code == 128 + signal.SIGSEGV


def test_restarts_up_to_max_restarts_then_the_end():
    code, starter, _ = replay(lambda attempt, rank: Behaviour(runs=1.0, code=3) if rank == 0 else Behaviour(),
                              max_restarts=2)
    assert code == 3
    assert starter.attempts() == [0, 1, 2]
    assert len(starter.started) == 6


def test_a_restart_that_succeeds_ends_with_0():
    code, starter, _ = replay(lambda attempt, rank: Behaviour(runs=1.0, code=3 if attempt == 0 and rank == 1 else 0),
                              max_restarts=3)
    assert code == 0
    assert starter.attempts() == [0, 1]


def test_a_failure_during_the_restart_ends_with_its_code():
    def behave(attempt, rank):
        if attempt == 0:
            return Behaviour(runs=1.0, code=3) if rank == 0 else Behaviour()
        return Behaviour(runs=0.5, code=9) if rank == 1 else Behaviour()

    code, starter, _ = replay(behave, max_restarts=1)
    assert code == 9
    assert starter.attempts() == [0, 1]


def test_sigterm_to_the_launcher_stops_the_workers_and_exits_128_plus_15():
    clock = FakeClock()
    starter = FakeStarter(clock, lambda attempt, rank: Behaviour())
    clock.at(1.0, lambda: signal.raise_signal(signal.SIGTERM))  # the launcher's own handler takes it
    code = attempts.run(make_plan(max_restarts=2), starter=starter, clock=clock)
    assert code == 128 + signal.SIGTERM
    assert starter.attempts() == [0]  # a stop signal is not a failure: no restart
    assert all(p.signals[:1] == [signal.SIGTERM] for p in starter.started)


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_time():
    code, starter, clock = replay(
        lambda attempt, rank: Behaviour(runs=1.0, code=5) if rank == 0 else Behaviour(ignores_term=True), grace=4.0)
    assert code == 5
    assert starter.started[1].signals == [signal.SIGTERM, signal.SIGKILL]
    assert clock.now - START == pytest.approx(5.0, abs=0.5)


def test_a_worker_that_cannot_be_started_stops_the_others_and_exits_1():
    code, starter, _ = replay(lambda attempt, rank: Behaviour(start_error=errno.EAGAIN) if rank == 1 else Behaviour(),
                              max_restarts=0)
    assert code == 1
    assert [p.rank for p in starter.started] == [0]
    assert starter.started[0].signals == [signal.SIGTERM]


def test_a_command_that_does_not_exist_is_an_error_and_nothing_is_left_running():
    from launcher.errors import LaunchError

    clock = FakeClock()
    starter = FakeStarter(clock, lambda attempt, rank: Behaviour(start_error=errno.ENOENT) if rank == 1 else Behaviour())
    with pytest.raises(LaunchError, match="cannot start rank 1"):
        attempts.run(make_plan(), starter=starter, clock=clock)
    assert starter.started[0].ended_with == -signal.SIGTERM  # the one already started was stopped


def break_the_policy_on_exits(monkeypatch) -> None:
    """An internal error of the launcher: the policy fails on the first exit (as tests/integration's INJECT)."""
    decide = policy.decide

    def broken(state, event, now):
        if isinstance(event, policy.WorkerExited):
            raise RuntimeError("injected fault")
        return decide(state, event, now)

    monkeypatch.setattr(policy, "decide", broken)


def test_an_internal_error_stops_what_runs_by_the_same_stop_sequence(monkeypatch):
    break_the_policy_on_exits(monkeypatch)
    clock = FakeClock()
    starter = FakeStarter(clock, lambda attempt, rank: Behaviour(runs=1.0, code=2) if rank == 0 else
                          Behaviour(ignores_term=True))
    with pytest.raises(RuntimeError, match="injected fault"):
        attempts.run(make_plan(grace=3.0), starter=starter, clock=clock)
    survivor = starter.started[1]
    assert survivor.signals == [signal.SIGTERM, signal.SIGKILL]  # TERM, the grace time, KILL
    assert clock.now - START == pytest.approx(4.0, abs=0.1)


def test_a_stop_signal_during_the_stop_after_an_internal_error_kills_at_once(monkeypatch):
    break_the_policy_on_exits(monkeypatch)
    clock = FakeClock()
    starter = FakeStarter(clock, lambda attempt, rank: Behaviour(runs=1.0, code=2) if rank == 0 else
                          Behaviour(ignores_term=True))
    clock.at(1.5, lambda: signal.raise_signal(signal.SIGTERM))
    with pytest.raises(RuntimeError, match="injected fault"):
        attempts.run(make_plan(grace=30.0), starter=starter, clock=clock)
    assert starter.started[1].signals == [signal.SIGTERM, signal.SIGKILL]
    assert clock.now - START == pytest.approx(1.5, abs=0.1)  # not after the 30 s of grace


def test_a_worker_that_exits_during_the_stop_after_an_internal_error_ends_it(monkeypatch):
    break_the_policy_on_exits(monkeypatch)
    clock = FakeClock()
    starter = FakeStarter(clock, lambda attempt, rank: Behaviour(runs=1.0, code=2) if rank == 0 else Behaviour())
    with pytest.raises(RuntimeError, match="injected fault"):
        attempts.run(make_plan(grace=30.0), starter=starter, clock=clock)
    assert starter.started[1].signals == [signal.SIGTERM]  # it ended on SIGTERM: no SIGKILL
    assert clock.now - START < 1.1


# ---------------------------------------------------------------- with other nodes (a fake coordinator)


class FakeChannel:
    """A control channel whose news come at scheduled times (``tick``), with no descriptor."""

    def __init__(self, clock: FakeClock, news: dict) -> None:
        self.clock = clock
        self.news = dict(news)  # time since START -> events for this node's policy

    def registrations(self) -> dict:
        return {}

    def next_deadline(self):
        return START + min(self.news) if self.news else None

    def due(self) -> list:
        events = []
        for when in sorted(t for t in self.news if START + t <= self.clock.now):
            events += self.news.pop(when)
        return events


class FakeCoordinator:
    """Node 1 of two: its causes go to node 0, whose orders (``ends``) it follows."""

    history = ()  # a job of fixed nodes
    reform_wait = 0.0

    def __init__(self, plan: Plan, channel: FakeChannel, ends, final=None) -> None:
        self.plan = plan
        self.channel = channel
        self.attempt = 0
        self.ends = list(ends)  # what finish_attempt returns, attempt after attempt
        self.final = final
        self.causes: list = []  # what this node reported

    def node_label(self) -> str:
        return "node 1 (127.0.0.2)"

    def round_events(self) -> list:
        return []

    def health_states(self) -> dict:
        return {}

    def heartbeat_ages(self) -> dict:
        return {}

    def local_cause(self, cause) -> None:
        self.causes.append(cause)

    def revise_cause(self, cause) -> None:
        self.causes[-1] = cause

    def on_events(self, events) -> list:
        return list(events)

    def tick(self, now: float) -> list:
        return self.channel.due()

    def trainers_done(self) -> list:
        return []

    def gate(self, wait):
        return None

    def finish_attempt(self, turn) -> tuple:
        what, value = self.ends.pop(0)
        if what == "restart":
            self.attempt = value
        return what, value

    def final_cause(self):
        return self.final

    def close(self) -> None:
        pass


def replay_on_node_1(behave, news: dict, ends, final=None, **plan_args) -> tuple:
    clock = FakeClock()
    starter = FakeStarter(clock, behave)
    coordinators = []

    def coordinator(plan):
        coordinators.append(FakeCoordinator(plan, FakeChannel(clock, news), ends, final))
        return coordinators[0]

    code = attempts.run(make_plan(**plan_args), starter=starter, clock=clock, coordinator=coordinator)
    return code, starter, clock, coordinators[0]


def test_a_failure_on_another_node_stops_this_one_with_node_0s_code_and_cause(capfd):
    root = policy.Cause(0, "worker", 5, "rank 0 on node 0 (127.0.0.1) failed (exit code 5)")
    code, starter, clock, coordinator = replay_on_node_1(
        lambda attempt, rank: Behaviour(), {2.0: [policy.StopOrdered("node 0 failed")]}, [("end", 5)], root)
    assert code == 5
    assert all(p.signals == [signal.SIGTERM] for p in starter.started)
    assert coordinator.causes == []  # nothing failed here
    assert clock.now - START < 2.5
    assert "launcher: the job stopped: rank 0 on node 0 (127.0.0.1) failed (exit code 5); exit code 5" in capfd.readouterr().err


def test_a_lost_node_ends_this_one_with_1():
    code, starter, _, _ = replay_on_node_1(
        lambda attempt, rank: Behaviour(), {1.0: [policy.StopOrdered("node 0 (127.0.0.1) was lost")]}, [("end", 1)])
    assert code == 1
    assert all(p.ended_with == -signal.SIGTERM for p in starter.started)


def test_a_restart_ordered_by_node_0_after_a_failure_elsewhere():
    code, starter, _, coordinator = replay_on_node_1(
        lambda attempt, rank: Behaviour(runs=3.0) if attempt == 1 else Behaviour(),
        {1.0: [policy.StopOrdered("node 0 failed")]}, [("restart", 1), ("end", 0)], max_restarts=1)
    assert code == 0
    assert starter.attempts() == [0, 1]
    assert [p.signals for p in starter.started] == [[signal.SIGTERM]] * 2 + [[]] * 2


def test_a_failure_here_and_a_stop_from_node_0_at_once_report_this_nodes_failure_once():
    code, starter, _, coordinator = replay_on_node_1(
        lambda attempt, rank: Behaviour(runs=2.0, code=7) if rank == 0 else Behaviour(),
        {2.0: [policy.StopOrdered("node 0 failed")]}, [("end", 7)])
    assert code == 7
    assert [(c.kind, c.code) for c in coordinator.causes] == [("worker", 7)]
    assert starter.started[1].signals == [signal.SIGTERM]  # one stop, not two
