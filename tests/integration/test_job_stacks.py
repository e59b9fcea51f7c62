"""Stacks of a real hung gloo job, taken with py-spy: rank 0 waits in all_reduce, rank 1 sleeps before its own.

The two ranks are started directly (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), not through the launcher.
"""

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import WORKERS, assert_all_gone, free_ports
from launcher.run import stacks

HANG = WORKERS / "hang_allreduce.py"

needs_py_spy = pytest.mark.skipif(stacks.find_py_spy() is None, reason="py-spy is not installed")


def marked_line(marker):
    return next(i for i, line in enumerate(HANG.read_text().splitlines(), 1) if line.rstrip().endswith(marker))


@pytest.fixture
def hung_job():
    """{rank: pid} of a 2-rank gloo job, once both ranks have the process group."""
    port = free_ports(1)
    procs = []
    try:
        for rank in range(2):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                   "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen([sys.executable, "-u", str(HANG), "--limit", "120"], env=env,
                                          stdout=subprocess.PIPE, start_new_session=True))
        deadline = time.monotonic() + 60
        for p in procs:
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready and p.stdout.readline() == b"ready\n", "the gloo job did not start"
        yield {rank: p.pid for rank, p in enumerate(procs)}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
            p.stdout.close()
        assert_all_gone([p.pid for p in procs])


@needs_py_spy
def test_the_stacks_of_a_hung_job_show_where_each_rank_was(hung_job):
    sleep_line, reduce_line = marked_line("# SLEEP"), marked_line("# ALLREDUCE")
    deadline = time.monotonic() + 20  # rank 0 may be between "ready" and the call
    while True:
        started = time.monotonic()
        taken = stacks.take(hung_job)
        took = time.monotonic() - started
        if "all_reduce" in (taken[0].where or "") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print(f"py-spy on 2 ranks: {took * 1000:.0f} ms")
    assert [(s.rank, s.pid, s.note) for s in taken] == [(0, hung_job[0], None), (1, hung_job[1], None)]
    assert taken[0].where == f"all_reduce (hang_allreduce.py:{reduce_line})"
    assert taken[1].where == f"step (hang_allreduce.py:{sleep_line})"
    assert "torch/distributed/distributed_c10d.py" in taken[0].text  # the full dump, with full file names
    for s in taken:
        assert os.path.exists(f"/proc/{s.pid}"), "taking a stack leaves the worker running"


@needs_py_spy
def test_a_worker_that_is_gone_gives_a_note_not_an_exception():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid names no process
    (stack,) = stacks.take({5: proc.pid})
    assert stack == stacks.Stack(5, proc.pid, None, "the process had already exited", None)


def test_without_py_spy_each_rank_gets_the_install_note(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(stacks.sys, "executable", "/nonexistent/bin/python")  # nor next to the interpreter
    assert stacks.find_py_spy() is None
    taken = stacks.take({0: os.getpid(), 1: os.getppid()})
    assert [(s.rank, s.text, s.note) for s in taken] == [(0, None, "py-spy is not installed: pip install py-spy"),
                                                         (1, None, "py-spy is not installed: pip install py-spy")]


@needs_py_spy
def test_with_dump_stacks_a_worker_that_lets_sigterm_pass_is_shown_before_its_sigkill(tmp_path):
    """stubborn.py: rank 1 exits 3, rank 0 ignores SIGTERM and sleeps: its stack is taken at the stop, and again when
    the grace has run out, just before SIGKILL."""
    from conftest import run_launcher

    stubborn = WORKERS / "stubborn.py"
    sleep_line = next(i for i, line in enumerate(stubborn.read_text().splitlines(), 1) if "time.sleep(60)" in line)
    r = run_launcher("--nproc_per_node", 2, "--dump_stacks", "true", "--shutdown_timeout", 2, stubborn, tmp_path,
                     timeout=120)
    assert r.returncode == 3, r.stderr
    err = r.stderr
    killed = err.index("after the stop began: sending SIGKILL")
    assert err.count(f"rank 0 (pid ") >= 2 and f"<module> (stubborn.py:{sleep_line})" in err[killed:], err
