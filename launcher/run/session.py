"""What a launch holds from its first worker to its end: the signal intake, the selector, the
watchdog, the job's cgroup, the spares, the state file's records, node 0's rendezvous store, the
files written for the workers and the ports reserved for them; set up in ``open``, all undone in ``close``."""

from __future__ import annotations

import os
import selectors
from contextlib import suppress
from typing import Optional

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.output import error_file
from launcher.output import log_files
from launcher.output.event_log import EventLog
from launcher.output.messages import log
from launcher.output.report_log import ReportLog
from launcher.plan import stragglers
from launcher.plan.model import Plan
from launcher.run import processes
from launcher.run.limits import check_limits
from launcher.run import trainer_status
from launcher.run.progress import ProgressPages
from launcher.run.records import Records
from launcher.run.signals import SignalIntake
from launcher.run.spares import Spares
from launcher.run.straggler_watch import StragglerWatch, peer_times
from launcher.run.starter import Clock, ProcessStarter
from launcher.run.trainer_status import TrainerStatusPush
from launcher.run.watchdog_link import WatchdogLink
from launcher.run.store import AgentStore
from launcher.run.worker_channel import WorkerChannel


PUBLISH_EVERY = 0.5  # seconds between two views of the node made for the monitor and the TrainJob status


class Launch:
    def __init__(self, plan: Plan, starter: ProcessStarter, clock: Clock, reserved: tuple = ()) -> None:
        self.plan = plan
        self.starter = starter
        self.clock = clock
        self.reserved = list(reserved)
        self.store = AgentStore(plan.agent_store, self.reserved, expected=plan.world_size,
                                keep_free=64 + 4 * len(plan.workers))  # node 0's rendezvous store
        self.selector = selectors.DefaultSelector()
        self.intake = SignalIntake(plan.stop_signals)  # --signals-to-handle
        self.cgroup: Optional[processes.JobCgroup] = None
        self.watchdog = WatchdogLink()
        self.job_label = ""  # "node N (ip)" in a job of several nodes
        self.spares = Spares(starter)  # interpreters started ahead for the next attempt
        self.records = Records(plan, self.run_id, clock)
        self.events = EventLog(plan.log_dir, plan.node_rank, clock.time,  # LOG_DIR/events.jsonl (--log_dir only)
                               to_console=plan.events_to_console)  # --event-log-handler console
        self.trainer_status = TrainerStatusPush(plan.base_env) if trainer_status.wanted(plan.base_env, plan.node_rank) \
            else None  # Kubeflow Trainer's TrainJob status, posted by node 0
        self.report_log = ReportLog(plan.log_dir, plan.node_rank, world=plan.world_size) \
            if plan.report_log and plan.log_dir else None
        self.progress = ProgressPages(wanted=plan.hang_timeout is not None or plan.monitor is not None
                                      or self.trainer_status is not None or _compares_ranks(plan)
                                      or self.report_log is not None)
        self.stragglers = StragglerWatch()  # each rank's compute time from its reports, compared
        self.said_stays = False  # --straggler_policy leave: this node said why it stays in the job
        self.monitor = None  # --monitor_port's server (launcher.run.monitor.Monitor)
        self.last_views: dict = {}  # rank -> its worker's last view (the monitor's, between two attempts)
        self.view_published = float("-inf")
        self.worker_channel: Optional[WorkerChannel] = None  # an elastic job's: its workers may re-enter in place
        self.kept: dict = {}  # local rank -> a worker kept running from one round to the next (workers.Worker)
        self.warm = None  # --warm_start: the workers started before the first round (warm.WarmWorkers), until woken
        self.parked: set = set()  # kept workers that left their round (their "parked"), waiting for the next one
        self.worker_pids: set = set()  # every worker started and not yet reaped (the local channel takes no other)
        self._files_written: list = []
        self._folders_made: list = []

    def open(self) -> None:
        """Everything a launch needs before its first worker, checked and set up."""
        self.intake.install()
        # node 0's control channel: a connection per node (an elastic job's are open already, and counted)
        nodes = len(self.plan.node_ips) if self.plan.control is not None and self.plan.elastic_round is None else 1
        copies = sum(bin(w.duplicated).count("1") for w in self.plan.workers)  # a pipe, the log and the copy's file
        pages = len(self.plan.workers) if self.progress.wanted else 0  # a progress page's memory file per worker
        check_limits(len(self.plan.workers), bool(self.plan.log_dir), nodes=nodes, extra=3 * copies + pages)
        self.starter.adopt_orphans()
        if self.plan.log_dir:
            log_files.make_log_dir(self.plan.log_dir)
        self._write_files()
        self._make_error_folders()
        self.store.listen()
        if self.plan.monitor is not None:
            from launcher.run.monitor import Monitor  # imported by the jobs that serve one, not by every job

            self.monitor = Monitor(*self.plan.monitor)
            self.monitor.start()
            log.info("monitor: %s (metrics at %smetrics)", self.monitor.url, self.monitor.url)
        if self.trainer_status is not None:
            self.trainer_status.start()
        self.cgroup = self.starter.make_cgroup(self.run_id, self.plan.base_env)
        log.debug("job cgroup: %s", self.cgroup.path if self.cgroup else "none (sweep by process group and run id)")

    def open_worker_channel(self, welcome) -> None:
        """The local channel to the workers (``welcome()``: what it tells each worker that connects)."""
        self.worker_channel = WorkerChannel(self.run_id, welcome, lambda pid: pid in self.worker_pids)
        self.worker_channel.listen()

    def worker_env(self, spec, attempt: int) -> dict:
        """What the worker of ``spec`` is given in ``attempt``: the plan's variables and the attempt's, and its ways to
        the launcher (the local channel, its progress page)."""
        env = {**self.plan.base_env, **spec.env, ev.RESTART_COUNT: str(attempt), ev.ELASTIC_RESTART_COUNT: str(attempt)}
        if self.plan.elastic_round is not None:
            env[ev.ELASTIC_ROUND] = self.plan.elastic_round
        channel = self.worker_channel.env() if self.worker_channel is not None else {}
        return {**env, **channel, **self.progress.env(spec.local_rank)}

    def poll_progress(self, now: float, job) -> list:
        """The workers' new reports (their progress pages), and about every second the straggler's search: this node's
        ranks against the other nodes' (as ``job`` shares them, and the monitor's views where a page watches); the
        events for this node's policy when this node, named a straggler, leaves the job (``--straggler_policy``)."""
        changed = self.progress.poll(now)
        self._keep_reports(changed, now)
        if self.plan.straggler_policy == "off" or (not changed and not self.stragglers.windows):
            return []
        by_local = {s.local_rank: s for s in self.plan.workers if s.kind.by_rank}
        for local_rank in changed:
            spec = by_local.get(local_rank)
            if spec is not None:
                self.stragglers.note(spec.rank, self.plan.node_rank, self.plan.node_ip, self.progress.last(local_rank), now)
        if not self.stragglers.due(now):
            return []
        job.share_speed(self.stragglers.to_share(now), now)
        views = self.monitor.job_views if self.monitor is not None else None
        peers = job.peer_times(now) + peer_times(views.latest() if views is not None else (), self.plan.node_rank)
        self.stragglers.look(now, peers, self.events)
        return self._act_on(stragglers.leaving(self.plan.straggler_policy, self.stragglers.verdict,
                                               self.plan.node_rank), job)

    def _act_on(self, straggler, job) -> list:
        """This node, the slowest straggler under ``--straggler_policy leave``: it leaves, or says (once) why it
        stays."""
        if straggler is None:
            return []
        why = job.straggler_stays()
        if why is None:
            events = job.leave_as_straggler(straggler)
            if events:
                self.events.write("straggler_leaves", node=straggler.node, host=straggler.host,
                                  speed=round(straggler.speed, 3))
            return events
        if not self.said_stays:
            self.said_stays = True
            log.warning("straggler: %s stays in the job (--straggler_policy leave): %s", job.node_label() or "this node",
                        why)
            self.events.write("straggler_stays", node=straggler.node, host=straggler.host, why=why)
        return []

    def _keep_reports(self, changed: list, now: float) -> None:
        """The new reports in ``--report_log``'s file (by rank), and those held back since."""
        if self.report_log is None:
            return
        by_local = {s.local_rank: s.rank for s in self.plan.workers if s.kind.by_rank}
        for local_rank in changed:
            if local_rank in by_local:
                self.report_log.note(by_local[local_rank], self.progress.last(local_rank), now)
        self.report_log.flush(now)

    @property
    def watched(self) -> bool:
        """Whether anything takes this node's view (the monitor, the TrainJob status)."""
        return self.monitor is not None or self.trainer_status is not None

    def publish_view(self, job, group=None, state=None) -> None:
        """This node's view for the monitor and the TrainJob status, made anew at most every PUBLISH_EVERY seconds."""
        now = self.clock.monotonic()
        if not self.watched or now - self.view_published < PUBLISH_EVERY:
            return
        self.view_published = now
        from launcher.run import node_view  # imported by the watched jobs only

        view = node_view.build(self, job, group, state)
        if self.monitor is not None:
            self.monitor.publish(view, now)
        if self.trainer_status is not None:
            self.trainer_status.publish(view)

    def replan(self, plan: Plan) -> None:
        """The plan of an elastic job's next round (its node rank, world size and ranks may differ): what the
        launch set up stays (the store, the watchdog, the state file)."""
        self.plan = plan
        self.records.plan = plan
        if self.report_log is not None:
            self.report_log.world = plan.world_size
        self.stragglers.reset()
        self.events.node = plan.node_rank
        self.store.expected = plan.world_size

    @property
    def run_id(self) -> str:
        return self.plan.workers[0].env[ev.RUN_ID]

    def _write_files(self) -> None:
        for path, text in self.plan.files.items():
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
            except OSError as e:
                raise LaunchError(f"cannot write {path} ({e.strerror}); set TMPDIR to a writable folder.") from None
            self._files_written.append(path)

    def _make_error_folders(self) -> None:
        """Where each worker's @record writes (its TORCHELASTIC_ERROR_FILE); removed at the end."""
        for folder in sorted({os.path.dirname(path) for path in _error_files(self.plan.workers)}):
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise LaunchError(f"cannot make {folder} ({e.strerror}); set TMPDIR to a writable folder.") from None
            self._folders_made.append(folder)

    def _remove_error_files(self) -> None:
        for path in _error_files(self.plan.workers):
            error_file.remove(path)
        for folder in self._folders_made:
            try:
                os.rmdir(folder)
            except OSError:
                log.debug("could not remove %s", folder)

    def start_watchdog(self) -> None:
        self.watchdog.start(self.starter, self.run_id, self.plan.shutdown_timeout,
                            self.cgroup.path if self.cgroup is not None else None)

    def reap_orphans(self, keep) -> None:
        """Collect every child that ended, except the workers (``keep``) and the watchdog."""
        keep = set(keep) | {w.pid for w in self.kept.values()} | ({self.watchdog.pid} if self.watchdog.pid is not None else set())
        for pid in self.starter.children():
            if pid not in keep:
                self.starter.reap(pid, wait=False)
        self.watchdog.check()

    def close(self) -> None:
        if self.report_log is not None:  # the last reports, of workers that ended since the last look
            self._keep_reports(self.progress.poll(self.clock.monotonic()), self.clock.monotonic())
            self.report_log.close(self.clock.monotonic())
        self.records.close()
        self.events.close()
        if self.monitor is not None:
            self.monitor.close()
        if self.trainer_status is not None:
            self.trainer_status.close()
        self.progress.close()
        self.spares.drop()
        self.watchdog.stop()
        self.reap_orphans(keep=())
        if self.cgroup is not None and not self.cgroup.remove():
            log.debug("could not remove %s", self.cgroup.path)
        self.intake.restore()
        for path in self._files_written:
            _remove(path)
        self._remove_error_files()
        self.store.close()
        if self.worker_channel is not None:
            self.worker_channel.close()
        for s in self.reserved:
            s.close()
        self.selector.close()
        self.intake.close()


def _compares_ranks(plan: Plan) -> bool:
    """Whether the straggler's search has ranks to compare: several here, or other nodes'."""
    return plan.straggler_policy != "off" and (len(plan.workers) > 1 or len(plan.node_ips) > 1)


def _error_files(specs) -> list:
    return [s.env[ev.ERROR_FILE] for s in specs if s.env.get(ev.ERROR_FILE)]


def _remove(path: str) -> None:
    with suppress(OSError):
        os.remove(path)
        os.rmdir(os.path.dirname(path))
