"""Where each worker was: the Python stacks of running workers, taken with py-spy.

``take`` runs ``py-spy dump`` on every worker at once, bounded by one deadline, and never
raises: a worker whose stack cannot be had gets a one-sentence note saying why. ``Stack.where``
names the library function the user's innermost frame was calling, and that frame's file and
line, e.g. ``all_reduce (train.py:42)``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Mapping, Optional

NOT_INSTALLED = "py-spy is not installed: pip install py-spy"
NOT_PERMITTED = ("py-spy may not trace the process (ptrace not permitted): it needs the workers' user and "
                 "`sysctl kernel.yama.ptrace_scope=0` (or root), and in a container CAP_SYS_PTRACE "
                 "(docker run --cap-add SYS_PTRACE)")
EXITED = "the process had already exited"
NOT_PYTHON = "py-spy found no Python interpreter in the process (not a Python program, or one still starting)"

_LAUNCHER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/")
_THREAD = re.compile(r'^Thread \S+ \([^)]*\)(?:: "(?P<name>.*)")?$')
_FRAME = re.compile(r"^\s+(?P<name>.+) \((?P<file>.+?)(?::(?P<line>\d+))?\)$")
_WRAPPERS = {"wrapper", "wrapped", "inner", "decorate_context", "fn", "func"}


@dataclass(frozen=True)
class Stack:
    rank: int
    pid: int
    text: Optional[str]  # py-spy's dump; None when there is none
    note: Optional[str]  # why there is no dump
    where: Optional[str]  # e.g. "all_reduce (train.py:42)"


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: Optional[int]


def take(workers: Mapping[int, int], timeout: float = 10.0) -> list[Stack]:
    """The stack of each worker (rank -> pid), by rank; py-spy runs on all at once, for at most ``timeout`` s."""
    exe = find_py_spy()
    if exe is None:
        return [Stack(rank, pid, None, NOT_INSTALLED, None) for rank, pid in sorted(workers.items())]
    deadline = time.monotonic() + timeout
    taken = _dump(exe, workers, deadline, timeout)
    # a dump read while the main thread was between two frames shows it with none: read those once more
    again = {s.rank: s.pid for s in taken if s.text is not None and s.where is None}
    if not again:
        return taken
    better = {s.rank: s for s in _dump(exe, again, deadline, timeout) if s.where is not None}
    return [better.get(s.rank, s) for s in taken]


def _dump(exe: str, workers: Mapping[int, int], deadline: float, timeout: float) -> list[Stack]:
    started = {rank: _start(exe, pid) for rank, pid in sorted(workers.items())}
    return [_finish(rank, workers[rank], run, deadline, timeout) for rank, run in started.items()]


def find_py_spy() -> Optional[str]:
    """py-spy on PATH, else next to this Python (a virtual environment that is not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def _start(exe: str, pid: int):
    """(Popen, stdout file, stderr file), or a note when py-spy is not run.

    The output goes to files, not pipes: a long dump never waits for a reader.
    """
    if not _running(pid):
        return EXITED
    files = []
    try:
        files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
        proc = subprocess.Popen([exe, "dump", "--full-filenames", "--pid", str(pid)], stdin=subprocess.DEVNULL,
                                stdout=files[0], stderr=files[1], start_new_session=True)
    except OSError as e:
        for f in files:
            f.close()
        return f"py-spy could not be started ({e.strerror or e})"
    return proc, files[0], files[1]


def _finish(rank: int, pid: int, run, deadline: float, timeout: float) -> Stack:
    if isinstance(run, str):
        return Stack(rank, pid, None, run, None)
    proc, out, err = run
    with out, err:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with suppress(OSError):  # py-spy runs in a session of its own: end it and anything it started
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            with suppress(OSError):  # py-spy stops the threads it reads; one killed halfway may leave the worker stopped
                os.kill(pid, signal.SIGCONT)
            return Stack(rank, pid, None, f"py-spy gave no stack within {timeout:g} s (the process may be stuck in the kernel)", None)
        text = _read(out)
        if proc.returncode == 0 and text.strip():
            return Stack(rank, pid, text, None, where(parse(text)))
        return Stack(rank, pid, None, _failure_note(pid, _read(err)), None)


def _failure_note(pid: int, stderr: str) -> str:
    if not _running(pid):
        return EXITED
    if "Permission Denied" in stderr or "Operation not permitted" in stderr or "os error 1)" in stderr:
        return NOT_PERMITTED
    if "Failed to find python version" in stderr or "python interpreter" in stderr.lower():
        return NOT_PYTHON
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("Error:")), lines[0] if lines else "no output")
    return f"py-spy failed: {first.removeprefix('Error:').strip()}"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X", b"")


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


# ---------------------------------------------------------------- reading a dump


def parse(text: str) -> list[tuple[str, list[Frame]]]:
    """The threads of a py-spy dump as (thread name, [Frame, innermost first])."""
    threads = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append((head.group("name") or "", []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            number = frame.group("line")
            threads[-1][1].append(Frame(frame.group("name"), frame.group("file"), int(number) if number else None))
    return threads


def where(threads: list[tuple[str, list[Frame]]]) -> Optional[str]:
    """One phrase for where the main thread was, as ``all_reduce (train.py:42)``.

    The user's innermost frame is the first not in a library (``is_library``); of the library frames
    above it, the innermost with a public name that is not a decorator's wrapper names the call
    (``all_reduce``, not its ``wrapper`` nor the ``_wait`` inside). No such call (the user's code
    is in C, such as ``time.sleep``): the user's function. No frame of the user's: the innermost one.
    """
    frames = next((f for name, f in threads if name == "MainThread"), None)
    if frames is None:
        frames = next((f for _, f in threads if f), None)
    if not frames:
        return None
    mine = next((i for i, f in enumerate(frames) if not is_library(f.file)), None)
    if mine is None:
        return _phrase(_short_name(frames[0].name), frames[0])
    called = [_short_name(f.name) for f in frames[:mine]]
    public = next((n for n in called if not n.startswith(("_", "<")) and n not in _WRAPPERS), None)
    return _phrase(public or _short_name(frames[mine].name), frames[mine])


def is_library(path: str) -> bool:
    """Whether a frame's file is Python's, an installed package's or the launcher's, not the user's."""
    return (path.startswith("<") or "/site-packages/" in path or "/dist-packages/" in path
            or bool(_STDLIB.search(path)) or path.startswith(_LAUNCHER_DIR))


def _short_name(name: str) -> str:
    """``_exception_logger.<locals>.wrapper`` -> ``wrapper``; ``Module.__call__`` -> ``__call__``."""
    return name.rsplit(".", 1)[-1]


def _phrase(name: str, frame: Frame) -> str:
    line = f":{frame.line}" if frame.line is not None else ""
    return f"{name} ({os.path.basename(frame.file)}{line})"
