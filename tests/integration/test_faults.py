"""The supervisor under faults: recycled pids, zombies, escapers, a dead watchdog, signals during
cleanup, the stop sequence, resource limits, and rank 0's reserved port."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid

import psutil
import pytest

from conftest import (PROBE, REPO, WORKERS, assert_all_gone, pids_of, read_dumps, read_until, release_stubborn,
                      start_launcher, start_stubborn, wait_for)
from launcher.run import processes

ROOT = os.geteuid() == 0


def _cgroup_available() -> bool:
    group = processes.JobCgroup.create(uuid.uuid4().hex[:8], {})
    if group is None:
        return False
    group.remove()
    return True


CGROUP = _cgroup_available()
needs_pidns = pytest.mark.skipif(not (ROOT and shutil.which("unshare")), reason="needs root and unshare for a pid namespace")


# ---------------------------------------------------------------- never touch what is not ours


@needs_pidns
@pytest.mark.parametrize("mode", ["term", "kill9"])
@pytest.mark.parametrize("containment", ["cgroup", "sweep"])
def test_a_recycled_worker_pid_is_never_signalled(tmp_path, mode, containment):
    if containment == "cgroup" and not CGROUP:
        pytest.skip("no writable cgroup v2 with cgroup.kill here")
    env = {**os.environ, processes.NO_CGROUP_VAR: "1" if containment == "sweep" else "0"}
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(WORKERS / "pidns_driver.py"),
           mode, str(tmp_path), PROBE, "--shutdown_timeout", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=180)
    if "pid_max" in r.stderr and r.returncode:
        pytest.skip(f"cannot set pid_max in a pid namespace here: {r.stderr.strip()[-200:]}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["victims"] > 100, result
    assert result["killed"] == [], f"unrelated processes were signalled: {result}\n{r.stderr}"
    if mode == "term":
        assert result["launcher"] == 128 + signal.SIGTERM
        # the exited worker's id stays held (not reaped) while the launcher may still signal its group
        assert not result["recycled"], result


def test_orphans_are_reaped_as_they_come_back(tmp_path):
    done = tmp_path / "done"
    launcher = start_launcher("--nproc_per_node", 1, str(WORKERS / "orphans.py"), 400, done)
    try:
        wait_for(done.exists, timeout=120, what="400 orphans")
        me = psutil.Process(launcher.pid)

        def zombies():
            return [c for c in me.children() if c.status() == psutil.STATUS_ZOMBIE]

        wait_for(lambda: len(zombies()) <= 2, timeout=10, what="the orphans to be reaped")
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signal.SIGTERM


def _marked(token: str) -> list:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if token in " ".join(p.info["cmdline"] or ()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup v2 with cgroup.kill (root, or a delegated cgroup)")
def test_escapers_do_not_outlive_a_launcher_killed_with_sigkill(tmp_path):
    token = f"escaper-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "done"
    launcher = start_launcher("--nproc_per_node", 1, "--shutdown_timeout", 1, str(WORKERS / "escapers.py"), token, done)
    try:
        wait_for(done.exists, timeout=30, what="the escapers")
        wait_for(lambda: len(_marked(token)) >= 2, timeout=10, what="both escapers to run")
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.communicate(timeout=10)
        wait_for(lambda: not _marked(token), timeout=15, what="every escaper to be gone")
    finally:
        for pid in _marked(token):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup v2 with cgroup.kill")
def test_escapers_are_stopped_when_the_job_ends(tmp_path):
    token = f"escaper-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "done"
    launcher = start_launcher("--nproc_per_node", 1, "--shutdown_timeout", 1, str(WORKERS / "escapers.py"), token, done)
    try:
        wait_for(done.exists, timeout=30, what="the escapers")
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + signal.SIGTERM
        wait_for(lambda: not _marked(token), timeout=5, what="every escaper to be gone")
    finally:
        for pid in _marked(token):
            os.kill(pid, signal.SIGKILL)


def _cgroup_of(pid) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read()


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup v2 with cgroup.kill")
def test_a_stop_that_needs_sigkill_spares_the_next_attempts_interpreters(tmp_path):
    """The spares wait outside the job's cgroup, so a stop's cgroup.kill does not reach them;
    woken, they enter it, as a fresh worker does."""
    launcher, spares = start_stubborn(tmp_path)
    outside = not any("launcher-" in _cgroup_of(p.pid) for p in spares)
    err = release_stubborn(launcher, tmp_path)
    assert outside
    assert launcher.returncode == 0, err
    assert "killed by SIGKILL" not in err
    assert all("/launcher-" in (tmp_path / f"cgroup.{rank}").read_text() for rank in (0, 1))


# ---------------------------------------------------------------- the watchdog


def _watchdog_of(launcher_pid: int) -> psutil.Process:
    def find():
        for c in psutil.Process(launcher_pid).children():
            if "launcher.run import watchdog" in " ".join(c.cmdline()):
                return c
        return None

    wait_for(lambda: find() is not None, what="the watchdog")
    return find()


def test_a_dead_watchdog_is_reported_and_the_job_keeps_its_code(tmp_path):
    launcher = start_launcher("--nproc_per_node", 2, PROBE, "--dump", tmp_path, "--fail-rank", 1,
                              "--code", 7, "--delay", 1.5, "--sleep", 60)
    read_dumps(tmp_path, 2)
    _watchdog_of(launcher.pid).kill()
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 7, err
    assert err.count("protection against kill -9 of the launcher is gone") == 1, err
    assert "rank 1 (local rank 1" in err and "Traceback" not in err
    assert_all_gone(pids_of(read_dumps(tmp_path, 2)), timeout=5)


# ---------------------------------------------------------------- signals


def test_second_signal_during_cleanup_of_leftovers_kills_at_once(tmp_path):
    # the workers finish; the setsid children they leave ignore nothing, but the grace is long:
    # the launcher waits in the leftover stage, and a second signal must end that at once
    launcher = start_launcher("--nproc_per_node", 2, "--shutdown_timeout", 60, PROBE, "--dump", tmp_path,
                              "--setsid-child", "--ignore-term", "--sleep", 0.5)
    dumps = read_dumps(tmp_path, 2)
    children = [c for d in dumps.values() for c in d["children"]]
    for c in children:  # the leftovers ignore SIGTERM (so the launcher must wait for the grace)
        os.kill(c, signal.SIGSTOP)
    read_until(launcher, "the workers left running")
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=45)  # ended within the grace (60 s): it did not wait for it
    assert "killing everything now" in err
    assert_all_gone(children, timeout=5)


def test_sigint_is_passed_on_then_sigterm_then_sigkill(tmp_path):
    launcher = start_launcher("--nproc_per_node", 2, "--shutdown_timeout", 4, str(WORKERS / "term_checkpoint.py"), tmp_path)
    wait_for(lambda: all((tmp_path / f"ready.{r}").exists() for r in (0, 1)), what="the workers")
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signal.SIGINT, err
    for rank in (0, 1):
        lines = (tmp_path / f"signals.{rank}").read_text().split()
        names = lines[0::2]
        assert names == ["SIGINT", "SIGTERM"], names
        assert (tmp_path / f"checkpoint.{rank}").read_text() == "saved"
    assert "sending SIGKILL" not in err


# ---------------------------------------------------------------- limits


@pytest.mark.skipif(not shutil.which("prlimit"), reason="needs prlimit")
def test_too_few_file_descriptors_is_refused_before_anything_starts(tmp_path):
    cmd = ["prlimit", "--nofile=100:100", sys.executable, "-m", "launcher", "--nproc_per_node", "64",
           PROBE, "--dump", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("launcher: error:")]
    assert len(errors) == 1 and "ulimit -n" in errors[0] and "Traceback" not in r.stderr
    assert not list(tmp_path.glob("env.*.json"))


@pytest.mark.skipif(not shutil.which("prlimit"), reason="needs prlimit")
def test_a_low_soft_fd_limit_is_raised_to_the_hard_one(tmp_path):
    cmd = ["prlimit", "--nofile=100:4096", sys.executable, "-m", "launcher", "--nproc_per_node", "64",
           PROBE, "--dump", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list(tmp_path.glob("env.*.json"))) == 64


# ---------------------------------------------------------------- rank 0's port


def test_rank_0_port_is_held_until_the_store_takes_it(tmp_path):
    launcher = start_launcher("--nproc_per_node", 2, PROBE, "--dump", tmp_path, "--sleep", 60)
    try:
        port = int(read_dumps(tmp_path, 2)[0]["env"]["MASTER_PORT"])
        with socket.socket() as s:  # anyone else's plain bind is refused...
            with pytest.raises(OSError):
                s.bind(("127.0.0.1", port))
        with socket.socket() as s:  # ...while a store (SO_REUSEADDR) may bind and listen
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            s.listen()
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=30)


# ---------------------------------------------------------------- a start that runs out of something

FORK_FAILS = """
import errno, subprocess, sys
from launcher.cli import main as cli
real, calls = subprocess.Popen, []
class Popen(real):
    def __init__(self, cmd, *a, **kw):
        if "-u" in cmd:  # a worker, not the watchdog
            calls.append(cmd)
            if len(calls) == 3:
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        super().__init__(cmd, *a, **kw)
subprocess.Popen = Popen
cli.main(sys.argv[1:])
"""


def test_a_worker_that_cannot_be_started_stops_the_others_with_code_1(tmp_path):
    cmd = [sys.executable, "-c", FORK_FAILS, "--nproc_per_node", "4", PROBE, "--dump", str(tmp_path), "--sleep", "60"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "could not start rank 2: Resource temporarily unavailable; stopping the 2 worker(s) already started" in r.stderr
    assert "Traceback" not in r.stderr
    wait_for(lambda: not _marked(str(tmp_path)), timeout=5, what="the started workers to be gone")
