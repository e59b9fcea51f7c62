"""One turn of the event loop: wait on the selector (signals, the workers' pipes, the console, the
control channel, node 0's rendezvous store) until something happens or a deadline comes, and turn
what happened into policy events. Nothing wakes on a timer except the console echo of a log file
while it has something to follow, the deadlines of a stop, and the control channel's and the
store's own."""

from __future__ import annotations

import selectors
from dataclasses import dataclass
from typing import Optional

from launcher import local_channel as lc
from launcher.output.console import console
from launcher.output.messages import log
from launcher.plan import policy
from launcher.run.coordination import Channel, Coordinator
from launcher.output.report_log import EVERY as REPORT_EVERY
from launcher.run.session import PUBLISH_EVERY, Launch
from launcher.run.straggler_watch import LOOK_EVERY
from launcher.run.store import AgentStore
from launcher.run.workers import Worker, WorkerGroup

DRAIN_SECONDS = 5.0  # how long output may still come after every process is gone
HELPERS_SECONDS = 2.0  # how long Python's multiprocessing helpers (resource_tracker) get to end by themselves


# ---------------------------------------------------------------- what each registered descriptor is


@dataclass(frozen=True, eq=False)
class SignalTag:
    """The signal intake's wakeup pipe: the signals are read on every turn."""


@dataclass(frozen=True, eq=False)
class PipeTag:
    worker: Worker  # one of its output pipes


@dataclass(frozen=True, eq=False)
class ConsoleTag:
    stream: object  # a console stream with output waiting for room


@dataclass(frozen=True, eq=False)
class ControlTag:
    channel: Channel  # the control channel between the nodes


@dataclass(frozen=True, eq=False)
class WorkerChannelTag:
    """The local channel to the workers: its listener or one worker's connection."""


@dataclass(frozen=True, eq=False)
class StoreTag:
    store: AgentStore  # node 0's rendezvous store: its listener or one of its clients


def _register_or_push(selector, fd: int, events: int, data) -> None:
    """Watch ``fd``; a console that epoll refuses to watch (a regular file, /dev/null: always writable) had output
    pending only for the moment another thread took between adding it and writing it: written now, not watched."""
    try:
        selector.register(fd, events, data)
    except PermissionError:
        if not isinstance(data, ConsoleTag):
            raise
        data.stream.push()


class Loop:
    """Without a worker group, it serves the time between two attempts."""

    def __init__(self, launch: Launch, job: Coordinator, group: Optional[WorkerGroup] = None) -> None:
        self.launch = launch
        self.clock = launch.clock
        self.job = job
        self.group = group
        self.selector = launch.selector
        self.follow_delay = 0.02
        self.quiet_since: Optional[float] = None  # when the last process of the job was gone
        self.helpers_since: Optional[float] = None  # when only multiprocessing helpers were left
        self.abandoned = False
        self.wake_by: Optional[float] = None  # a deadline of the caller's (turn_until)
        workers = group.workers.values() if group else ()
        self.pipes_open = {fd: w for w in workers for fd in w.output.pipes()}
        self.store_tag = StoreTag(launch.store)
        self.worker_tag = WorkerChannelTag()
        self.control_tag: Optional[ControlTag] = None  # one tag for the channel: a new one would re-register every socket
        if launch.intake.fd not in self.selector.get_map():
            self.selector.register(launch.intake.fd, selectors.EVENT_READ, SignalTag())

    def turn(self, state: Optional[policy.State] = None) -> list:
        self._sync_registrations(ended=state is not None and not state.running)
        events = []
        for key, mask in self.clock.select(self.selector, self._timeout(state)):
            tag = key.data
            if isinstance(tag, PipeTag) and not tag.worker.output.read_pipe(key.fd):
                self.selector.unregister(key.fd)
                del self.pipes_open[key.fd]
            elif isinstance(tag, ConsoleTag):
                tag.stream.push()
            elif isinstance(tag, ControlTag):
                events += self.job.on_events(tag.channel.ready(key.fd, mask, self.clock.monotonic()))
            elif isinstance(tag, StoreTag):
                tag.store.ready(key.fd, mask, self.clock.monotonic())
            elif isinstance(tag, WorkerChannelTag):
                events += self._worker_said(self.launch.worker_channel.ready(key.fd, mask))
        self.launch.store.tick(self.clock.monotonic())
        if self.launch.worker_channel is not None:
            self.launch.worker_channel.tick(self.clock.monotonic())
        events += self.launch.poll_progress(self.clock.monotonic(), self.job)
        if self.group is not None:
            moved = self.group.follow_logs()
            self.follow_delay = 0.02 if moved else min(self.follow_delay * 2, 0.25)
        if self.job.channel is not None:
            events += self.job.tick(self.clock.monotonic())
        self.launch.publish_view(self.job, self.group, state)
        return self._signal_events() + events + self._hang_events(state)

    def turn_until(self, deadline: float) -> list:
        """One turn between two attempts that waits at most until ``deadline`` (monotonic)."""
        self.wake_by = deadline
        try:
            return self.turn()
        finally:
            self.wake_by = None

    def _worker_said(self, said) -> list:
        """A worker that says it re-enters in place (its hello), as the policy's event; the rest is the group's."""
        events = []
        by_pid = {w.pid: rank for rank, w in self.group.workers.items()} if self.group is not None else {}
        for s in said:
            if s.message.get("t") == lc.HELLO and s.message.get("keep") is True and s.pid in by_pid:
                events.append(policy.OptedIn(by_pid[s.pid]))
            elif s.message.get("t") == lc.PARKED:
                self.launch.parked.add(s.pid)
        return events

    def _signal_events(self) -> list:
        events = []
        intake = self.launch.intake
        for sig in intake.received():
            if sig in intake.stopping:
                events.append(policy.StopSignal(sig))
            elif sig in intake.passed_on:
                events.append(policy.UserSignal(sig))
        workers = []
        if self.group is not None:
            # exits are looked for on every turn: cheap, and no SIGCHLD can be missed
            events[:0] = self.group.exits()
            workers = [w.pid for w in self.group.workers.values()]
        self.launch.reap_orphans(keep=workers)
        return events

    def _hang_events(self, state) -> list:
        limit = self.launch.plan.hang_timeout
        if limit is None or self.group is None or state is None or state.stopping or not state.running:
            return []
        quiet = self.clock.time() - self.group.last_output()
        if quiet >= limit:
            return [policy.Hung(limit)]
        by_local = {w.spec.local_rank: rank for rank, w in self.group.workers.items() if rank in state.running}
        stalled = self.launch.progress.stalled(by_local, limit, self.clock.monotonic())
        if stalled is None:
            return []
        local_rank, report = stalled
        return [policy.Hung(limit, by_local[local_rank], report["step"])]

    def _timeout(self, state) -> Optional[float]:
        now = self.clock.monotonic()
        waits = []
        deadline = policy.next_deadline(state) if state is not None else None
        if deadline is not None:
            waits.append(max(0.0, deadline - now))
        if self.group is not None and self.group.follows():
            waits.append(self.follow_delay)
        if state is not None and not state.running:
            waits.append(0.05)  # leftovers and the drain: looked at while they last
        channel = self.launch.worker_channel
        for t in (self.job.channel.next_deadline() if self.job.channel is not None else None,
                  self.launch.store.next_deadline(), channel.next_deadline() if channel is not None else None):
            if t is not None:
                waits.append(max(0.0, t - now))
        if self.launch.plan.hang_timeout is not None and self.group is not None:
            waits.append(max(0.05, self.launch.plan.hang_timeout / 4))
        if self.wake_by is not None:
            waits.append(max(0.0, self.wake_by - now))
        if self.launch.watched:
            waits.append(PUBLISH_EVERY)
        if self.launch.report_log is not None and self.group is not None:
            waits.append(REPORT_EVERY)  # --report_log: the reports read while the workers write nothing
        if self.launch.stragglers.windows and self.group is not None:
            waits.append(LOOK_EVERY)  # the straggler's search, also while the workers write nothing
        return min(waits) if waits else None

    def _sync_registrations(self, ended: bool) -> None:
        """Once the workers are gone (``ended``), their pipes are read whatever room the console
        has: nothing is gained by holding them, and the console holds a bounded amount (HOLD)."""
        for fd, worker in list(self.pipes_open.items()):
            if self.group is not None and self.group.workers.get(worker.spec.rank) is not worker:  # kept for a round
                self._register(fd, selectors.EVENT_READ, None, False)
                del self.pipes_open[fd]
                continue
            self._register(fd, selectors.EVENT_READ, PipeTag(worker), ended or worker.output.wants(fd))
        for fd, events in self.launch.store.changes():
            self._watch(fd, events, self.store_tag)
        wanted = {fd: (selectors.EVENT_WRITE, ConsoleTag(stream)) for fd, stream in console.waiting().items()}
        if self.job.channel is not None:
            if self.control_tag is None or self.control_tag.channel is not self.job.channel:
                self.control_tag = ControlTag(self.job.channel)
            for fd, events in self.job.channel.registrations().items():
                wanted[fd] = (events, self.control_tag)
        channel = self.launch.worker_channel
        for fd, events in (channel.registrations() if channel is not None else {}).items():
            wanted[fd] = (events, self.worker_tag)
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, (ConsoleTag, ControlTag, WorkerChannelTag)) and key.fd not in wanted:
                self.selector.unregister(key.fd)
        for fd, (events, data) in wanted.items():
            key = self.selector.get_map().get(fd)
            if key is not None and (key.events != events or key.data is not data):
                try:
                    self.selector.modify(fd, events, data)
                    continue
                except (OSError, KeyError, ValueError):  # the number was closed and taken again
                    self.selector.unregister(fd)
                    key = None
            if key is None:
                _register_or_push(self.selector, fd, events, data)

    def _watch(self, fd, events, data) -> None:
        """Watch ``fd`` for ``events`` from now on; none: stop watching it."""
        key = self.selector.get_map().get(fd)
        if not events:
            if key is not None:
                self.selector.unregister(fd)
        elif key is not None:
            self.selector.modify(fd, events, data)
        else:
            self.selector.register(fd, events, data)

    def _register(self, fd, events, data, wanted: bool) -> None:
        known = fd in self.selector.get_map()
        if wanted and not known:
            self.selector.register(fd, events, data)
        elif known and not wanted:
            self.selector.unregister(fd)

    def forget_pipes(self) -> None:
        """The group's pipes still registered are no longer looked at (before they are closed)."""
        for fd in self.pipes_open:
            if fd in self.selector.get_map():
                self.selector.unregister(fd)

    def abandon(self) -> None:
        self.abandoned = True
        console.abandon()

    def helpers_may_end(self) -> bool:
        """Whether Python's multiprocessing helpers left by the workers still have time to end by themselves."""
        now = self.clock.monotonic()
        if self.helpers_since is None:
            self.helpers_since = now
        return now - self.helpers_since < HELPERS_SECONDS

    def drained(self) -> bool:
        """All output read, or the drain time over (a process outside the job may hold a pipe),
        or the user asked twice to stop."""
        if not self.pipes_open or self.abandoned:
            return True
        now = self.clock.monotonic()
        if self.quiet_since is None:
            self.quiet_since = now
        if now - self.quiet_since < DRAIN_SECONDS:
            return False
        log.debug("pipes still open after %.0f s: not waiting for them", DRAIN_SECONDS)
        return True
