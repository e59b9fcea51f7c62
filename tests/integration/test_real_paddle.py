"""Real PaddlePaddle programs, unchanged, under this launcher and under Paddle's own: the same exit code,
the same results, the same files.

Paddle 3.x (collective, DataParallel, fleet collective, fleet's roles in parameter-server mode) and Paddle
2.6.2, the last with a parameter-server runtime on CPU, each run from a virtual environment of its own
(tests/paddle_envs.py), made here when missing; either is skipped, saying why, where it cannot be made.
The programs of parameter-server jobs are test_real_paddle_ps.py's (a file of its own, which xdist runs beside
this one).
"""

import glob
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests import paddle_envs
from tests.conftest import REPO, free_ports

PROGRAMS = REPO / "tests" / "integration" / "paddle_programs"


def _paddle_python(env):
    try:
        return paddle_envs.make(env)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"cannot make the {env.name} environment in {env.folder}: {e}")


@pytest.fixture(scope="module")
def paddle3():
    """The Python of a virtual environment with paddlepaddle 3.3.1 (and this launcher's dependencies)."""
    return _paddle_python(paddle_envs.PADDLE3)


@pytest.fixture(scope="module")
def paddle26():
    """The Python of a virtual environment with paddlepaddle 2.6.2 (and this launcher's dependencies)."""
    return _paddle_python(paddle_envs.PADDLE26)


def _env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_", "TRAINING_ROLE", "POD_IP"))}
    env["PYTHONPATH"] = str(REPO)  # our launcher, also from the 2.6.2 environment
    return {**env, **(extra or {})}


def run_ours(python, args, out, timeout=300):
    cmd = [python, "-m", "launcher", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=out, timeout=timeout)


def run_paddles(python, args, out, timeout=300, until=None):
    """Paddle's own launcher; ``until(out)``: its job is done when this holds (Paddle's launcher never stops
    the servers of a parameter-server job), then it is stopped as a user would, with SIGTERM."""
    cmd = [python, "-m", "paddle.distributed.launch", "--log_dir", str(out / "paddle_log"), *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=out)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if until is not None and until(out):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.5)
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        _stop_all(proc, out)
    return subprocess.CompletedProcess(cmd, proc.returncode, output, "")


def _stop_all(proc, out):
    """Paddle's launcher leaves its servers behind when stopped: end every process of this test's folder."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    mine = [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or ())]
    for p in mine:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(mine, timeout=10)


def results(out, pattern, drop=()):
    """Every JSON result file of ``pattern`` in ``out``: name -> content (without the ``drop`` keys)."""
    found = {}
    for path in sorted(glob.glob(str(out / pattern))):
        data = json.loads(Path(path).read_text())
        found[Path(path).name] = {k: v for k, v in data.items() if k not in drop}
    return found


def folders(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "paddle"
    ours.mkdir()
    theirs.mkdir()
    return ours, theirs


# How a Paddle user starts 2 CPU workers on one node, with each launcher's command line
COLLECTIVE_CLIS = {
    "paddle-3": lambda: ["--nnodes", "1", "--ips", "127.0.0.1", "--start_port", free_ports(2), "--nproc_per_node", "2",
                         "--job_id", "real-paddle", "--log_level", "INFO"],
    "paddle-1.8": lambda: ["--cluster_node_ips", "127.0.0.1", "--node_ip", "127.0.0.1", "--started_port", free_ports(2),
                           "--nproc_per_node", "2"],
}
PADDLE_COLLECTIVE = ["--nproc_per_node", "2"]


@pytest.mark.parametrize("cli", sorted(COLLECTIVE_CLIS))
@pytest.mark.parametrize("program, pattern, count", [
    ("collective.py", "collective.*.json", 2),
    ("data_parallel.py", "dp.*.json", 2),
    ("fleet_collective.py", "fleet.*.json", 2),
])
def test_a_real_paddle_collective_program_gives_what_paddles_launcher_gives(paddle3, tmp_path, cli, program,
                                                                          pattern, count):
    ours, theirs = folders(tmp_path)
    script = PROGRAMS / program
    mine = run_ours(paddle3, [*COLLECTIVE_CLIS[cli](), script, ours], ours)
    assert mine.returncode == 0, mine.stderr[-3000:]
    got = results(ours, pattern)
    assert len(got) == count, (sorted(got), mine.stderr[-3000:])
    assert got == paddles_results(paddle3, script, theirs, pattern)


_PADDLES = {}  # program -> its results under Paddle's launcher, once per test run


def paddles_results(python, script, out, pattern):
    if script not in _PADDLES:
        paddles = run_paddles(python, [*PADDLE_COLLECTIVE, script, out], out)
        assert paddles.returncode == 0, paddles.stdout[-3000:]
        _PADDLES[script] = results(out, pattern)
    return _PADDLES[script]


def test_the_launcher_runs_a_paddle_job_where_torch_is_not_installed(paddle26, tmp_path):
    """The 2.6.2 environment has click, psutil, pyyaml and Paddle, no torch: what a Paddle user installs."""
    assert subprocess.run([paddle26, "-c", "import torch"], capture_output=True).returncode != 0
    done = run_ours(paddle26, ["--nproc_per_node", "1", "-m", "json.tool", "--help"], tmp_path, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr


def test_paddles_role_maker_reads_endpoints_too_long_for_the_environment(paddle3, tmp_path):
    """10,000 workers: PADDLE_TRAINER_ENDPOINTS passes 128 KiB, so the plan moves it to files; Paddle's own
    role maker must still see every endpoint (through PADDLE_BACKUP_ENV_PATH), not fall back to one worker."""
    from launcher.plan.model import HostFacts, LaunchOptions
    from launcher.plan.planner import make_plan

    ips = ",".join(["127.0.0.1"] + [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(1, 1250)])
    host = HostFacts(gpu_count=8, cpu_count=8, temp_dir=str(tmp_path), run_id="big")
    plan = make_plan(LaunchOptions("x.py", cluster_node_ips=ips, started_port=6070), {}, host)
    for path, text in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    code = ("from paddle.distributed import fleet\n"
            "role = fleet.PaddleCloudRoleMaker(is_collective=True)\nrole._generate_role()\n"
            "print(role._worker_num(), len(role._get_trainer_endpoints()), role._worker_index())")
    env = {**_env(), **plan.workers[3].env}
    assert "PADDLE_TRAINER_ENDPOINTS" not in env
    done = subprocess.run([paddle3, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["10000", "10000", "3"]
