"""Runs as process 1 of a new pid namespace (``unshare --pid --fork --mount-proc``) with a small
pid_max, to prove that the launcher and its watchdog never signal a process that merely got a
worker's old process id.

    pidns_driver.py MODE DUMP_DIR PROBE [launcher args...]     MODE: term | kill9

Rank 1 exits 0 at once; rank 0 sleeps. Then the driver fills the pid space with victims: unrelated
``sleep`` processes, each the leader of its own session and group, so that any pid the kernel
hands out again belongs to a victim. Then the launcher is stopped (SIGTERM) or killed (SIGKILL,
the watchdog cleans up; the driver reaps what is reparented to it, as init does, and keeps making
victims meanwhile). Prints one JSON line: how many victims, which of them were killed, and
whether a victim got rank 1's old pid.
"""

import json
import os
import signal
import subprocess
import sys
import time

PID_MAX = 1000
MODE, DUMP, PROBE = sys.argv[1:4]
EXTRA = sys.argv[4:]


def victim() -> int:
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.execv("/bin/sleep", ["sleep", "300"])
    return pid


def make_victims(victims: dict, limit: int) -> None:
    for _ in range(limit):
        try:
            pid = victim()
        except OSError:  # the pid space is full
            return
        victims[pid] = True


def burn_low_pids() -> None:
    """After a wrap the kernel hands out pids from 300 up: start the job above that, so that its
    pids can come round again."""
    while True:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        if pid > 310:
            return


def reap_others(victims: dict, keep: set) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in victims:
            victims[pid] = False  # a victim died: only a stray signal kills a sleep 300


def wait_for(path: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {path}")


def main() -> None:
    with open("/proc/sys/kernel/pid_max", "w") as f:
        f.write(str(PID_MAX))
    burn_low_pids()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--print_config", "false", "--nproc_per_node", "2", *EXTRA,
         PROBE, "--dump", DUMP, "--fail-rank", "1", "--code", "0", "--sleep", "120"],
        stdout=subprocess.DEVNULL)
    rank1 = wait_for(os.path.join(DUMP, "env.1.json"), 60)["pid"]
    wait_for(os.path.join(DUMP, "env.0.json"), 60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _running(rank1):
        time.sleep(0.02)
    victims: dict = {}
    make_victims(victims, PID_MAX)
    if MODE == "term":
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(60)
    else:
        launcher.kill()
        launcher.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _watchdog_running():
            reap_others(victims, set())
            make_victims(victims, 50)
            time.sleep(0.01)
    time.sleep(0.2)
    reap_others(victims, set())
    killed = sorted(p for p, alive in victims.items() if not alive)
    print(json.dumps({"victims": len(victims), "killed": killed, "rank1": rank1,
                      "recycled": rank1 in victims, "launcher": launcher.returncode}))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _watchdog_running() -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"launcher.run import watchdog" in f.read():
                        return True
            except OSError:
                pass
    return False


if __name__ == "__main__":
    main()
