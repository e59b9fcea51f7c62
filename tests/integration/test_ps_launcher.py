"""Parameter-server jobs under ``python -m launcher --server_num S --worker_num T`` (CONTRACT section 10).

Skipped until the launcher has --server_num (the launcher side of parameter-server mode).
"""

import functools
import subprocess
import sys

import pytest
import torch

import psjob

SCRIPT = str(psjob.WORKERS / "ps_train.py")


@functools.lru_cache(maxsize=1)
def launcher_has_ps():
    r = subprocess.run([sys.executable, "-m", "launcher", "--help"], cwd=psjob.REPO, env=psjob.base_env(),
                       capture_output=True, text=True, timeout=60)
    return "--server_num" in r.stdout


pytestmark = pytest.mark.skipif(not launcher_has_ps(), reason="the launcher has no --server_num yet")


RPC_DEADLINE_S = 600  # far above launch()'s bound: a job that ended within it was not ended by a wait that timed out


def launch(tmp_path, *args, timeout=300):
    """The job to its end, bounded by ``timeout`` (a hang guard, below RPC_DEADLINE_S): (result, log folder)."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "launcher", "--server_num", "2", "--worker_num", "2", "--log_dir", str(logs),
           SCRIPT, str(tmp_path), *map(str, args)]
    env = dict(psjob.base_env(), FLAGS_rpc_deadline=str(RPC_DEADLINE_S * 1000))
    r = subprocess.run(cmd, cwd=psjob.REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return r, logs


def test_a_failing_trainer_stops_the_job_at_once_with_its_code(tmp_path):
    # the others (100,000 steps of 0.1 s) were stopped by the launcher: not waited for, nor ended by the RPC
    # deadline; how fast: bench/ps_teardown.py (with fake servers and trainers)
    r, logs = launch(tmp_path, "fleet", "async", "mlp", 100000, "sleep=0.1", "fail=trainer:1:3:7")
    assert r.returncode == 7, r.stdout + r.stderr
    assert "trainer 1 failed (exit code 7)" in r.stderr
    assert "trainer 1 fails with 7" in (logs / "workerlog.1").read_text()


def test_a_failing_server_stops_the_job_at_once_with_its_code(tmp_path):
    r, logs = launch(tmp_path, "fleet", "sync", "ctr", 100000, "sleep=0.1", "fail=server:1:5:9")  # as above
    assert r.returncode == 9, r.stdout + r.stderr
    assert "server 1 failed (exit code 9)" in r.stderr and f"log: {logs / 'serverlog.1'}" in r.stderr


@pytest.mark.training  # CI runs it after the quick loop
def test_the_ctr_example_runs_as_a_parameter_server_job(tmp_path):
    cmd = [sys.executable, "-m", "launcher", "--server_num", "2", "--worker_num", "2", "--log_dir", "logs",
           str(psjob.REPO / "examples" / "train_ctr_ps.py")]
    r = subprocess.run(cmd, cwd=tmp_path, env=psjob.base_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    state = torch.load(tmp_path / "output" / "model.pt")
    assert state["embedding.weight"].shape == (100_000, 16)
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir() if p.name.startswith(("serverlog", "workerlog"))) == \
        ["serverlog.0", "serverlog.1", "workerlog.0", "workerlog.1"]
    assert "step 150 loss" in (logs / "workerlog.0").read_text()
    assert "launcher: server 1 starts" in (logs / "serverlog.1").read_text()
    # the trainers' end ends the job: the servers return from run_server or are stopped, and it exits 0
    assert "all 4 process(es) finished" in r.stderr


DYING_SERVER = """\
import os, signal, sys, time
marker = os.path.join(sys.argv[1], "server-dying")
if os.environ["TRAINING_ROLE"] == "PSERVER":
    if os.environ["PADDLE_PSERVER_ID"] == "0":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # dying already: the stop's SIGTERM changes nothing
        open(marker, "w").close()  # its trainers see it gone at once...
        time.sleep(0.2)  # ...while its own exit takes a moment (a server's teardown)
        sys.exit(9)
    time.sleep(60)
else:
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.005)
    print("RuntimeError: process_vm_readv: the server is gone", flush=True)
    sys.exit(1)
"""


def test_a_server_that_dies_is_named_though_its_trainer_is_seen_failing_first(tmp_path):
    """The trainer's error is a consequence: the report and the exit code are the server's."""
    script = tmp_path / "dying_server.py"
    script.write_text(DYING_SERVER)
    args = ["--server_num", 1, "--worker_num", 1, "--log_dir", tmp_path / "logs", script, tmp_path]
    r = subprocess.run([sys.executable, "-m", "launcher", *map(str, args)], cwd=psjob.REPO, env=psjob.base_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 9, r.stderr
    assert "server 0 failed (exit code 9): the root cause; trainer 0 failed after it" in r.stderr
    assert f"log: {tmp_path / 'logs' / 'serverlog.0'}" in r.stderr
