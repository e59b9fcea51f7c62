"""The state file: what the launcher of one node tells ``launcher status`` and ``launcher logs``.

``LOG_DIR/launcher.nodeN.json`` (N: the node's index, so that nodes sharing a log dir on NFS never
write the same file), rewritten whole (a temporary file, then a rename: a reader never sees half
of it) when the workers start, when any of them exits, between attempts and at the end. Only with
--log_dir. Keeping it never fails the job: a write that fails is one warning, then no more writes.

Whether the job still runs is not taken on the file's word: its launcher's pid must be alive and
have the start time recorded (a recycled pid has another). A file whose launcher is gone without
recording the end is a job that stopped (killed with -9, the machine rebooted).
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import suppress
from dataclasses import dataclass
from typing import Optional

from launcher.output.messages import log

VERSION = 1
PREFIX, SUFFIX = "launcher.node", ".json"


def path_for(log_dir: str, node: int) -> str:
    return os.path.join(log_dir, f"{PREFIX}{node}{SUFFIX}")


def is_state_file(name: str) -> bool:
    return is_node_file(name, PREFIX, SUFFIX)


def is_node_file(name: str, prefix: str, suffix: str) -> bool:
    """Whether ``name`` is PREFIX + a node's index + SUFFIX: one node's file of a log dir (also the report logs')."""
    return name.startswith(prefix) and name.endswith(suffix) and name[len(prefix):-len(suffix)].isdigit()


@dataclass(frozen=True)
class ProcessState:  # read back from a file (from_json), any field may be None: unknown
    label: str  # "rank 3", "server 0", "trainer 1"
    key: int  # the rank (in parameter-server mode only a key)
    pid: Optional[int]
    log: Optional[str]  # its log file's name in the log dir
    started: Optional[float]  # time.time()
    ended: Optional[float] = None
    returncode: Optional[int] = None  # negative: killed by that signal
    cpus: Optional[str] = None  # the CPUs it is bound to ("0-3,8"); None: not bound


@dataclass(frozen=True)
class NodeState:  # as ProcessState: read back, any field but processes may be None
    node: int
    node_ip: str
    nodes: int
    host: str
    run_id: str
    launcher_pid: int
    launcher_start: Optional[int]  # the launcher's start time in clock ticks since boot (/proc)
    attempt: int  # 0 for the first run; restarts so far
    max_restarts: int
    phase: str  # "running", "restarting" (between attempts), "ended"
    exit_code: Optional[int]  # the launcher's, once ended (None: ended by an error of its own)
    started: float
    updated: float
    processes: tuple = ()  # ProcessState
    console: Optional[str] = None  # what the console dropped unread, in a sentence (None: nothing)
    rounds: Optional[tuple] = None  # an elastic job: each round this node ran, in a line, the last ROUNDS_KEPT
    health: Optional[tuple] = None  # each node's last health checkup in a line, where this node judges them


def to_json(state: NodeState) -> bytes:
    """One line per process, so that a person can read it too (and ``asdict``'s deep copy is not paid)."""
    head = {"version": VERSION, **vars(state)}
    del head["processes"]
    procs = ",\n  ".join(json.dumps(vars(p)) for p in state.processes)
    return f'{json.dumps(head)[:-1]}, "processes": [\n  {procs}\n]}}\n'.encode()


def document(state: NodeState, status: str) -> dict:
    """A node's state as ``launcher status --json`` and the monitor's /status.json show it: the state file's fields,
    and what is known of its launcher (``launcher_status``)."""
    doc = {**vars(state), "status": status}
    doc["processes"] = [vars(p) for p in state.processes]
    doc["rounds"] = list(state.rounds) if state.rounds else None
    doc["health"] = list(state.health) if state.health else None
    return doc


def from_json(text: bytes) -> NodeState:
    """The state in ``text``; ValueError saying what is wrong with it. The file is untrusted: a
    value of the wrong type (``"attempt": "one"``, ``nan``, a time of 1e300) is None, shown as unknown."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} state file")
    missing = [name for name in NODE_FIELDS if name not in data]
    if missing:
        raise ValueError(f"a field is missing ({', '.join(missing)})")
    procs = data.get("processes")
    procs = procs if isinstance(procs, list) else []
    return NodeState(**_typed(data, NODE_FIELDS), **_typed(data, OPTIONAL_NODE_FIELDS),
                     processes=tuple(ProcessState(**_typed(p, PROCESS_FIELDS)) for p in procs))


ROUNDS_KEPT = 100


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _pid(v) -> bool:
    return _count(v) and 0 < v < 1 << 31


def _code(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(1 << 31) <= v < 1 << 31


def _time(v) -> bool:
    """A time.time() that time.localtime() can show: finite, from 1970 to the year 5000 or so."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e11  # also false for nan


def _lines(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) <= ROUNDS_KEPT and all(_text(x) for x in v)


def _text(v) -> bool:
    return isinstance(v, str) and len(v) <= 1000 and v.isprintable()  # no escape sequence reaches the terminal


NODE_FIELDS = {"node": _count, "node_ip": _text, "nodes": _count, "host": _text, "run_id": _text,
               "launcher_pid": _pid, "launcher_start": _count, "attempt": _count, "max_restarts": _count,
               "phase": _text, "exit_code": _code, "started": _time, "updated": _time}
OPTIONAL_NODE_FIELDS = {"console": _text, "rounds": _lines, "health": _lines}  # a file without them is read as well
PROCESS_FIELDS = {"label": _text, "key": _count, "pid": _pid, "log": _text, "started": _time, "ended": _time,
                  "returncode": _code, "cpus": _text}


def _typed(data, checks: dict) -> dict:
    """Each field of ``checks`` from ``data``, None where it is missing or of the wrong type."""
    data = data if isinstance(data, dict) else {}
    return {name: data.get(name) if ok(data.get(name)) else None for name, ok in checks.items()}


class Writer:
    """Rewrites one state file atomically; never raises. The first failure is a warning, and
    the file is then left alone (the job matters more than its state file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.failed = False
        self.written = False

    def write(self, state: NodeState) -> None:
        if self.failed:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(to_json(state))
            os.replace(tmp, self.path)
            self.written = True
        except OSError as e:
            self.failed = True
            log.warning("cannot write the state file %s (%s): `launcher status` will not see this job; "
                        "the job goes on", self.path, e.strerror or e)
            with suppress(OSError):
                os.remove(tmp)


def this_host() -> str:
    return socket.gethostname()


def process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks since boot; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (IndexError, ValueError):
        return None


def launcher_status(state: NodeState, host: str) -> str:
    """"alive", "gone" (its launcher no longer runs: the job does not either), or "elsewhere"
    (another host's launcher, which cannot be checked from here)."""
    if state.host != host:
        return "elsewhere"
    started = process_start(state.launcher_pid)
    if started is None or (state.launcher_start is not None and started != state.launcher_start):
        return "gone"
    return "alive"
