"""What each event means for a running job: a pure function of (state, event, time).

The supervisor turns what happens (a worker exits, a signal arrives, a deadline passes) into the
events below, feeds them to ``decide`` and carries out the actions it returns. Nothing here
touches a process, so every rule is tested with plain tables (tests/test_policy.py).

The stop sequence, the same whatever started it: the signal that stops the job (SIGTERM after a
failure or for leftovers; the received one for a stop signal), then SIGTERM to whatever still
runs after ``TERM_FOLLOWS`` (so a worker that saves a checkpoint on SIGTERM gets to), then
SIGKILL when the grace time (``--shutdown_timeout``) has passed since the stop began. A second
stop signal kills at once. After SIGKILL, the supervisor waits at most ``KILL_WAIT`` seconds.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Tuple, Union

# the causes are the policy's vocabulary across nodes: re-exported for the layers above
from launcher.plan.causes import WIRE_SUMMARY, Cause, after_attempt, never_joined, one_line, still_due  # noqa: F401

TERM_FOLLOWS = 1.0  # seconds from a passed-on stop signal (INT, HUP, QUIT, ...) to the SIGTERM after it (at most grace/2)
KILL_WAIT = 5.0  # how long processes may take to vanish after SIGKILL before the launcher gives up
# parameter-server mode: a server that fails this soon after a trainer did is the root cause (the trainer
# failed because its server was gone: the exits of one moment are seen in any order)
SERVER_FIRST = 0.5


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class WorkerExited:
    rank: int
    returncode: int  # negative: killed by that signal


@dataclass(frozen=True)
class StopSignal:
    sig: int  # a stop signal reached the launcher: INT, TERM, HUP, QUIT, or --signals-to-handle's (Plan.stop_signals)


@dataclass(frozen=True)
class UserSignal:
    sig: int  # USR1 or USR2 (unless a stop signal): passed on, nothing else


@dataclass(frozen=True)
class LeftoversRunning:
    count: int  # every worker has exited, these processes of the job still run
    helpers: bool = False  # all of them Python's multiprocessing helpers, given time to end by themselves


@dataclass(frozen=True)
class StartFailed:
    rank: int
    reason: str  # a worker could not be started (no descriptors, no processes left, ...)


@dataclass(frozen=True)
class StopOrdered:
    reason: str  # the job stops for a cause elsewhere (another node, a lost node)
    stacks: bool = False  # show where the workers were first (the cause is a hang)
    level: int = logging.ERROR  # an elastic job's membership change is a warning: the job goes on


@dataclass(frozen=True)
class RoundOver:
    reason: str  # an elastic job's membership changed: keep the workers that re-enter in place, else stop them


@dataclass(frozen=True)
class OptedIn:
    rank: int  # this worker re-enters its training in place at a new round (launcher.runtime.elastic)


@dataclass(frozen=True)
class TrainersDone:
    reason: str  # parameter-server mode: every trainer of the job exited 0; the servers are stopped


@dataclass(frozen=True)
class Hung:
    seconds: float  # no worker wrote a line for this long (--hang_timeout), or, with ``rank``, reported progress
    rank: Optional[int] = None  # the worker whose progress reports (launcher.runtime.report) stopped this long
    step: Optional[int] = None  # the last step that worker reported


@dataclass(frozen=True)
class TimePassed:
    pass  # a deadline of the state may have come


Event = Union[WorkerExited, StopSignal, UserSignal, LeftoversRunning, StartFailed, StopOrdered, RoundOver, OptedIn,
              TrainersDone, Hung, TimePassed]


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Send:
    sig: int
    leftovers: bool = True  # also to the job's processes outside the workers' groups


@dataclass(frozen=True)
class Kill:
    pass  # SIGKILL to everything of the job


@dataclass(frozen=True)
class TakeStacks:
    pass  # record where each surviving worker is, before the stop signal


@dataclass(frozen=True)
class Keep:
    ranks: frozenset  # these workers are told the round is over and kept running, for the next round


@dataclass(frozen=True)
class Say:
    level: int
    text: str


Action = Union[Send, Kill, Say, TakeStacks, Keep]


# ---------------------------------------------------------------- state


@dataclass(frozen=True)
class State:
    running: frozenset  # ranks whose worker has not exited
    grace: float
    stacks: bool = False  # take the workers' stacks before any stop (--dump_stacks); always on a hang
    failure: Optional[Tuple[int, int]] = None  # (rank, returncode) of the first failure
    stop_signal: Optional[int] = None  # the signal that stopped the job
    start_failure: Optional[str] = None  # why the workers could not all be started
    hung: Optional[float] = None  # stopped because no worker wrote (or one made no progress) for this many seconds
    stalled: Optional[Tuple[int, Optional[int]]] = None  # (rank, last step reported): the worker that made no progress
    stop_began: Optional[float] = None
    term_at: Optional[float] = None  # a SIGTERM still to follow a passed-on signal
    kill_at: Optional[float] = None
    killed_at: Optional[float] = None
    names: Mapping[int, str] = field(default_factory=dict)  # rank -> how messages name it; "rank N" when absent
    trainers: Optional[frozenset] = None  # parameter-server mode: this node's trainers (None: collective)
    opted_in: frozenset = frozenset()  # ranks that re-enter in place at a new round
    kept: frozenset = frozenset()  # ranks kept running for the next round (RoundOver)

    @property
    def stopping(self) -> bool:
        return self.stop_began is not None

    @property
    def gave_up_at(self) -> Optional[float]:
        return None if self.killed_at is None else self.killed_at + KILL_WAIT

    @property
    def trainers_done(self) -> bool:
        """Parameter-server mode: every trainer of this node has exited 0 (true at once for a node without one)."""
        return self.trainers is not None and self.failure is None and not self.trainers & self.running

    def name(self, rank: int) -> str:
        return self.names.get(rank, f"rank {rank}")


def start(ranks, grace: float, stacks: bool = False, names: Optional[Mapping[int, str]] = None,
          trainers=None, opted_in=()) -> State:
    """``names``: how messages name each rank; ``trainers``: parameter-server mode's trainers here; ``opted_in``:
    the workers kept from the round before, which re-enter in place."""
    return State(running=frozenset(ranks), grace=grace, stacks=stacks, names=dict(names or {}),
                 trainers=None if trainers is None else frozenset(trainers), opted_in=frozenset(opted_in))


def next_deadline(state: State) -> Optional[float]:
    kill_at = state.kill_at if state.killed_at is None else None
    times = [t for t in (state.term_at, kill_at, state.gave_up_at) if t is not None]
    return min(times) if times else None


def exit_code(state: State) -> int:
    """The launcher's exit code once the job is over: the first failure's, else the signal's;
    1 when the workers could not all be started (a resource ran out: not the user's input)."""
    if state.start_failure is not None or state.hung is not None:
        return 1
    if state.failure is not None:
        return shell_code(state.failure[1])
    if state.stop_signal is not None:
        return 128 + state.stop_signal
    return 0


def shell_code(returncode: int) -> int:
    """A return code as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def gave_up(state: State, now: float) -> bool:
    return state.gave_up_at is not None and now >= state.gave_up_at


# ---------------------------------------------------------------- rules


def decide(state: State, event: Event, now: float) -> Tuple[State, tuple]:
    if isinstance(event, (StopOrdered, Hung, LeftoversRunning)) and state.stopping:  # one stop at a time
        return state, ()
    if isinstance(event, WorkerExited):
        return _on_exit(state, event, now)
    if isinstance(event, StopSignal):
        return _on_stop_signal(state, event.sig, now)
    if isinstance(event, UserSignal):
        name = signal.Signals(event.sig).name
        return state, (Say(logging.INFO, f"passing {name} on to the workers"), Send(event.sig, leftovers=False))
    if isinstance(event, StartFailed):
        state = replace(state, start_failure=event.reason)
        say = Say(logging.ERROR, f"{event.reason}; stopping the {len(state.running)} worker(s) already started")
        return _begin_stop(state, now, signal.SIGTERM, say)
    if isinstance(event, StopOrdered):
        say = Say(event.level, f"{event.reason}; stopping the workers")
        return _begin_stop(state, now, signal.SIGTERM, say, stacks=event.stacks)
    if isinstance(event, OptedIn):
        return replace(state, opted_in=state.opted_in | {event.rank}), ()
    if isinstance(event, RoundOver):
        return _on_round_over(state, event, now)
    if isinstance(event, TrainersDone):
        if state.stopping or not state.running or state.trainers is None:  # collective jobs have no servers to stop
            return state, ()
        say = Say(logging.INFO, f"{event.reason}: stopping the {len(state.running)} server(s)")
        return _begin_stop(state, now, signal.SIGTERM, say)
    if isinstance(event, Hung):
        stalled = (event.rank, event.step) if event.rank is not None else None
        state = replace(state, hung=event.seconds, stalled=stalled)
        say = Say(logging.ERROR, f"{hang_text(state)} (--hang_timeout): stopping the job")
        return _begin_stop(state, now, signal.SIGTERM, say)
    if isinstance(event, LeftoversRunning):
        level = logging.DEBUG if event.helpers else logging.INFO  # Python's own, not the user's: no alarm
        say = Say(level, f"stopping {event.count} process(es) the workers left running")
        return _begin_stop(state, now, signal.SIGTERM, say)
    return _on_time(state, now)


def _on_exit(state: State, event: WorkerExited, now: float):
    state = replace(state, running=state.running - {event.rank})
    if _server_came_first(state, event, now):
        trainer = state.failure[0]
        state = replace(state, failure=(event.rank, event.returncode))
        return state, (Say(logging.ERROR, f"{state.name(event.rank)} failed ({describe_exit(event.returncode)}): "
                                          f"the root cause; {state.name(trainer)} failed after it"),)
    if event.returncode == 0 or state.stopping:
        return state, ()
    state = replace(state, failure=(event.rank, event.returncode))
    others = len(state.running)
    what = "worker(s)" if state.trainers is None else "process(es)"
    rest = f"; stopping the other {others} {what}" if others else ""
    say = Say(logging.ERROR, f"{state.name(event.rank)} failed ({describe_exit(event.returncode)}){rest}")
    return _begin_stop(state, now, signal.SIGTERM, say)


def _on_round_over(state: State, event: RoundOver, now: float):
    """The membership changed: when every running worker of this node re-enters in place, they are kept (told the
    round is over) and the round ends here; else they are all stopped, as a program that did not opt in is."""
    if state.stopping or not state.running:
        return state, ()
    if state.running <= state.opted_in and state.failure is None:
        kept = state.running
        say = Say(logging.WARNING, f"{event.reason}; keeping the {len(kept)} worker(s) for the next round")
        return replace(state, running=frozenset(), kept=kept), (say, Keep(kept))
    return decide(state, StopOrdered(event.reason, level=logging.WARNING), now)


def _server_came_first(state: State, event: WorkerExited, now: float) -> bool:
    """A server's failure seen just after a trainer's, which stopped the job: the server's is the
    cause (its trainers fail at once without it), unless the exit is the stop's own SIGTERM or SIGKILL."""
    if state.trainers is None or state.failure is None or state.failure[0] not in state.trainers:
        return False
    ours = {-signal.SIGTERM, 128 + signal.SIGTERM}
    if state.killed_at is not None:
        ours |= {-signal.SIGKILL, 128 + signal.SIGKILL}
    return (event.rank not in state.trainers and event.returncode != 0 and event.returncode not in ours
            and now - state.stop_began <= SERVER_FIRST)


def _on_stop_signal(state: State, sig: int, now: float):
    name = signal.Signals(sig).name
    if state.stopping:
        if state.killed_at is not None:
            return state, ()
        again = "again" if state.stop_signal is not None else "while stopping"
        say = Say(logging.WARNING, f"received {name} {again}: killing everything now "
                                   f"({now - state.stop_began:.1f} s after the stop began)")
        return replace(state, killed_at=now, term_at=None, stop_signal=state.stop_signal or sig), (say, Kill())
    state = replace(state, stop_signal=sig)
    say = Say(logging.WARNING, f"received {name}: passing it on and stopping the workers")
    return _begin_stop(state, now, sig, say)


def _begin_stop(state: State, now: float, sig: int, say: Say, stacks: bool = False):
    term_at = None if sig == signal.SIGTERM else now + min(TERM_FOLLOWS, state.grace / 2)
    wanted = stacks or state.stacks or state.hung is not None
    stacks = (TakeStacks(),) if wanted and state.running else ()
    state = replace(state, stop_began=now, term_at=term_at, kill_at=now + state.grace)
    return state, (say, *stacks, Send(sig))


def _on_time(state: State, now: float):
    actions = []
    if state.term_at is not None and now >= state.term_at:
        state = replace(state, term_at=None)
        actions.append(Send(signal.SIGTERM))
    if state.kill_at is not None and state.killed_at is None and now >= state.kill_at:
        who = (", ".join(state.name(r) for r in sorted(state.running)) if state.running
               else "processes the workers left")
        actions.append(Say(logging.WARNING, f"{who} still running {now - state.stop_began:.1f} s "
                                            f"after the stop began: sending SIGKILL"))
        if state.stacks and state.running:  # --dump_stacks: where a worker that let SIGTERM pass was
            actions.append(TakeStacks())
        actions.append(Kill())
        state = replace(state, killed_at=now, term_at=None)
    return state, tuple(actions)


def hang_text(state: State, on: str = "") -> str:
    """What the hang was: no line from any worker (``on``: "on node N"), or a rank's progress stopped."""
    if state.stalled is None:
        return f"no worker{on} wrote a line for {state.hung:g} s"
    rank, step = state.stalled
    last = f" (its last report: step {step})" if step is not None else ""
    return f"{state.name(rank)}{on} made no progress for {state.hung:g} s{last}"


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit code {returncode}"
