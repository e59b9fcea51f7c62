"""One trial of ``launcher tune``: one whole job, ``python -m launcher --config TRIAL.yaml --log_dir FOLDER
--report_log``, started in a session of its own (a Ctrl-C at the terminal reaches the tuner, not the trial), watched
through the reports its launcher keeps in FOLDER, and stopped when its rate is known (``launcher.plan.tune_rate``):
SIGTERM to that one process, whose launcher then stops its own workers, and SIGKILL to it alone after GRACE. Nothing
else is ever signalled. The trial's own output is kept in FOLDER/launcher.log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress
from typing import Callable, Optional

from launcher.output import report_log
from launcher.plan import tune_rate
from launcher.plan.tune_space import Space
from launcher.run.starter import Clock
from launcher.untrusted import json_object

POLL = 0.2  # seconds between two looks at the trial
GRACE = 60.0  # seconds the trial's launcher has to stop its workers after SIGTERM
OUTPUT = "launcher.log"
LAST_LINE = 300  # characters of the trial's last line of output kept as its failure's reason


def command(config: str, folder: str) -> list:
    return [sys.executable, "-m", "launcher", "--config", config, "--log_dir", folder, "--report_log"]


def start(config: str, folder: str) -> subprocess.Popen:
    """The trial's launcher, in a session of its own, its output in FOLDER/launcher.log."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, OUTPUT), "ab") as out:
        return subprocess.Popen(command(config, folder), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def run(config: str, folder: str, space: Space, clock: Clock, on_progress: Callable,
        wait: Optional[Callable[[float], None]] = None) -> tuple:
    """(why, rate or None) of the trial of ``config`` (``on_progress(seconds, rate)`` while it runs; ``wait(seconds)``
    between two looks: the clock's sleep, or the tune link's, which takes the other nodes' reports meanwhile)."""
    series = tune_rate.Series(space.metric, space.warmup_steps)
    reports = TrialReports(folder)
    proc = start(config, folder)
    wait = wait or clock.sleep
    start_time = clock.monotonic()
    try:
        while True:
            code = proc.poll()
            reports.read_into(series)
            elapsed = clock.monotonic() - start_time
            if code is not None:
                return _ended(code, series, folder, space, clock)
            done = tune_rate.verdict(series, elapsed, clock.time(), space.trial_seconds, space.steady)
            if done is not None:
                stop(proc, clock)
                return done
            on_progress(elapsed, series.rate())
            wait(POLL)
    except BaseException:  # Ctrl-C or an error of the tuner: the trial does not outlive it
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the stop short
        try:
            stop(proc, clock)
        finally:
            signal.signal(signal.SIGINT, before)
        raise


def _ended(code: int, series, folder: str, space: Space, clock: Clock) -> tuple:
    if code == 0:
        return tune_rate.ended(series, clock.time(), space.trial_seconds, "ended")
    return f"exit code {code}: {last_line(os.path.join(folder, OUTPUT))}", None


def stop(proc: subprocess.Popen, clock: Clock) -> None:
    """SIGTERM to the trial's launcher (the process the tuner started, and no other), SIGKILL after GRACE."""
    if proc.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    deadline = clock.monotonic() + GRACE
    while proc.poll() is None and clock.monotonic() < deadline:
        clock.sleep(0.05)
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def last_line(path: str) -> str:
    """The trial's last line of output (its launcher's error, most often)."""
    with suppress(OSError), open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 4096))
        lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
        if lines:
            return lines[-1][:LAST_LINE]
    return "no output"


class TrialReports:
    """Every node's report log in the trial's folder (``reports.nodeN.jsonl``: node 0's, and the other nodes' where
    they share the log dir; ``reports.nodeN.relayed.jsonl``: the lines other machines sent, the hosts of a --hostfile
    job over ssh or the other nodes' tuners), each read as it grows. A line read twice (a host's own file and its
    relayed copy, in a shared folder) counts once: a rank's points follow its own clock (``tune_rate.Series.add``)."""

    def __init__(self, folder: str) -> None:
        self.logs = report_log.FolderLines(folder)

    def read_into(self, series) -> None:
        for lines in self.logs.read().values():
            for doc in filter(None, map(json_object, lines)):
                series.add(doc)
