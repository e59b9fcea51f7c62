"""Stops a job's processes when its launcher dies without doing it (kill -9, OOM killer).

Started by the launcher as ``python watchdog.py RUN_ID GRACE`` in a session of its own, it reads
its standard input: ``pgid N`` lines name the workers' process groups, ``quit`` means the
launcher cleaned up itself. End of file without ``quit`` means the launcher is gone: then every
named process group and every process whose environment carries the job's run id gets SIGTERM,
and SIGKILL after GRACE seconds. Standalone on purpose (stdlib and psutil only), so that it
starts fast and works from any directory.
"""

import os
import signal
import sys
import time

RUN_ID_VAR = "LAUNCHER_RUN_ID"


def main(run_id: str, grace: float) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups = []
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            os._exit(0)  # the launcher waits for this exit: skip the interpreter's teardown
        if word == "pgid":
            groups.append(int(arg))
    stopped = sweep(groups, run_id, grace)
    if stopped:
        sys.stderr.write(f"launcher: watchdog: the launcher died; stopped {stopped} leftover process(es)\n")
    return 0


def sweep(groups, run_id: str, grace: float) -> int:
    targets = members(groups, run_id)
    signal_all(groups, targets, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(targets):
        time.sleep(0.05)
    signal_all(groups, members(groups, run_id), signal.SIGKILL)
    return len(targets)


def members(groups, run_id: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in groups or p.environ().get(RUN_ID_VAR) == run_id:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def signal_all(groups, procs, sig) -> None:
    for g in groups:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    for p in procs:
        try:
            p.send_signal(sig)
        except Exception:
            pass


def alive(procs) -> bool:
    import psutil

    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
