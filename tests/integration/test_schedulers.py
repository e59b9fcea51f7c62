"""Real schedulers on this machine: a one-node SLURM cluster (slurmctld, slurmd, munged started and
stopped here) and Open MPI's mpirun. Skipped when their programs are not installed. The two
``gloo_allreduce`` tests run real gloo workers; the others a group without torch (conftest.workers_without_torch)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, WORKERS, finish_all, ports_of_this_process

ALLREDUCE = str(WORKERS / "allreduce_dump.py")
pytestmark = pytest.mark.usefixtures("workers_without_torch")
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


def slurm_conf(folder, host: str, cpus: int, first_job: int) -> str:
    return f"""\
ClusterName=launchertest
FirstJobId={first_job}
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
    # the first job's derived ports in this test process's own slice, free: from slurmctld's own first id
    # (1 or 2), port 20002 was another test's, running beside it (the job then refused, exit 2, in CI)
    conf.write_text(slurm_conf(folder, host, os.cpu_count() or 1, job_port_range()))
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


@pytest.mark.real_torch
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
    low, high = ports_of_this_process()
    assert low < job_port < high  # the cluster's first job id (FirstJobId), picked in this process's share


def test_srun_two_tasks_per_node_is_refused(slurm_cluster, tmp_path):
    r = subprocess.run(["srun", "-N1", "--ntasks-per-node=2", "-t", "1", sys.executable, "-m", "launcher",
                        "--nproc_per_node", "1", ALLREDUCE, str(tmp_path)],
                       env=slurm_cluster, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2
    assert "starts several launchers per node; run srun with --ntasks-per-node=1" in r.stderr


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI (apt-get install openmpi-bin)")
@pytest.mark.real_torch
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


# ---------------------------------------------------------------- two nodes on loopback, from a scheduler's variables


def job_port_range() -> int:
    """A SLURM job id whose derived start port (20000 + id % 20000), its neighbour (the control
    port) and the next one are free on 127.0.0.1 and 127.0.0.2 right now, in this test process's
    own share of the ports (tests.conftest.ports_of_this_process), so that no test beside it picks them."""
    import random

    low, high = ports_of_this_process()
    for _ in range(200):
        port = random.randrange(low + 1, high - 2)
        socks = []
        try:
            for host in ("127.0.0.1", "127.0.0.2"):
                for p in (port - 1, port, port + 1):
                    s = socket.socket()
                    socks.append(s)
                    s.bind((host, p))
            return port - 20000
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip(f"no free port range in {low}-{high}")


def start_scheduled_node(env, out, name):
    cmd = [sys.executable, "-m", "launcher", "--nproc_per_node", "2", "--log_dir", str(out / f"log-{name}"),
           "--shutdown_timeout", "2", ALLREDUCE, str(out)]
    return subprocess.Popen(cmd, cwd=REPO, env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_two_nodes(envs, out):
    # node 1 first: rank 0's store listens on every address, which node 1's port check would call in use
    procs = [start_scheduled_node(envs[1], out, "1"), start_scheduled_node(envs[0], out, "0")]
    return [(code, err) for code, _, err in finish_all(procs, timeout=120)]


def slurm_node(job, rank):
    return {"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "127.0.0.[1-2]",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": str(rank)}


def test_two_slurm_nodes_on_loopback_agree_on_ports_without_options(tmp_path):
    job = job_port_range()
    for code, stderr in run_two_nodes([slurm_node(job, 0), slurm_node(job, 1)], tmp_path):
        assert code == 0, stderr
        assert "cluster: slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)" in stderr
    records = read_records(tmp_path, 4)
    assert [r["sum"] for r in records] == [10.0] * 4
    assert {r["env"]["MASTER_PORT"] for r in records} == {str(20000 + job)}
    assert records[3]["env"]["PADDLE_CURRENT_ENDPOINT"] == f"127.0.0.2:{20000 + job + 1}"


# An MPI job of two nodes on loopback: each rank picks its address from its rank (a wrapper), and
# OMPI_COMM_WORLD_LOCAL_SIZE is dropped, since both "nodes" are this machine.
MPI_NODE = ('unset OMPI_COMM_WORLD_LOCAL_SIZE; exec "$0" -m launcher --node_ip 127.0.0.$((OMPI_COMM_WORLD_RANK + 1)) '
            '--started_port "$1" --nproc_per_node 2 --shutdown_timeout 2 --join_timeout 20 "$2" "$3"')


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI (apt-get install openmpi-bin)")
def test_mpirun_two_ranks_gather_their_nodes_and_run_one_job(tmp_path):
    port = 20000 + job_port_range()
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "MASTER_ADDR=127.0.0.1",
                        "sh", "-c", MPI_NODE, sys.executable, str(port), ALLREDUCE, str(tmp_path)],
                       env=clean_env(), capture_output=True, text=True, timeout=90, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    table = f"cluster: mpi (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, MASTER_ADDR; node list gathered over port {port - 1})"
    assert r.stderr.count(table) == 2, r.stderr
    records = read_records(tmp_path, 4)
    assert [x["sum"] for x in records] == [10.0] * 4
    assert records[3]["env"]["PADDLE_TRAINER_ENDPOINTS"] == ",".join(f"127.0.0.{n}:{port + i}" for n in (1, 2) for i in (0, 1))
    assert {x["env"]["MASTER_ADDR"] for x in records} == {"127.0.0.1"}


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI (apt-get install openmpi-bin)")
def test_mpirun_two_ranks_without_master_addr_are_refused(tmp_path):
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        "sh", "-c", MPI_NODE, sys.executable, "7000", ALLREDUCE, str(tmp_path)],
                       env=clean_env(), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode != 0
    assert "run mpirun -x MASTER_ADDR=<address of the first host>." in r.stderr
