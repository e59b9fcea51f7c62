"""``launcher tune`` on a node that is not node 0, in a job whose nodes are started on their own: this node's tuner
follows the leading one (``launcher.nodes.tune``). For each trial it is ordered, it runs this node's part of the job,
``python -m launcher --config`` of its own launch with the trial's point over it, as the trial's job id, in
LOG_DIR/trial-N/follower-I; sends the trial's report lines back as they come; stops the trial when told (SIGTERM to
its launcher, the one process it started, as the leader's does); and says when the trial's launcher ended. It ends
with the tuning (the leader's word), or when the leader leaves: then its running trial is stopped."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Optional

from launcher.errors import LaunchError
from launcher.nodes.transport.tune_messages import TrialEnded, TrialOrder, TrialStop, TuneOver
from launcher.nodes.tune.follower import Leader, LeaderGone
from launcher.output import report_log
from launcher.output.console import console
from launcher.plan import tune_trial
from launcher.plan.tune_nodes import TuneNodes
from launcher.plan.tune_space import Space, label
from launcher.run import tune_trial as trials
from launcher.run.starter import Clock, SystemClock

IDLE = 5.0  # seconds between two looks for the leader's next order


class LeaderLost(LaunchError):
    exit_code = 1


@dataclass(frozen=True)
class FollowJob:
    space: Space
    base: dict  # this node's launch, as config settings
    log_dir: str
    nodes: TuneNodes
    token: Optional[str]
    name: str  # this node, for the leader's messages
    join_timeout: float


def follow(job: FollowJob, clock: Clock = SystemClock()) -> int:
    where = f"{job.nodes.address}:{job.nodes.port}"
    leader = Leader.join(job.nodes.address, job.nodes.port, job.token, job.name, time.monotonic() + job.join_timeout)
    _say(f"tune: this node follows the leading tuner at {where}; its trials are kept in {job.log_dir}")
    try:
        while True:
            message = leader.receive(IDLE)
            if isinstance(message, TuneOver):
                _say(f"tune: the leading tuner ended the tuning{': ' + message.reason if message.reason else ''}")
                return 0 if message.reason is None else 1
            if isinstance(message, TrialOrder) and message.trial is not None and message.point is not None:
                over = _trial(job, leader, message, clock)
                if over is not None:
                    _say("tune: the leading tuner ended the tuning during a trial")
                    return 0 if over.reason is None else 1
    except LeaderGone as e:
        raise LeaderLost(f"the leading tuner at {where} left ({e}); this node's tuning stops with it.") from None
    except KeyboardInterrupt:
        return 130
    finally:
        leader.close()


def _trial(job: FollowJob, leader: Leader, order: TrialOrder, clock: Clock) -> Optional[TuneOver]:
    """This node's part of the trial ``order``, to its end; the leader's TuneOver if it came meanwhile."""
    problem = ordered_outside(job.space, order)
    if problem is not None:
        raise LaunchError(f"the leading tuner ordered {problem}; start every node with the same --space.")
    folder = os.path.join(job.log_dir, f"trial-{order.trial}", f"follower-{order.follower or 0}")
    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, "trial.yaml")
    settings = {**tune_trial.config(job.base, job.space, order.point), "job_id": order.job_id}
    with open(config, "w") as f:
        f.write(tune_trial.to_yaml(settings, f"launcher tune, trial {order.trial} (followed): {label(order.point)}"))
    proc = trials.start(config, folder)
    logs, over = report_log.FolderLines(folder), None
    try:
        while proc.poll() is None:
            _relay(leader, order.trial, logs)
            message = leader.receive(trials.POLL)
            over = message if isinstance(message, TuneOver) else over
            if isinstance(message, TrialStop) and message.trial == order.trial or over is not None:
                trials.stop(proc, clock)
    except BaseException:
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            trials.stop(proc, clock)
        finally:
            signal.signal(signal.SIGINT, before)
        raise
    _relay(leader, order.trial, logs)
    code = proc.returncode if 0 <= proc.returncode <= 255 else 128 - proc.returncode
    leader.send(TrialEnded(order.trial, code, trials.last_line(os.path.join(folder, trials.OUTPUT)) if code else None))
    return over


def ordered_outside(space: Space, order: TrialOrder) -> Optional[str]:
    """What the order asks that this node's own space does not list (a knob, a value), or a job id no launch takes:
    this node runs only its own space's points."""
    values = {k.name: {repr(v) for v in k.values} for k in space.knobs}
    for name, value in order.point:
        if name not in values:
            return f"knob {name}, which this node's space does not have"
        if repr(value) not in values[name]:
            return f"{name}={value!r}, a value this node's space does not list"
    if not (order.job_id and order.job_id.isprintable() and len(order.job_id) <= 200):
        return "a trial without a job id"
    return None


def _relay(leader: Leader, trial: int, logs) -> None:
    for node, lines in logs.read().items():
        leader.send_lines(trial, node, lines)


def _say(line: str) -> None:
    console.write(1, (line + "\n").encode())
