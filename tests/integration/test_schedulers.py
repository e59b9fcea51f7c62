"""Real schedulers on this machine: a one-node SLURM cluster (slurmctld, slurmd, munged started and
stopped here) and Open MPI's mpirun. Skipped when their programs are not installed."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, WORKERS

ALLREDUCE = str(WORKERS / "allreduce_dump.py")
NEEDED_FOR_SLURM = ("slurmctld", "slurmd", "srun", "munged", "sinfo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    """The test's environment without any scheduler's variables, the repository importable."""
    prefixes = ("SLURM_", "PET_", "OMPI_", "PMI_", "PMIX_", "LSB_", "VC_", "VK_", "PADDLE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **extra}


def stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def slurm_conf(folder, host: str, cpus: int) -> str:
    return f"""\
ClusterName=launchertest
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SrunPortRange={free_port()}-{free_port()}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
"""


@pytest.fixture
def slurm_cluster(tmp_path):
    """slurmctld, slurmd and munged of a one-node cluster, in tmp_path; every daemon stopped after."""
    if os.geteuid() != 0 or not all(shutil.which(p) for p in NEEDED_FOR_SLURM):
        pytest.skip("needs root and SLURM (apt-get install slurm-wlm munge)")
    folder = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, host, os.cpu_count() or 1))
    env = clean_env(SLURM_CONF=str(conf))
    daemons = []
    try:
        daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={folder}/munge.sock", f"--key-file={key}",
             f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munge.seed"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(lambda: (folder / "munge.sock").exists(), 10, "munged")
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        daemons.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(lambda: _node_idle(env), 20, "slurmd to register", folder)
        yield env
    finally:
        for d in reversed(daemons):
            stop(d)


def _node_idle(env) -> bool:
    r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=10)
    return r.returncode == 0 and r.stdout.strip() in ("idle", "mix")


def _wait_for(check, seconds, what, folder=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    logs = ""
    if folder is not None:
        logs = " ".join((folder / n).read_text()[-600:] for n in ("slurmctld.log", "slurmd.log") if (folder / n).exists())
    pytest.fail(f"{what} not ready after {seconds} s {logs}")


def read_records(folder, count):
    return [json.loads((folder / f"allreduce.{r}.json").read_text()) for r in range(count)]


def test_srun_one_node_gloo_allreduce(slurm_cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run(["srun", "-N1", "--ntasks-per-node=1", "-t", "1", sys.executable, "-m", "launcher",
                        "--nproc_per_node", "2", ALLREDUCE, str(out)],
                       env=slurm_cluster, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cluster: slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)" in r.stderr
    records = read_records(out, 2)
    assert [x["sum"] for x in records] == [3.0, 3.0]
    job_port = int(records[0]["env"]["MASTER_PORT"])
    assert 20000 <= job_port < 40000


def test_srun_two_tasks_per_node_is_refused(slurm_cluster, tmp_path):
    r = subprocess.run(["srun", "-N1", "--ntasks-per-node=2", "-t", "1", sys.executable, "-m", "launcher",
                        "--nproc_per_node", "1", ALLREDUCE, str(tmp_path)],
                       env=slurm_cluster, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2
    assert "starts several launchers per node; run srun with --ntasks-per-node=1" in r.stderr


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI (apt-get install openmpi-bin)")
def test_mpirun_one_rank_gloo_allreduce(tmp_path):
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", sys.executable, "-m", "launcher",
                        "--nproc_per_node", "2", ALLREDUCE, str(tmp_path)],
                       env=clean_env(), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cluster: mpi (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK)" in r.stderr
    assert [x["sum"] for x in read_records(tmp_path, 2)] == [3.0, 3.0]


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI (apt-get install openmpi-bin)")
def test_mpirun_two_ranks_on_one_node_are_refused(tmp_path):
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, "-m", "launcher",
                        "--nproc_per_node", "1", ALLREDUCE, str(tmp_path)],
                       env=clean_env(), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode != 0
    assert "OMPI_COMM_WORLD_LOCAL_SIZE=2 starts several launchers per node; run mpirun with --map-by ppr:1:node" in r.stderr
