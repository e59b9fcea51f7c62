"""``launcher status``: each process of a job, its state, run time, restarts and last log line, read
from the job's log dir alone (its state files and logs); no worker is signalled or touched."""

from __future__ import annotations

import json
import os
import time

from launcher.errors import LaunchError
from launcher.host import files
from launcher.output import state_file as state
from launcher.output.reports import table
from launcher.plan.policy import describe_exit
from launcher.tools.log_dir import job_over, read_states

LAST_LINE_BYTES = 4096
LAST_LINE_WIDTH = 60
UNKNOWN = "?"  # a value the state file does not hold, or holds with the wrong type


def status(log_dir: str, as_json: bool = False) -> str:
    """The text of ``launcher status LOG_DIR`` (``as_json``: the document of ``--json``, {"nodes": [...]})."""
    states = read_states(log_dir)
    if not states:
        where = "the current folder" if log_dir == "." else log_dir
        raise LaunchError(f"no launcher state file (launcher.nodeN.json) in {where}: status needs the "
                          f"--log_dir of a job (python -m launcher status LOG_DIR; a job started without "
                          f"--log_dir keeps none).")
    host = state.this_host()
    liveness = [state.launcher_status(s, host) for s in states]
    if as_json:
        return json.dumps({"nodes": [state.document(s, alive) for s, alive in zip(states, liveness)]},
                          default=str, ensure_ascii=True) + "\n"
    tails = [[_tail(log_dir, p.log) for p in s.processes] for s in states]
    return format_status(states, liveness, tails, time.time())


def _tail(log_dir: str, name) -> str:
    """The last line of a process's log, read only from a file of ``log_dir`` itself."""
    if name is None:
        return ""
    path = files.inside(log_dir, name)
    return "(not in the log dir)" if path is None else last_line(path)


def format_status(states, liveness: list, tails: list, now: float) -> str:
    """Pure: one line per node, then a table of every process (``liveness`` and ``tails``: by
    state, then by process)."""
    lines = [line for s, alive in zip(states, liveness) for line in _node_lines(s, alive)]
    placed = any(p.cpus for s in states for p in s.processes)  # a column of CPUs where some worker is bound
    rows = [("node", "process", "pid", "state", "time", "restarts") + (("cpus",) if placed else ()) + ("last line",)]
    for s, alive, tail in zip(states, liveness, tails):
        running = not job_over(s, alive)
        for p, last in zip(s.processes, tail):
            cpus = (p.cpus or "any",) if placed else ()
            rows.append((_known(s.node), _known(p.label), "-" if p.pid is None else str(p.pid),
                         process_state(p, running), _run_time(p, s, now, running), _known(s.attempt)) + cpus + (last,))
    return "\n".join(lines + table(rows)) + "\n"


def _known(value) -> str:
    return UNKNOWN if value is None else str(value)


def _node_lines(s: state.NodeState, liveness: str) -> list:
    """The node's line, an elastic job's rounds, each node's health checks (where it judged them), and what its
    console dropped unread, if anything."""
    rounds = [f"  {line}" for line in [*(s.rounds or ()), *(s.health or ())]]
    return [_node_line(s, liveness)] + rounds + ([f"  console: {s.console}"] if s.console else [])


def _node_line(s: state.NodeState, liveness: str) -> str:
    where = f"launcher: node {_known(s.node)} of {_known(s.nodes)} ({_known(s.node_ip)})"
    attempt = f"attempt {_plus_one(s.attempt)} of {_plus_one(s.max_restarts)}"
    if s.phase == "ended":
        how = "with an error of the launcher" if s.exit_code is None else f"with exit code {s.exit_code}"
        return f"{where}: ended {how} at {_clock(s.updated)} ({attempt})"
    if liveness == "gone":
        return (f"{where}: not running any more: its launcher (pid {_known(s.launcher_pid)}) is gone without "
                f"recording the end; last update {_clock(s.updated)}")
    doing = "restarting" if s.phase == "restarting" else "running"
    if liveness == "elsewhere":
        return (f"{where}: {doing} at {_clock(s.updated)} (launcher pid {_known(s.launcher_pid)} on host "
                f"{_known(s.host)}, which cannot be checked from this host), {attempt}")
    return f"{where}: {doing}, launcher pid {s.launcher_pid}, {attempt}, since {_clock(s.started)}"


def _plus_one(n) -> str:
    return UNKNOWN if n is None else str(n + 1)


def process_state(p: state.ProcessState, running: bool) -> str:
    """"running", "exited N", "killed by SIGTERM", "stopped" (gone unrecorded), "not started"."""
    if p.returncode is not None:
        return f"exited {p.returncode}" if p.returncode >= 0 else describe_exit(p.returncode)
    if p.pid is None:
        return "not started"
    return "running" if running else "stopped"


def _run_time(p: state.ProcessState, s: state.NodeState, now: float, running: bool) -> str:
    end = p.ended if p.ended is not None else now if running else s.updated
    if p.started is None or end is None:
        return "-"
    seconds = max(0.0, end - p.started)
    if seconds < 100:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}"


def _clock(t) -> str:
    return UNKNOWN if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def last_line(path: str) -> str:
    """The last line of a log, shortened; "" when the current run has written nothing yet."""
    try:
        with files.open_regular(path) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - LAST_LINE_BYTES))
            data = f.read(LAST_LINE_BYTES)
    except (OSError, files.NotReadable):
        return "(no log)"
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    if not lines or lines[-1].startswith("===== "):
        return ""
    line = lines[-1].strip()
    return line if len(line) <= LAST_LINE_WIDTH else line[:LAST_LINE_WIDTH - 3] + "..."
