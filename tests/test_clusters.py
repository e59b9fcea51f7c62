"""Cluster sources: each scheduler's environment, as recorded in real jobs, in; the nodes out."""

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import REPO
from launcher.plan.clusters import registry
from launcher.errors import LaunchError
from launcher.plan.hostlist import HostListError, expand
from launcher.output.reports import format_plan
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import make_plan

LO = (Interface("lo", "127.0.0.1", "255.0.0.0"),)
GPU4 = HostFacts(gpu_count=4, cpu_count=32, interfaces=LO, python="/usr/bin/python3", run_id="r", temp_dir="/tmp")
CPU = HostFacts(gpu_count=None, cpu_count=8, interfaces=LO, python="/usr/bin/python3", run_id="r", temp_dir="/tmp")


def plan(env, host=GPU4, **opts):
    opts.setdefault("training_script", "train.py")
    return make_plan(LaunchOptions(**opts), env, host, lambda ip, n: tuple(range(41000, 41000 + n)))


def refused(env, host=GPU4, **opts) -> str:
    with pytest.raises(LaunchError) as e:
        plan(env, host, **opts)
    message = str(e.value)
    assert "\n" not in message and len(message) < 400 and message.endswith("."), message
    return message


def test_registry_names_match_the_command_line_choices():
    from launcher.cli.table import ROW

    assert registry.names() == tuple(ROW["cluster_env"].click["type"].choices)
    assert list(registry.SOURCES) == ["cli", "torchrun", "paddlecloud", "kubeflow", "slurm", "volcano", "mpi", "lsf"]


# ---------------------------------------------------------------- the host list parser


@pytest.mark.parametrize("text,hosts", [
    ("gpu01", ["gpu01"]),
    ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
    ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]n[1]", ["rack1n1", "rack2n1"]),
    ("[1-2]x", ["1x", "2x"]),
    ("nid[00005]", ["nid00005"]),
    ("a,b , c", ["a", "b", "c"]),
    ("node[1,3,5-6].cluster.local", ["node1.cluster.local", "node3.cluster.local", "node5.cluster.local", "node6.cluster.local"]),
])
def test_host_lists_expand_as_scontrol_does(text, hosts):
    assert expand(text) == hosts


@pytest.mark.parametrize("text,reason", [
    ("", "it is empty"),
    ("gpu[01-04", "a bracket is never closed"),
    ("gpu]01", "a bracket closes without opening at character 4"),
    ("gpu[[1]]", "a bracket opens inside another at character 5"),
    ("a,,b", "it has an empty item"),
    ("a,", "it has an empty item"),
    ("gpu[04-01]", "the range 04-01 runs backwards"),
    ("gpu[a-b]", "[a-b] holds 'a-b', which is not a number or a range lo-hi"),
    ("gpu[]", "[] holds ''"),
    ("gpu[1-2-3]", "holds '1-2-3'"),
    ("gpu[1,,2]", "holds ''"),
    ("gpu[0-99999999]", "holds more than 1000000 numbers"),
    ("a[0-9999]b[0-9999]", "expands to more than 1000000 hosts"),
])
def test_malformed_host_lists_say_why(text, reason):
    with pytest.raises(HostListError) as e:
        expand(text)
    assert reason in str(e.value)


# ---------------------------------------------------------------- choosing the source


def test_nothing_found_is_one_node_from_the_command_line():
    p = plan({}, CPU)
    assert p.node_ips == ("127.0.0.1",) and p.cluster == "cli (--cluster_node_ips, --node_ip)"


def test_auto_order_explicit_nodes_first_then_paddlecloud_kubeflow_slurm_volcano_mpi_lsf():
    every = {**SLURM_STEP, **PADDLECLOUD, **TRAINJOB, **VOLCANO, "OMPI_COMM_WORLD_SIZE": "1", "LSB_JOBID": "7"}
    assert registry.choose(LaunchOptions("t.py", cluster_node_ips="127.0.0.1,127.0.0.2"), every)[0] == "cli"
    order = ["paddlecloud", "kubeflow", "slurm", "volcano", "mpi", "lsf"]
    env = dict(every)
    for name, drop in zip(order, [PADDLECLOUD, TRAINJOB, SLURM_STEP, VOLCANO, {"OMPI_COMM_WORLD_SIZE": 0}, {"LSB_JOBID": 0}]):
        assert registry.choose(LaunchOptions("t.py"), env) == (name, f"--cluster_env auto (found {registry.SOURCES[name].label})")
        env = {k: v for k, v in env.items() if k not in drop}
    assert registry.choose(LaunchOptions("t.py"), env) == ("cli", "--cluster_env auto")


def test_explicit_source_and_paddle_spelling():
    assert registry.choose(LaunchOptions("t.py", cluster_env="slurm"), {}) == ("slurm", "--cluster_env slurm")
    assert registry.choose(LaunchOptions("t.py", use_paddlecloud=True), {}) == ("paddlecloud", "--use_paddlecloud")
    assert "give only one of them" in refused({}, use_paddlecloud=True, cluster_env="slurm")
    assert "is not a cluster source; choose one of auto, cli, torchrun, paddlecloud" in refused({}, cluster_env="pbs")


def test_parameter_server_mode_takes_its_nodes_from_the_command_line_only():
    assert "--cluster_env slurm is not supported in parameter-server mode" in \
        refused(SLURM_STEP, CPU, cluster_env="slurm", server_num=1, worker_num=1)
    p = plan(SLURM_STEP, CPU, server_num=1, worker_num=1, started_port=7000)  # auto: the PS plan ignores SLURM
    assert p.parameter_server and p.node_ips == ("127.0.0.1",)


# ---------------------------------------------------------------- SLURM

# `srun -N2 --ntasks-per-node=1 --gpus-per-node=4 python -m launcher train.py`, on the second node
SLURM_STEP = {
    "SLURM_JOB_ID": "4711", "SLURM_JOBID": "4711", "SLURM_JOB_NAME": "train", "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_NODELIST": "gpu[01-02]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
    "SLURMD_NODENAME": "gpu02", "SLURM_STEP_GPUS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "SLURM_CLUSTER_NAME": "hpc", "SLURM_SUBMIT_DIR": "/home/u/run",
}
# `#SBATCH --nodes=6` then `srun -N5 --ntasks-per-node=1 ...` on node 4 of the step
SLURM_FIVE = {**SLURM_STEP, "SLURM_JOB_NODELIST": "gpu[01-04,07],cpu3", "SLURM_NODELIST": "gpu[01-04,07],cpu3",
              "SLURM_JOB_NUM_NODES": "6", "SLURM_STEP_NODELIST": "gpu[01-04,07]", "SLURM_STEP_NUM_NODES": "5",
              "SLURM_NNODES": "5", "SLURM_STEP_NUM_TASKS": "5", "SLURM_NODEID": "4", "SLURM_JOB_ID": "123456789"}
# The batch shell of `sbatch --nodes=2` running the launcher itself (no srun)
SBATCH_SHELL = {"SLURM_JOB_ID": "4712", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NODELIST": "gpu[01-02]",
                "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_CPUS_ON_NODE": "64"}


def test_slurm_two_nodes_second_node():
    p = plan(SLURM_STEP)
    assert p.node_ips == ("gpu01", "gpu02") and p.node_rank == 1
    assert p.ports == (24711, 24712, 24713, 24714)  # 20000 + 4711 % 20000, the same on every node
    assert [w.rank for w in p.workers] == [4, 5, 6, 7] and p.world_size == 8
    assert [w.gpu for w in p.workers] == ["0", "1", "2", "3"]  # CUDA_VISIBLE_DEVICES, as srun set it
    assert p.workers[0].env["MASTER_ADDR"] == "gpu01" and p.control.port == 24710
    assert p.control.job_id == "slurm-4711.0"
    assert p.cluster == "slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)"
    assert "  cluster: slurm (SLURM_STEP_NODELIST, SLURM_NODEID, SLURM_JOB_ID)" in format_plan(p).splitlines()


def test_slurm_step_on_part_of_the_allocation():
    p = plan(SLURM_FIVE)
    assert p.node_ips == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu07") and p.node_rank == 4
    assert p.ports[0] == 20000 + 123456789 % 20000


def test_slurm_started_port_wins_and_job_list_is_the_fallback():
    env = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"}
    p = plan(env, started_port=6170)
    assert p.ports == (6170, 6171, 6172, 6173) and p.cluster.startswith("slurm (SLURM_JOB_NODELIST,")


def test_slurm_gpus_from_the_step_when_cuda_visible_devices_is_unset():
    env = {k: v for k, v in SLURM_STEP.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = plan(env, HostFacts(gpu_count=8, cpu_count=32, interfaces=LO))
    assert [w.gpu for w in p.workers] == ["4", "5", "6", "7"] and "SLURM_STEP_GPUS" in p.cluster


def test_slurm_product_host_list():
    env = {**SLURM_STEP, "SLURM_STEP_NODELIST": "r[1-2]-n[3-4]", "SLURM_STEP_NUM_NODES": "4", "SLURM_NNODES": "4",
           "SLURM_STEP_NUM_TASKS": "4", "SLURM_NODEID": "2"}
    assert plan(env).node_ips[2] == "r2-n3"


def test_sbatch_shell_without_srun_is_one_node_with_a_hint():
    p = plan(SBATCH_SHELL)
    assert p.node_ips == ("127.0.0.1",) and p.cluster.startswith("cli")
    assert any("not in an srun step: only this node is used; start it with srun --ntasks-per-node=1" in n for n in p.notes)
    assert "SLURM_STEP_ID, which is not set; start the launcher with srun" in refused(SBATCH_SHELL, cluster_env="slurm")


@pytest.mark.parametrize("change,fragment", [
    ({"SLURM_STEP_NUM_TASKS": "16", "SLURM_NTASKS_PER_NODE": "8"},
     "SLURM_STEP_NUM_TASKS=16 on SLURM_STEP_NUM_NODES=2 starts several launchers per node; run srun with --ntasks-per-node=1"),
    ({"SLURM_STEP_NUM_TASKS": None, "SLURM_NTASKS_PER_NODE": "4"}, "SLURM_NTASKS_PER_NODE=4 starts several launchers per node"),
    ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES=3 disagrees with SLURM_STEP_NODELIST=gpu[01-02] (2 nodes)"),
    ({"SLURM_STEP_NODELIST": "gpu[01-02"}, "SLURM_STEP_NODELIST=gpu[01-02 is not a Slurm host list (a bracket is never closed)"),
    ({"SLURM_STEP_NODELIST": "gpu[01,01]"}, "SLURM_STEP_NODELIST=gpu[01,01] lists gpu01 twice"),
    ({"SLURM_STEP_NODELIST": "gpu_01,gpu02"}, "has a malformed host name 'gpu_01'"),
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is not a node of the 2 in SLURM_STEP_NODELIST"),
    ({"SLURM_NODEID": "one"}, "SLURM_NODEID=one is not a whole number"),
    ({"SLURM_JOB_ID": None}, "needs the variable SLURM_JOB_ID, which is not set"),
    ({"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None, "SLURM_NODELIST": None},
     "needs the variable SLURM_STEP_NODELIST, which is not set; start the launcher with srun --ntasks-per-node=1"),
])
def test_slurm_mistakes_are_named(change, fragment):
    env = {k: v for k, v in {**SLURM_STEP, **change}.items() if v is not None}
    message = refused(env)
    assert fragment in message and message.startswith("--cluster_env auto (found SLURM)")
    if "SLURM_NODEID" in change:  # an explicit choice is named as such
        assert refused(env, cluster_env="slurm").startswith("--cluster_env slurm: ")


# ---------------------------------------------------------------- Kubeflow and torchrun's PET_*

# Kubeflow Trainer v2 TrainJob (JobSet), node 1 of 3 (torch plugin: PET_* from the job's numNodes and numProcPerNode)
TRAINJOB = {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "mnist-node-0-0.mnist", "PET_MASTER_PORT": "29400", "JOB_COMPLETION_INDEX": "1",
            "PYTHONUNBUFFERED": "1", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
# training-operator v1 PyTorchJob, 1 master + 2 workers, on worker 1 (rank 2): no PET_* without an elasticPolicy
PYTORCHJOB = {"MASTER_ADDR": "bert-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
              "PYTHONUNBUFFERED": "0", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def test_trainjob_node_names_follow_the_jobset_pattern():
    p = plan(TRAINJOB, CPU)
    assert p.node_ips == ("mnist-node-0-0.mnist", "mnist-node-0-1.mnist", "mnist-node-0-2.mnist") and p.node_rank == 1
    assert len(p.workers) == 2 and p.world_size == 6  # PET_NPROC_PER_NODE
    assert p.ports == (29400, 29401) and p.workers[0].env["MASTER_PORT"] == "29400"
    assert p.cluster == "kubeflow (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)"


def test_nproc_option_wins_over_pet_nproc_per_node():
    assert len(plan(TRAINJOB, CPU, nproc_per_node=3).workers) == 3
    assert len(plan({**TRAINJOB, "PET_NPROC_PER_NODE": "auto"}, CPU).workers) == 2  # the launcher's own default


def test_pytorchjob_v1_is_taken_only_when_asked():
    assert plan(PYTORCHJOB, CPU).node_ips == ("127.0.0.1",)  # MASTER_ADDR and RANK alone: any torch worker has them
    p = plan(PYTORCHJOB, CPU, cluster_env="kubeflow")
    assert p.node_ips == ("bert-master-0", "bert-worker-0", "bert-worker-1") and p.node_rank == 2
    assert p.ports[0] == 23456 and p.cluster == "kubeflow (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT)"


def test_pytorchjob_with_pet_variables_and_a_domain():
    env = {**PYTORCHJOB, "PET_NNODES": "3", "PET_NODE_RANK": "0", "MASTER_ADDR": "bert-master-0.ns.svc"}
    assert plan(env, CPU).node_ips == ("bert-master-0.ns.svc", "bert-worker-0.ns.svc", "bert-worker-1.ns.svc")


def test_one_kubeflow_node_needs_no_names():
    p = plan({"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "10.1.2.3", "PET_MASTER_PORT": "29500"}, CPU)
    assert p.node_ips == ("127.0.0.1",) and p.control is None


@pytest.mark.parametrize("change,fragment", [
    ({"PET_NNODES": "1:4"}, "PET_NNODES=1:4 is an elastic range of nodes; this launcher runs a fixed number"),
    ({"PET_NNODES": "three"}, "PET_NNODES=three is not a number of nodes"),
    ({"PET_NODE_RANK": "3"}, "PET_NODE_RANK=3 is not a node of the 3 in PET_NNODES=3"),
    ({"PET_MASTER_ADDR": "10.0.0.5"}, "PET_MASTER_ADDR=10.0.0.5 is not the name of a PyTorchJob's master pod"),
    ({"PET_MASTER_PORT": None}, "needs the variable PET_MASTER_PORT, which is not set; run it in a PyTorchJob or TrainJob pod"),
    ({"PET_NODE_RANK": None}, "needs the variable PET_NODE_RANK, which is not set"),
])
def test_kubeflow_mistakes_are_named(change, fragment):
    env = {k: v for k, v in {**TRAINJOB, **change}.items() if v is not None}
    assert fragment in refused(env, CPU)


def test_elastic_pytorchjob_with_equal_bounds():
    # elasticPolicy minReplicas = maxReplicas = 2: PET_NNODES "2:2"; no master: the node rank must be given
    env = {"PET_NNODES": "2:2", "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_BACKEND": "c10d"}
    assert "needs the variable PET_NODE_RANK" in refused(env, CPU)


# ---------------------------------------------------------------- Volcano

# a Volcano job with one task "worker" of 3 pods (svc + env plugins), on pod 1
VOLCANO = {"VC_TASK_INDEX": "1", "VK_TASK_INDEX": "1", "VC_WORKER_HOSTS": "mnist-worker-0.mnist,mnist-worker-1.mnist,mnist-worker-2.mnist",
           "VC_WORKER_NUM": "3"}


def test_volcano_one_task():
    p = plan(VOLCANO, CPU)
    assert p.node_ips[1] == "mnist-worker-1.mnist" and p.node_rank == 1 and p.ports[0] == 6070
    assert p.cluster == "volcano (VC_TASK_INDEX, VC_WORKER_HOSTS)"
    assert plan({**VOLCANO, "MASTER_PORT": "23456"}, CPU).ports[0] == 23456
    legacy = {k: v for k, v in VOLCANO.items() if k != "VC_TASK_INDEX"}
    assert plan(legacy, CPU).node_rank == 1


def test_volcano_master_and_workers_this_pod_found_by_its_name():
    env = {"VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": "job-master-0.job", "VC_MASTER_NUM": "1",
           "VC_PS_WORKER_HOSTS": "job-ps-worker-0.job,job-ps-worker-1.job", "VC_PS_WORKER_NUM": "2"}
    host = HostFacts(gpu_count=None, cpu_count=8, interfaces=LO, hostname="job-ps-worker-0")
    p = plan(env, host)
    assert p.node_ips == ("job-master-0.job", "job-ps-worker-0.job", "job-ps-worker-1.job") and p.node_rank == 1
    assert "this machine (elsewhere) is not among the hosts of the Volcano job" in \
        refused(env, HostFacts(gpu_count=None, cpu_count=8, interfaces=LO, hostname="elsewhere"))


@pytest.mark.parametrize("change,fragment", [
    ({"VC_WORKER_NUM": "4"}, "VC_WORKER_NUM=4 disagrees with VC_WORKER_HOSTS="),
    ({"VC_TASK_INDEX": "3", "VK_TASK_INDEX": "3"}, "VC_TASK_INDEX=3 is not a node of the 3 in VC_WORKER_HOSTS"),
    ({"VC_WORKER_HOSTS": "a.job,,b.job", "VC_WORKER_NUM": "3"}, "has a malformed host name ''"),
])
def test_volcano_mistakes_are_named(change, fragment):
    assert fragment in refused({**VOLCANO, **change}, CPU)


def test_volcano_explicit_without_hosts():
    assert "needs the variable VC_<TASK>_HOSTS, which is not set; run it in a Volcano job with the svc and env plugins" in \
        refused({"VC_TASK_INDEX": "0"}, CPU, cluster_env="volcano")


# ---------------------------------------------------------------- MPI


@pytest.mark.parametrize("env,used", [
    ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, "OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK"),
    ({"PMI_SIZE": "1", "PMI_RANK": "0"}, "PMI_SIZE, PMI_RANK"),
    ({"MV2_COMM_WORLD_SIZE": "1", "MV2_COMM_WORLD_RANK": "0"}, "MV2_COMM_WORLD_SIZE, MV2_COMM_WORLD_RANK"),
])
def test_mpi_single_rank_is_one_node(env, used):
    p = plan(env, CPU)
    assert p.node_ips == ("127.0.0.1",) and p.ports == (41000, 41001) and p.cluster == f"mpi ({used})"


MPI2 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "10.0.0.1"}
GATHERED = replace(CPU, gathered_nodes=("10.0.0.1", "10.0.0.2"))


def test_mpi_ranks_are_nodes_of_the_gathered_list():
    p = plan(MPI2, GATHERED)
    assert p.node_ips == ("10.0.0.1", "10.0.0.2") and p.node_rank == 1 and p.ports == (6070, 6071)
    assert p.cluster == "mpi (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, MASTER_ADDR; node list gathered over port 6069)"
    assert "cluster: mpi (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, MASTER_ADDR; node list gathered over port 6069)" in format_plan(p)
    assert p.workers[0].env["MASTER_ADDR"] == "10.0.0.1" and p.workers[1].env["RANK"] == "3"
    assert p.control.port == 6069 and not p.notes


@pytest.mark.parametrize("opts,env,port,ports", [
    ({}, {}, 6069, (6070, 6071)),
    ({"started_port": 7000}, {}, 6999, (7000, 7001)),
    ({"started_port": 7000}, {"MASTER_PORT": "29500"}, 29500, (7000, 7001)),
    ({"control_port": 5000}, {"MASTER_PORT": "29500"}, 5000, (6070, 6071)),
    ({}, {"PMI_SIZE": "2", "PMI_RANK": "0", "OMPI_COMM_WORLD_SIZE": ""}, 6069, (6070, 6071)),
])
def test_mpi_gathering_port_and_spec(opts, env, port, ports):
    env = {**MPI2, **env}
    spec = registry.gathering(LaunchOptions("train.py", **opts), env)
    rank = 0 if "PMI_RANK" in env else 1
    assert (spec.rank, spec.size, spec.master, spec.port) == (rank, 2, "10.0.0.1", port)
    p = plan(env, GATHERED, **opts)
    assert p.ports == ports and p.cluster.endswith(f"gathered over port {port})") and p.node_rank == rank


def test_mpi_single_rank_and_other_sources_gather_nothing():
    assert registry.gathering(LaunchOptions("train.py"), {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}) is None
    assert registry.gathering(LaunchOptions("train.py"), {}) is None
    assert registry.gathering(LaunchOptions("train.py", cluster_node_ips="10.0.0.1,10.0.0.2", node_ip="10.0.0.1"), MPI2) is None


@pytest.mark.parametrize("env,host,fragment", [
    ({**MPI2, "MASTER_ADDR": ""}, GATHERED,
     "2 MPI ranks need node 0's address in MASTER_ADDR to gather the node list; run mpirun -x MASTER_ADDR=<address of the first host>."),
    ({**MPI2, "MASTER_ADDR": "bad host!"}, GATHERED, "MASTER_ADDR=bad host! is not an address or host name"),
    (MPI2, CPU, "OMPI_COMM_WORLD_SIZE=2, but 0 nodes were gathered; start every rank with the same mpirun"),
    (MPI2, replace(CPU, gathered_nodes=("10.0.0.1", "10.0.0.1")), "the gathered node list=10.0.0.1,10.0.0.1 lists 10.0.0.1 twice"),
    ({**MPI2, "MASTER_PORT": "x"}, GATHERED, "MASTER_PORT=x is not a whole number"),
    ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, CPU,
     "OMPI_COMM_WORLD_LOCAL_SIZE=2 starts several launchers per node; run mpirun with --map-by ppr:1:node"),
    ({"OMPI_COMM_WORLD_SIZE": "1"}, CPU, "needs the variable OMPI_COMM_WORLD_RANK, which is not set; start the launcher with mpirun"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "2"}, CPU, "OMPI_COMM_WORLD_RANK=2 is not a node of the 2"),
])
def test_mpi_mistakes_and_limits_are_named(env, host, fragment):
    assert fragment in refused(env, host)


@pytest.mark.parametrize("opts,env,fragment", [
    ({}, {**MPI2, "MASTER_ADDR": ""}, "run mpirun -x MASTER_ADDR=<address of the first host>."),
    ({"started_port": 1}, MPI2, "--started_port 1 minus one is not a port (1-65535) to gather the node list on; give one with --control_port."),
    ({}, {**MPI2, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "starts several launchers per node"),
])
def test_mpi_gathering_refusals_come_before_any_gathering(opts, env, fragment):
    with pytest.raises(LaunchError) as e:
        registry.gathering(LaunchOptions("train.py", **opts), env)
    assert fragment in str(e.value) and str(e.value).endswith(".")


def test_mpi_explicit_without_mpirun():
    assert "--cluster_env mpi needs the variable OMPI_COMM_WORLD_SIZE, which is not set" in refused({}, CPU, cluster_env="mpi")


# ---------------------------------------------------------------- LSF


def lsf_host(name):
    return HostFacts(gpu_count=None, cpu_count=8, interfaces=LO, hostname=name)


def test_lsf_launch_node_left_out_and_this_host_found_by_name():
    env = {"LSB_JOBID": "98765", "LSB_MCPU_HOSTS": "batch3 1 h41n01 42 h41n02 42"}
    p = plan(env, lsf_host("h41n02.summit.olcf.ornl.gov"))
    assert p.node_ips == ("h41n01", "h41n02") and p.node_rank == 1 and p.ports[0] == 20000 + 98765 % 20000
    assert any("leaving out batch3, the job's launch node" in n for n in p.notes)
    assert p.cluster == "lsf (LSB_MCPU_HOSTS, LSB_JOBID)" and p.control.job_id == "lsf-98765"


def test_lsf_ordinary_hosts_all_kept():
    env = {"LSB_JOBID": "5", "LSB_MCPU_HOSTS": "nodeA 4 nodeB 4"}
    p = plan(env, lsf_host("nodeA"))
    assert p.node_ips == ("nodeA", "nodeB") and p.node_rank == 0 and not p.notes


def test_lsf_rank_file_read_by_preflight_comes_first():
    text = "batch1\n" + "c01\n" * 4 + "c02\n" * 4
    env = {"LSB_JOBID": "5", "LSB_MCPU_HOSTS": "x 1", "LSB_DJOB_RANKFILE": "/tmp/lsf.rank"}
    host = HostFacts(gpu_count=None, cpu_count=8, interfaces=LO, hostname="c02", env_files=(("/tmp/lsf.rank", text),))
    p = plan(env, host)
    assert p.node_ips == ("c01", "c02") and p.node_rank == 1 and "LSB_DJOB_RANKFILE" in p.cluster


def test_preflight_reads_the_rank_file(tmp_path):
    from launcher.host import preflight

    path = tmp_path / "rank"
    path.write_text("c01\nc02\n")
    facts = preflight.probe_host({"LSB_DJOB_RANKFILE": str(path)})
    assert facts.env_files == ((str(path), "c01\nc02\n"),) and facts.hostname
    assert preflight.probe_host({}).env_files == ()


@pytest.mark.parametrize("env,hostname,fragment", [
    ({"LSB_MCPU_HOSTS": "h1 4 h2"}, "h1", "LSB_MCPU_HOSTS=h1 4 h2 is not pairs of a host and its slots"),
    ({"LSB_MCPU_HOSTS": "h1 4 h2 4"}, "login1", "this machine (login1) is not among the hosts of LSF job 5 (h1,h2)"),
    ({}, "h1", "needs the variable LSB_MCPU_HOSTS, which is not set; run it in an LSF job (bsub)"),
    ({"LSB_DJOB_RANKFILE": "/gone"}, "h1", "LSB_DJOB_RANKFILE=/gone cannot be read"),
    ({"LSB_JOBID": "x5", "LSB_MCPU_HOSTS": "h1 4"}, "h1", "LSB_JOBID=x5 is not a whole number"),
])
def test_lsf_mistakes_are_named(env, hostname, fragment):
    assert fragment in refused({"LSB_JOBID": "5", **env}, lsf_host(hostname))


# ---------------------------------------------------------------- PaddleCloud under auto

PADDLECLOUD = {"PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "POD_IP": "127.0.0.1", "PADDLE_TRAINER_ID": "0",
               "PADDLE_PORT": "35019", "TRAINER_PORTS_NUM": "2", "PADDLE_TRAINERS_NUM": "2"}


def test_paddlecloud_found_by_its_variables():
    p = plan(PADDLECLOUD, selected_gpus="0,1")
    assert p.ports == (35019, 35020) and p.world_size == 4
    assert p.cluster == "paddlecloud (PADDLE_TRAINERS, POD_IP, PADDLE_TRAINER_ID, PADDLE_PORT, TRAINER_PORTS_NUM)"
    assert plan({**PADDLECLOUD, "PADDLE_TRAINERS_NUM": "1"}).node_ips == ("127.0.0.1",)
    assert plan({k: v for k, v in PADDLECLOUD.items() if k != "PADDLE_TRAINERS_NUM"}).node_ips == ("127.0.0.1",)
    assert plan(PADDLECLOUD, selected_gpus="0,1", cluster_env="paddlecloud").ports == (35019, 35020)


def test_scheduler_nodes_replace_the_command_line_with_a_note():
    p = plan(SLURM_STEP, cluster_env="slurm", cluster_node_ips="10.0.0.1,10.0.0.2", node_ip="10.0.0.2")
    assert p.node_ips == ("gpu01", "gpu02")
    assert any("SLURM: using the nodes gpu01,gpu02 instead of --cluster_node_ips 10.0.0.1,10.0.0.2" in n for n in p.notes)
    assert any("SLURM: this is node 1 (gpu02), not --node_ip 10.0.0.2" in n for n in p.notes)


# ---------------------------------------------------------------- the command line: exit 2, one sentence


def test_missing_variable_exits_2_naming_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "OMPI_", "PMI_", "LSB_", "VC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", "launcher", "--cluster_env", "slurm", str(script)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--cluster_env slurm needs the variable SLURM_STEP_ID, which is not set; start the launcher with srun" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_command_line_offers_the_registry_sources_in_its_order():
    from launcher.cli.main import launch

    choice = next(p for p in launch.params if p.name == "cluster_env").type
    assert tuple(choice.choices) == registry.names() == ("auto", *registry.SOURCES)
    assert all(source.name == name for name, source in registry.SOURCES.items())
    assert registry.FILE_VARIABLES == ("LSB_DJOB_RANKFILE",)  # the rows' files, for preflight


def test_the_registry_is_cheap_to_import():
    # --help builds --cluster_env's choices from it: it loads the sources, not the model, the plan or the machine
    code = "import sys, launcher.plan.clusters.registry; print(' '.join(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    loaded = set(r.stdout.split())
    assert "launcher.plan.clusters.slurm" in loaded
    assert not loaded & {"launcher.plan.model", "launcher.plan.planner", "launcher.plan.collective", "launcher.plan.ps",
                         "launcher.host.preflight", "psutil", "click", "yaml"}
