"""Pinning processes of a job, and the job's cgroup, on real processes."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from launcher.run import processes
from launcher.run.watchdog import Watch


def sleeper(env=None, new_session=False):
    """A `sleep 60`, returned once it runs `sleep` (its environment is its own from then on)."""
    p = subprocess.Popen(["sleep", "60"], env=env, start_new_session=new_session)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            if f.read().startswith(b"sleep"):
                return p
        time.sleep(0.01)
    raise AssertionError("sleep did not start")


def test_a_process_carrying_the_run_id_is_pinned_and_signalled():
    p = sleeper(env={**os.environ, processes.RUN_ID_VAR: "job1"})
    try:
        pinned = processes.pin(p.pid, processes.Job("job1"))
        assert pinned is not None and pinned.running()
        pinned.send(signal.SIGTERM)
        assert p.wait(5) == -signal.SIGTERM
        assert not pinned.running()
        pinned.close()
    finally:
        p.kill()


def test_a_process_of_another_job_is_not_pinned():
    p = sleeper(env={**os.environ, processes.RUN_ID_VAR: "other"})
    try:
        assert processes.pin(p.pid, processes.Job("job1")) is None
    finally:
        p.kill()
        p.wait()


def test_a_process_group_counts_only_when_named():
    p = sleeper(new_session=True)
    try:
        assert processes.pin(p.pid, processes.Job("job1")) is None
        pinned = processes.pin(p.pid, processes.Job("job1", groups=frozenset({p.pid})))
        assert pinned is not None
        pinned.close()
    finally:
        p.kill()
        p.wait()


def test_a_zombie_is_not_running_and_an_exited_pid_is_not_pinned():
    p = sleeper(env={**os.environ, processes.RUN_ID_VAR: "job1"})
    pinned = processes.pin(p.pid, processes.Job("job1"))
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # a zombie now
    assert not pinned.running()
    p.wait()
    assert processes.pin(p.pid, processes.Job("job1")) is None
    pinned.close()


def test_the_excluded_and_this_process_are_never_members():
    job = processes.Job("job1", groups=frozenset({os.getpgid(0)}), exclude=frozenset())
    assert processes.pin(os.getpid(), job) is None


def _cgroup():
    group = processes.JobCgroup.create(uuid.uuid4().hex[:8], {})
    if group is None:
        pytest.skip("no writable cgroup v2 with cgroup.kill here")
    return group


def test_cgroup_members_are_found_and_killed_whole():
    group = _cgroup()
    fd = group.open_procs()
    try:
        p = subprocess.Popen(["sh", "-c", "setsid sleep 60 & exec sleep 60"], preexec_fn=lambda: os.write(fd, b"0"))
        time.sleep(0.3)
        assert len(group.pids()) == 2
        found = processes.members(processes.Job("none", cgroup=group))
        assert sorted(f.pid for f in found) == sorted(group.pids())
        processes.close_all(found)
        group.kill()
        assert p.wait(5) == -signal.SIGKILL
    finally:
        os.close(fd)
        deadline = time.monotonic() + 5
        while not group.remove() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not os.path.exists(group.path)


def test_no_cgroup_when_turned_off():
    assert processes.JobCgroup.create("x", {processes.NO_CGROUP_VAR: "1"}) is None


def test_cgroup_at_names_it_as_proc_shows_it():
    group = _cgroup()
    try:
        assert processes.JobCgroup.at(group.path) == group
    finally:
        group.remove()


# ---------------------------------------------------------------- the watchdog's sweep


def test_watchdog_sweep_stops_pinned_workers_and_run_id_carriers():
    worker = sleeper(new_session=True)
    carrier = sleeper(env={**os.environ, processes.RUN_ID_VAR: "job2"}, new_session=True)
    stranger = sleeper(new_session=True)
    try:
        watch = Watch("job2")
        assert watch.take(f"pid {worker.pid}\n")
        assert watch.take("junk line\n") and watch.take("pid notanumber\n")
        assert watch.take("quit\n") is False
        assert watch.sweep(grace=2) == 2
        assert worker.wait(5) == -signal.SIGTERM and carrier.wait(5) == -signal.SIGTERM
        assert stranger.poll() is None
    finally:
        for p in (worker, carrier, stranger):
            p.kill()
            p.wait()


def test_watchdog_kills_what_ignores_sigterm_after_the_grace():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"],
                                env={**os.environ, processes.RUN_ID_VAR: "job3"}, stdout=subprocess.PIPE)
    try:
        stubborn.stdout.readline()
        assert Watch("job3").sweep(grace=0.5) == 1
        # killed after the grace, not waited for: left alone it would sleep 60 s and exit 0 (120 s: a hang guard)
        assert stubborn.wait(120) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()


def test_watchdog_forgets_a_group_whose_leader_is_gone():
    leader = sleeper(new_session=True)
    watch = Watch("job4")
    watch.take(f"pid {leader.pid}")
    leader.kill()
    leader.wait()  # reaped: its id may now go to anyone
    assert leader.pid not in watch.job().groups


def test_watchdog_lets_go_of_the_pidfds_of_workers_that_ended():
    """A long job with many restarts: the watchdog holds a descriptor only for the workers that run."""
    watch = Watch("job5")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):  # twenty attempts of one worker each
        worker = sleeper(new_session=True)
        watch.take(f"pid {worker.pid}")
        worker.kill()
        worker.wait()
    survivor = sleeper(new_session=True)
    try:
        watch.take(f"pid {survivor.pid}")
        assert list(watch.leaders) == [survivor.pid]
        assert len(os.listdir("/proc/self/fd")) <= before + 1
    finally:
        survivor.kill()
        survivor.wait()
        watch.forget_ended()
