"""--warm_start (launcher.run.warm): an elastic job's workers started before their launcher joins, each waiting in
launcher.runtime.elastic.run for its first round. What is promised, and tried here with real launchers, real torch
and gloo on 127.0.0.1: a joiner's first round runs in the very process it warmed (its imports and model made
before it joined), with the survivors' state; a program that does not wait in run is let go, saying why, and its
round starts it afresh; one that neither waits nor ends is ended after join_timeout; nothing warm outlives the
launcher; the option is refused (exit 2) where it cannot work. Every wait is bounded by an event."""

import json
import signal

import psutil
import pytest

from conftest import WORKERS, assert_refused_in_one_line, finish_all, free_ports, run_launcher, start_launcher, wait_for
from inprocess_job import EXAMPLE, WAIT
from test_elastic import stop_all
from test_inprocess import example_job

pytestmark = pytest.mark.real_torch

# as docs/elastic.md shows it: python -m launcher --nnodes=2:3 ... --warm_start examples/elastic_inprocess.py
WARM = "--warm_start"


def events_of(log_dir) -> list:
    return [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]


def test_a_warm_joiner_starts_its_round_in_the_process_it_warmed(tmp_path):
    job = example_job(tmp_path, 1)  # two nodes start the job at once; the third joins it running
    cold = job.line
    job.line = lambda node: (WARM, *cold(node)) if node == 2 else cold(node)
    try:
        job.start(2)
        job.wait_world([0, 1], 2)
        job.start(1)
        job.wait_world([0, 1, 2], 3, after=max(int(s["step"]) for s in job.steps(0)))
        warmed = [e for e in events_of(tmp_path / "node2") if e["event"] == "worker_started"]
        assert [e.get("warm") for e in warmed] == [True], warmed
        assert {int(s["pid"]) for s in job.steps(2)} == {warmed[0]["pid"]}, job.said()
        for n in (0, 1):
            assert len({int(s["pid"]) for s in job.steps(n)}) == 1, f"node {n} has new processes:\n{job.said()}"
        joined = [d for d in job.digests() if d["world"] == 3]
        assert len({d["rank"] for d in joined}) == 3 and len({d["digest"] for d in joined}) == 1, joined
    finally:
        stop_all(job.procs)
    said = job.procs[2].stderr.read()
    assert "1 worker(s) started warm: they wait for this node's first round" in said and "Traceback" not in said, said


@pytest.fixture
def free_endpoint():
    """A free port for a one-node job's rendezvous endpoint."""
    return free_ports(1)


def test_a_program_that_does_not_wait_in_run_is_started_with_its_round(tmp_path, free_endpoint):
    """two_streams.py reads RANK at once: warm, it ends (KeyError) and is let go; its round starts it afresh."""
    r = run_launcher("--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{free_endpoint}", "--rdzv-conf", "last_call_timeout=1", WARM,
                     "--log_dir", tmp_path / "logs", WORKERS / "two_streams.py", timeout=WAIT)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert f"rank {rank} not kept warm: it ended (exit code 1) before it waited in launcher.runtime.elastic.run; " \
               "it starts with its round" in r.stderr, r.stderr
        assert f"stdout of {rank}" in (tmp_path / "logs" / f"workerlog.{rank}").read_text()
    started = [e for e in events_of(tmp_path / "logs") if e["event"] == "worker_started"]
    assert len(started) == 2 and not any(e.get("warm") for e in started), started


def test_a_warm_worker_that_neither_waits_nor_ends_is_ended_after_join_timeout(tmp_path, free_endpoint):
    """A program that sleeps without RANK (as one blocked on a store would): ended after join_timeout, then run
    with its round; no warm process is left."""
    script = tmp_path / "sleepy.py"
    script.write_text("import os, time\n"
                      "if 'RANK' not in os.environ:\n"
                      "    open(os.path.join(os.path.dirname(__file__), f'warm.{os.getpid()}'), 'w').close()\n"
                      "    time.sleep(600)\n"
                      "print('ran as rank', os.environ['RANK'], flush=True)\n")
    r = run_launcher("--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{free_endpoint}", "--rdzv-conf", "last_call_timeout=1,join_timeout=3",
                     WARM, script, timeout=WAIT)
    assert r.returncode == 0, r.stderr
    assert "not kept warm: it did not wait in launcher.runtime.elastic.run within 3 s" in r.stderr, r.stderr
    assert "ran as rank 0" in r.stdout
    warmed = [int(p.name.split(".")[1]) for p in tmp_path.glob("warm.*")]
    assert len(warmed) == 1 and not psutil.pid_exists(warmed[0]), warmed


def test_warm_workers_end_with_a_launcher_stopped_before_its_round(tmp_path, free_endpoint):
    """A launcher that waits for a second node (MIN 2) with its worker warm, stopped by SIGTERM: no warm worker is left."""
    proc = start_launcher("--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                          f"--rdzv-endpoint=127.0.0.1:{free_endpoint}", WARM,
                          "--log_dir", tmp_path / "logs", EXAMPLE)
    try:
        wait_for(lambda: any("elastic_inprocess" in " ".join(c.cmdline()) for c in _children(proc.pid)), WAIT,
                 "the warm worker")
        warm = [c for c in _children(proc.pid) if "elastic_inprocess" in " ".join(c.cmdline())]
        proc.send_signal(signal.SIGTERM)
        finish_all([proc], timeout=WAIT)
        psutil.wait_procs(warm, timeout=WAIT)
        assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in warm), warm
    finally:
        stop_all([proc])


def _children(pid: int) -> list:
    try:
        return psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("args, sentence", [
    ((WARM,), "--warm_start starts the workers of an elastic job before it forms: give --nnodes MIN:MAX"),
    ((WARM, "--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--no_python"),
     "--warm_start runs each worker up to launcher.runtime.elastic.run, a Python call"),
])
def test_warm_start_is_refused_where_it_cannot_work(tmp_path, args, sentence):
    assert_refused_in_one_line(tmp_path, args, sentence)
