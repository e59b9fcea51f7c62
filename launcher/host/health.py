"""A node's look at itself before it takes part in a job: the facts it is compared with node 0's on, and its
own checks (``launcher.plan.health`` names them and judges the comparison).

Each check is cheap, as start-up is: a ``statvfs`` per folder, one bind per port, no process started but the user's
own ``--health_check`` (and, once, a workers' interpreter other than the launcher's, asked its versions). The GPUs'
and InfiniBand's checks are in ``launcher.host.gpu_health``, run only for GPU workers. A check that cannot run here
is SKIPPED, saying why; none raises.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import launcher
from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.host import files, preflight
from launcher.plan.devices import device_of
from launcher.plan.health import (CHECKS, DISK, FAILED, INFINIBAND, OK, PORTS, SHM, SKIPPED, USER, Checkup, Facts,
                                  Finding, HealthSettings, Subject, first_failure, sentence)
from launcher.plan.model import HostFacts, LaunchOptions, Plan

REASON_CHARS = 300  # of the user's check's last line: a reason, not a log
TAIL_BYTES = 1 << 16  # of the user's check's output, kept to find its last line
READ_AFTER_EXIT = 5.0  # seconds its output is read after its group is killed (a pipe held elsewhere: no longer)
ASK_TIMEOUT = 30.0  # seconds another interpreter may take to say its versions


@dataclass(frozen=True)
class Places:
    """Where the probes look; tests point them at a fake tree, or at a full tmpfs."""

    shm: str = "/dev/shm"
    sys: str = "/sys"
    proc: str = "/proc"
    dev: str = "/dev"


PLACES = Places()


def checkup(settings: HealthSettings, subject: Subject, clock: Callable[[], float] = time.time,
            job_pids: Iterable[int] = (), places: Places = PLACES) -> Checkup:
    """This node's facts and what its own checks found (the checks that cannot run here are SKIPPED).
    ``job_pids``: the job's own processes (its workers), which may hold its ports and GPUs."""
    found = findings(settings, subject, job_pids, places)
    return Checkup(facts_of(subject, clock), found)


def facts_of(subject: Subject, clock: Callable[[], float] = time.time) -> Facts:
    """What this node is compared with node 0 on; the clock read last, as the hello leaves."""
    python, torch = interpreter_versions(subject.python)
    script = script_hash(subject.script)
    return Facts(python=python, launcher=launcher.__version__, torch=torch if subject.uses_torch else None,
                 script=script, clock=clock())


def findings(settings: HealthSettings, subject: Subject, job_pids: Iterable[int] = (),
             places: Places = PLACES) -> tuple:
    """What this node's own checks found, in the order of CHECKS (those compared with node 0's are not here)."""
    own = Own(frozenset((os.getpid(), *job_pids)))
    probes = {DISK: lambda: check_disk(subject, settings.disk_floor),
              SHM: lambda: check_shm(subject, settings, places.shm),
              PORTS: lambda: check_ports(subject, own),
              USER: lambda: run_user_check(settings.command, settings.timeout, subject.workdir)}
    with ExitStack() as stack:
        if subject.gpus:
            from launcher.host import gpu_health  # only for GPU workers: NVML is loaded there

            probes.update(gpu_health.probes(subject, own, places, stack))
        found = [_guarded(name, probe) for name, probe in probes.items() if settings.runs(name)]
    return tuple(sorted(found, key=lambda f: CHECKS.index(f.check)))


def _guarded(name: str, probe: Callable[[], Finding]) -> Finding:
    """A probe's finding; one that breaks on this machine is SKIPPED with its error, never a failure."""
    try:
        return probe()
    except Exception as e:  # a probe's bug or a machine's oddity must not keep a healthy node out
        return Finding(name, SKIPPED, f"the check could not run here ({type(e).__name__}: {e})")


def subject_of(plan: Plan, opts: LaunchOptions, host: HostFacts) -> Subject:
    """What this node's checks look at, from its plan: its log folder and working folder, its address and workers'
    ports, the GPUs they take (by the machine's ids; none where no GPU was detected and the ids are passed on as
    given), the script, the workers' interpreter and whether it finds torch."""
    gpus = () if plan.gpus_not_found else tuple(
        device_of(w.gpu, plan.base_env) for w in plan.workers if w.gpu is not None)
    python = None if opts.no_python or not plan.workers else plan.workers[0].cmd[0]
    script = None if opts.module or (opts.no_python and "/" not in opts.training_script) else opts.training_script
    return Subject(log_dir=plan.log_dir, workdir=host.cwd or ".", host=plan.node_ip, ports=tuple(plan.ports),
                   gpus=tuple(dict.fromkeys(gpus)), script=script, python=python,
                   uses_torch=python is not None and (python != host.python or "torch" in host.importable),
                   ib_hca=plan.base_env.get(ev.NCCL_IB_HCA))


# ---------------------------------------------------------------- folders


def check_disk(subject: Subject, floor: int) -> Finding:
    """Free space above ``floor`` in the log directory and the working directory."""
    for what, path in (("log directory", subject.log_dir), ("working directory", subject.workdir)):
        trouble = _short_of(path, floor, f"its {what}") if path is not None else None
        if trouble is not None:
            return Finding(DISK, *trouble)
    return Finding(DISK, OK)


def check_shm(subject: Subject, settings: HealthSettings, shm: str) -> Finding:
    """Free space in /dev/shm above the floor: the GPU workers' (NCCL's buffers), or the lower one of CPU workers."""
    if not os.path.isdir(shm):
        return Finding(SHM, SKIPPED, f"there is no {shm} here")
    floor = settings.shm_floor if subject.gpus else settings.shm_floor_cpu
    trouble = _short_of(shm, floor, "", f" for {'GPU' if subject.gpus else 'CPU'} workers")
    return Finding(SHM, *trouble) if trouble is not None else Finding(SHM, OK)


def _short_of(path: str, floor: int, what: str, whose: str = ""):
    """(FAILED or SKIPPED, reason) where the file system ``path`` would be on has less than ``floor`` bytes free for
    an unprivileged user, or cannot be looked at; None where it has enough, or is no disk."""
    found = nearest_existing(path)
    try:
        stat = os.statvfs(found)
    except OSError as e:
        return SKIPPED, f"{found} cannot be looked at ({e.strerror or e})"
    free = stat.f_bavail * stat.f_frsize
    if free >= floor or not stat.f_blocks:  # no blocks: /proc, /sys, not a disk (a log dir there is refused later)
        return None
    where = path if found == os.path.abspath(path) else f"{path} (on {found})"
    return FAILED, f"only {size(free)} is free in {what + ' ' if what else ''}{where}, below the floor of {size(floor)}" \
                   f"{whose}"


def nearest_existing(path: str) -> str:
    """``path``, or its nearest parent that exists (a log directory is created only when the job starts)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def size(n: int) -> str:
    """Bytes in words: 0 B, 12 MiB, 1.5 GiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------- ports


class Own:
    """Whether a process is the job's own: this launcher, the job's processes given, or any of the launcher's
    descendants (its workers, warm or running), looked up only when a process holds something."""

    def __init__(self, pids: frozenset) -> None:
        self.pids, self.descendants = pids, None

    def __call__(self, pid: int) -> bool:
        if pid in self.pids:
            return True
        if self.descendants is None:
            import psutil

            try:
                self.descendants = frozenset(p.pid for p in psutil.Process().children(recursive=True))
            except psutil.Error:
                self.descendants = frozenset()
        return pid in self.descendants


def check_ports(subject: Subject, own: Callable[[int], bool]) -> Finding:
    """The workers' ports free on the node's address; one held by this launcher or the job's own workers is theirs."""
    for port in subject.ports:
        error = preflight.port_taken(subject.host, port)
        if error is None:
            continue
        holder = preflight.port_holder(port)
        if holder is not None and own(holder[0]):
            continue
        who = f" by pid {holder[0]} ({holder[1]})" if holder else ""
        return Finding(PORTS, FAILED, f"port {port} of its workers on {subject.host} is already in use{who} "
                                      f"({error.strerror or error})")
    return Finding(PORTS, OK)


# ---------------------------------------------------------------- the user's own check


def run_user_check(command: Optional[str], timeout: float, workdir: str) -> Finding:
    """--health_check: ``command`` run by a shell in a session of its own, for at most ``timeout`` seconds; its whole
    process group is killed when it ends or times out (nothing of it outlives the check). Exit 0 is healthy, else
    the last line of its output (of which only the last TAIL_BYTES are kept) is the reason."""
    import subprocess
    import threading

    try:
        proc = subprocess.Popen(["/bin/sh", "-c", command or ""], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=workdir or None, start_new_session=True)
    except OSError as e:
        return Finding(USER, FAILED, f"--health_check could not start ({e.strerror or e})")
    tail = bytearray()
    reader = threading.Thread(target=_keep_tail, args=(proc.stdout, tail), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return Finding(USER, FAILED, f"--health_check did not end within {timeout:g} s (--health_check_timeout), and "
                                     "was stopped")
    finally:
        _kill_group(proc)
        reader.join(READ_AFTER_EXIT)
    if proc.returncode == 0:
        return Finding(USER, OK)
    how = (f"was killed by {_signal_name(-proc.returncode)}" if proc.returncode < 0
           else f"exited with {proc.returncode}")
    line = last_line(bytes(tail))
    return Finding(USER, FAILED, f"{line} (--health_check {how})" if line else f"--health_check {how}, saying nothing")


def _keep_tail(stream, tail: bytearray) -> None:
    """Reads ``stream`` to its end, keeping its last TAIL_BYTES in ``tail``."""
    with stream:
        for chunk in iter(lambda: stream.read1(TAIL_BYTES), b""):
            tail += chunk
            del tail[:-TAIL_BYTES]


def _kill_group(proc) -> None:
    """The check's whole process group killed (what it left running too), and the check reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def last_line(output: bytes) -> str:
    """The last line of ``output`` that is not blank, shortened to a reason's length."""
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 3] + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# ---------------------------------------------------------------- facts


@functools.lru_cache(maxsize=8)
def interpreter_versions(python: Optional[str]) -> tuple:
    """(Python version, installed torch version or None) of the workers' interpreter: the launcher's own at no cost,
    another asked once (its package metadata read, torch never imported)."""
    if python is None or python == sys.executable:
        return platform.python_version(), preflight.installed_version("torch")
    import subprocess

    ask = ("import platform\ntry:\n from importlib.metadata import version; t = version('torch')\n"
           "except Exception:\n t = ''\nprint(platform.python_version(), t)")
    try:
        out = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=ASK_TIMEOUT).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    if not out:
        return f"unknown ({python} did not say)", None
    return out[0], (out[1] if len(out) > 1 else None)


def script_hash(path: Optional[str]) -> Optional[str]:
    """The sha256 of the file at ``path``'s content; None for no path, or what is not a regular file to read."""
    if path is None:
        return None
    digest = hashlib.sha256()
    try:
        with files.open_regular(path) as f:  # a FIFO would block
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except (OSError, ValueError):  # files.NotReadable is a ValueError
        return None
    return digest.hexdigest()


def check_alone(settings: HealthSettings, subject: Subject, node: str) -> tuple:
    """A node with no other launcher to compare it with, before its workers start: its own checks, but InfiniBand's
    (its workers talk within the node); LaunchError with the first failure's sentence (``node``: how it is named),
    else the checks that could not run here."""
    found = findings(dataclasses.replace(settings, off=settings.off | {INFINIBAND}), subject)
    failed = first_failure(found)
    if failed is not None:
        raise LaunchError(sentence(node, failed))
    return tuple(f for f in found if f.state == SKIPPED)
