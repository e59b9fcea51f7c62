"""``launcher tune``'s run: the search (``launcher.plan.tune_search``) trial after trial, each one whole job
(``launcher.run.tune_trial``) in LOG_DIR/trial-N, each result a line of LOG_DIR/tune.jsonl as it ends, which
``--resume`` reads to skip the trials already measured; at the end the table, and the best trial's config written to
``--out``. Ctrl-C (or SIGTERM, SIGHUP) stops the running trial, keeps the history and says how to resume."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Optional

from launcher.errors import LaunchError
from launcher.output import tune_lines
from launcher.output.console import console
from launcher.plan import tune_history, tune_trial
from launcher.plan.tune_rate import NOTHING
from launcher.plan.tune_search import DEFAULTS, Result, Search
from launcher.plan.tune_space import Space, label
from launcher.run import tune_trial as trials
from launcher.run.starter import Clock, SystemClock
from launcher.run.tune_lead import Lead, PartFailed

HISTORY = "tune.jsonl"


class TrialsFailed(LaunchError):
    exit_code = 1


class NotKept(LaunchError):
    """The trials ran, but their outcome could not be written (--out, --plot)."""

    exit_code = 1


@dataclass(frozen=True)
class TuneJob:
    space: Space
    base: dict  # the launch given to tune, as config settings
    log_dir: str
    out: str
    command: str  # tune's own command line, to resume with
    resume: bool = False
    plot: Optional[str] = None
    lead: Optional[Lead] = None  # the other nodes' tuners, in a job of nodes started on their own
    join_timeout: float = 300.0


def tune(job: TuneJob, clock: Clock = SystemClock()) -> int:
    history_path = os.path.join(job.log_dir, HISTORY)
    earlier = read_history(history_path) if job.resume else {}
    if not job.resume and os.path.exists(history_path):
        raise LaunchError(f"{job.log_dir} already holds a tuning history ({HISTORY}); add --resume to go on from it, "
                          "or give another --log_dir.")
    os.makedirs(job.log_dir, exist_ok=True)
    search, done = Search(job.space.points(), job.space.repeats, job.space.search == "every"), []
    number = max([r[0] for rs in earlier.values() for r in rs] + _folders(job.log_dir), default=0)
    before = {sig: signal.signal(sig, _interrupted) for sig in STOPPING}
    over = "the leading tuner stopped on an error"  # what the other nodes' tuners are told, unless said below
    try:
        if job.lead is not None:
            _say(f"tune: waiting for the other {job.lead.nodes.followers} node(s)' tuners at {job.lead.where}")
            job.lead.gather(job.join_timeout)
        while (point := search.next()) is not None:
            if earlier.get(point):
                n, result = earlier[point].pop(0)
                _say(tune_lines.trial_line(n, result, job.space.metric) + " (measured before)")
            else:
                number += 1
                n, result = number, _trial(job, number, point, clock)
                _keep(history_path, n, result)
                _say(tune_lines.trial_line(n, result, job.space.metric))
            search.record(result)
            done.append(result)
            if point == DEFAULTS and result.rate is None and result.why.startswith(NOTHING):
                raise TrialsFailed(f"{result.why} (the trial's own output: "  # no trial of it can be measured
                                   f"{os.path.join(job.log_dir, f'trial-{n}', trials.OUTPUT)}).")
        code = _finish(job, search, done)
        over = None
        return code
    except LaunchError as e:
        over = str(e)
        raise
    except KeyboardInterrupt:
        over = "interrupted"
        _say(f"tune: interrupted; the {len(done)} trials measured are kept in {history_path}; resume with: "
             f"{_again(job)}")
        return 130
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if job.lead is not None:
            job.lead.close(over)


STOPPING = (signal.SIGTERM, signal.SIGHUP)  # as Ctrl-C: the running trial stopped, the history kept


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def _trial(job: TuneJob, number: int, point: tuple, clock: Clock) -> Result:
    folder = os.path.join(job.log_dir, f"trial-{number}")
    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, "trial.yaml")
    settings = tune_trial.config(job.base, job.space, point)
    if job.lead is not None:
        settings["job_id"] = job.lead.order(number, point)
    with open(config, "w") as f:
        f.write(tune_trial.to_yaml(settings, f"launcher tune, trial {number}: {label(point)}"))
    def progress(seconds, rate):
        console.draw(1, LIVE, tune_lines.progress_line(number, point, seconds, rate, job.space.metric).encode())

    waiting = job.lead.waiting(folder) if job.lead is not None else None
    try:
        why, rate = trials.run(config, folder, job.space, clock, progress, waiting)
    except PartFailed as e:  # another node's part failed (its own trial was stopped on the way out)
        why, rate = str(e), None
    finally:
        if job.lead is not None:
            job.lead.stop(number, waiting)
    return Result(point, rate, why)


def _finish(job: TuneJob, search: Search, done: list) -> int:
    best = search.best()
    if best is None:
        failures = search.failures()
        first = failures[0].why if failures else "no trial ran"
        raise TrialsFailed(f"every trial failed; the first: {first}.")
    standings = search.standings()
    defaults = next((s for s in standings if s.point == DEFAULTS), None)
    ratio = f", {best.rate / defaults.rate:.2f}x the program's own settings" if defaults and defaults.rate else ""
    script = job.base.get("training_script", "")
    command = f"python -m launcher --config {job.out} {script}".rstrip()
    header = (f"launcher tune: the best of {len(done)} trials ({os.path.join(job.log_dir, HISTORY)}): {label(best.point)}, "
              f"{tune_lines.rate_text(best.rate, best.spread, job.space.metric)} over {best.trials} trial(s){ratio}\n"
              f"run it with: {command}")
    lines = tune_lines.final_lines(standings, job.space.metric, command, job.out)
    try:
        _write(job.out, tune_trial.to_yaml(tune_trial.config(job.base, job.space, best.point), header))
    except OSError as e:
        for line in lines[:-1]:
            _say(line)
        raise NotKept(f"cannot write the best settings to {job.out} ({e.strerror}); every trial is kept in "
                      f"{os.path.join(job.log_dir, HISTORY)}; run {_again(job)} with another --out to write them "
                      "without running a trial again.") from None
    for line in lines:
        _say(line)
    if job.plot:
        try:
            tune_lines.plot(job.plot, done, job.space.metric)
        except OSError as e:
            raise NotKept(f"cannot draw the trials in {job.plot} ({e.strerror}); the best settings are kept in "
                          f"{job.out}.") from None
        _say(f"tune: the trials drawn in {job.plot}")
    return 0


def _write(path: str, text: str) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _again(job: TuneJob) -> str:
    """Tune's command line with --resume, which replays the trials measured instead of running them again."""
    return job.command if job.resume else job.command.replace(" tune ", " tune --resume ", 1)


LIVE = object()  # the owner of the live line, which each line of the tuner ends


def _say(line: str) -> None:
    console.write(1, (line + "\n").encode(), LIVE)


def _keep(path: str, number: int, result: Result) -> None:
    """The trial's result, a line of the history, written whole before the next trial starts."""
    with open(path, "a") as f:
        f.write(tune_history.line_of(number, result) + "\n")


def _folders(log_dir: str) -> list:
    """The numbers of the trial folders there (an interrupted trial's too: a new trial never writes into them)."""
    names = os.listdir(log_dir) if os.path.isdir(log_dir) else ()
    return [int(n[6:]) for n in names if n.startswith("trial-") and n[6:].isdigit()]


def read_history(path: str) -> dict:
    """The results of the history file by point: [(trial number, Result)], in the order measured."""
    out: dict = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return out
    except OSError as e:
        raise LaunchError(f"cannot read the tuning history {path} ({e.strerror}); check its permissions.") from None
    for line in lines:
        found = tune_history.entry(line)  # None: a line cut short by a kill, or not ours: that trial runs again
        if found is not None:
            out.setdefault(found[1].point, []).append(found)
    return out
