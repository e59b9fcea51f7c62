"""Workers placed on CPUs for real: each worker reads its own ``os.sched_getaffinity(0)`` and thread variables.

On this machine as it is (``--bind_cores_to_rank``, ``--bind_core_list``), and on the fake trees of tests/sysfs_trees.py
bind-mounted over /sys/devices/system, /sys/bus/pci/devices and /proc/driver in a mount namespace of their own (root),
so that the launcher reads a machine with GPUs on NUMA nodes (``--numa-binding``) while the kernel binds the workers to
this machine's real CPUs. The tree ``two_cpus`` puts this machine's CPU 0 on node 0 with GPU 0 and CPU 1 on node 1 with
GPU 1; the DGX H100's tree shows what a launcher allowed only CPUs 0-1 of its 224 makes of it.
"""

import json
import os
import subprocess
import sys

import pytest

import sysfs_trees as trees
from conftest import REPO

TARGETS = trees.MOUNTED
REPORT = r'''
import json, os, sys
name = os.path.join(sys.argv[1], "cpus.%s.json" % os.environ["RANK"])
with open(name + ".tmp", "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "gpu": os.environ.get("FLAGS_selected_gpus"),
               "omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS")}, f)
os.rename(name + ".tmp", name)
'''
THIS_MACHINE = sorted(os.sched_getaffinity(0))
two_cpus_here = pytest.mark.skipif(THIS_MACHINE[:2] != [0, 1], reason="needs CPUs 0 and 1 allowed")


fake_trees = pytest.mark.skipif(not trees.mounts_available(),
                                reason="mounting fake sysfs trees needs root and a mount namespace (unshare --mount)")


def launch(tmp_path, *args, tree=None, env=None, workers=None):
    """``python -m launcher ARGS report.py OUT`` (on ``tree``'s machine when given): (the run, each rank's report)."""
    script, out = tmp_path / "report.py", tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(REPORT)
    cmd = [sys.executable, "-m", "launcher", *map(str, args), str(script), str(out)]
    if tree is not None:
        mounts = " && ".join(f"mount --bind {tree}/{t} /{t}" for t in TARGETS)
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts + ' && exec "$@"', "sh", *cmd]
    full = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    r = subprocess.run(cmd, capture_output=True, text=True, env={**full, **(env or {})}, timeout=120, cwd=REPO)
    found = sorted(out.glob("cpus.*.json"), key=lambda p: int(p.name.split(".")[1]))
    return r, [json.loads(p.read_text()) for p in found]


@two_cpus_here
def test_each_worker_gets_a_core_of_its_own_and_threads_to_match(tmp_path):
    r, got = launch(tmp_path, "--bind_cores_to_rank", "--nproc_per_node", 2)
    assert r.returncode == 0, r.stderr
    assert [w["cpus"] for w in got] == [[0], [1]]
    assert [(w["omp"], w["mkl"]) for w in got] == [("1", "1"), ("1", "1")]
    assert "cpus" in r.stderr.splitlines()[3]  # the plan's table shows each worker's CPUs
    assert [line.split()[4] for line in r.stderr.splitlines()[4:6]] == ["0", "1"]


@two_cpus_here
def test_a_thread_count_the_user_set_is_kept(tmp_path):
    r, got = launch(tmp_path, "--bind_cores_to_rank", "--nproc_per_node", 2, env={"OMP_NUM_THREADS": "3"})
    assert r.returncode == 0, r.stderr
    assert [(w["cpus"], w["omp"], w["mkl"]) for w in got] == [([0], "3", None), ([1], "3", None)]  # MKL follows OMP
    r, got = launch(tmp_path / "mkl", "--bind_cores_to_rank", "--nproc_per_node", 1, env={"MKL_NUM_THREADS": "4"})
    assert r.returncode == 0, r.stderr
    assert (got[0]["omp"], got[0]["mkl"]) == ("2", "4")


@two_cpus_here
def test_a_core_list_chooses_the_cores_shared_out(tmp_path):
    r, got = launch(tmp_path, "--bind_core_list", "1", "--nproc_per_node", 1)
    assert r.returncode == 0, r.stderr
    assert got == [{"cpus": [1], "gpu": None, "omp": "1", "mkl": "1"}]


@two_cpus_here
def test_a_restarted_worker_is_bound_as_the_first_was(tmp_path):
    """A restart is a fresh start: the worker of attempt 2 (a spare started ahead, or a new process) has its CPUs."""
    flaky = tmp_path / "flaky.py"
    flaky.write_text("import os, sys\nif os.environ['RANK'] == '1' and os.environ.get('TORCHELASTIC_RESTART_COUNT') == '0':\n"
                     "    sys.exit(3)\nexec(open(sys.argv[1]).read())\n")
    (tmp_path / "out").mkdir()
    script = tmp_path / "report.py"
    script.write_text(REPORT.replace("sys.argv[1]", "sys.argv[2]"))
    r = subprocess.run([sys.executable, "-m", "launcher", "--bind_cores_to_rank", "--nproc_per_node", "2",
                        "--max_restarts", "1", str(flaky), str(script), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    got = [json.loads((tmp_path / "out" / f"cpus.{rank}.json").read_text()) for rank in (0, 1)]
    assert [w["cpus"] for w in got] == [[0], [1]]


@pytest.mark.parametrize("args, sentence", [
    (("--bind_cores_to_rank", "--nproc_per_node", len(THIS_MACHINE) + 1),
     f"--nproc_per_node {len(THIS_MACHINE) + 1} asks for more workers than the {len(THIS_MACHINE)} cores allowed here"),
    (("--bind_core_list", "4096", "--nproc_per_node", 1), "--bind_core_list names CPU 4096, which this launcher may not use"),
    (("--bind_core_list", "3-1"), "'3-1' is not a list of CPUs; give numbers below 65536 and ranges such as 0-3,8,10-11."),
    (("--bind_core_list", "0-4294967295"), "'0-4294967295' is not a list of CPUs; give numbers below 65536"),
    (("--bind_core_list", "65535", "--nproc_per_node", 1), "--bind_core_list names CPU 65535, which this launcher may not use"),
    (("--numa-binding", "node", "--nproc_per_node", 1), "the workers here are CPU workers; give them cores of their own "
                                                        "with --bind_cores_to_rank."),
    (("--numa-binding", "nodes"), "'nodes' is not one of 'node', 'socket', 'exclusive', 'core-complex'"),
    (("--numa-binding", "node", "--bind_cores_to_rank"), "--numa-binding node and --bind_cores_to_rank both choose the "
                                                         "workers' CPUs; give one of them."),
    (("--bind_cores_to_rank", "--server_num", 1, "--worker_num", 1), "in parameter-server mode leave them out"),
])
def test_a_placement_that_cannot_be_honoured_is_refused_before_anything_starts(tmp_path, args, sentence):
    r, got = launch(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert sentence in r.stderr and "Traceback" not in r.stderr
    assert got == []


@fake_trees
@two_cpus_here
@pytest.mark.parametrize("mode, cpus", [("node", [[0], [1]]), ("socket", [[0, 1], [0, 1]]), ("exclusive", [[0], [1]]),
                                        ("core-complex", [[0], [1]])])
def test_each_gpu_worker_is_bound_near_its_gpu(tmp_path, mode, cpus):
    """Both nodes of the tree are on one socket: socket binds to both."""
    tree = trees.two_cpus(tmp_path / "tree")
    r, got = launch(tmp_path, "--numa-binding", mode, tree=tree)
    assert r.returncode == 0, r.stderr
    assert [(w["gpu"], w["cpus"]) for w in got] == [("0", cpus[0]), ("1", cpus[1])]
    assert "gpu 0" in r.stderr and "Traceback" not in r.stderr


@fake_trees
@two_cpus_here
def test_the_visible_list_decides_which_gpu_a_worker_has(tmp_path):
    """CUDA_VISIBLE_DEVICES=1,0: worker 0's GPU is machine GPU 1, on node 1; by index or by UUID alike."""
    tree = trees.two_cpus(tmp_path / "tree")
    r, got = launch(tmp_path, "--numa-binding", "node", tree=tree, env={"CUDA_VISIBLE_DEVICES": "1,0"})
    assert r.returncode == 0, r.stderr
    assert [w["cpus"] for w in got] == [[1], [0]]
    uuids = ",".join(trees.gpu_uuid(pci) for pci, _ in reversed(trees.TWO_CPU_GPUS))
    r, got = launch(tmp_path / "uuid", "--numa-binding", "node", tree=tree, env={"CUDA_VISIBLE_DEVICES": uuids})
    assert r.returncode == 0, r.stderr
    assert [w["cpus"] for w in got] == [[1], [0]]


@fake_trees
@two_cpus_here
def test_a_gpu_with_no_numa_node_is_bound_to_node_0_with_a_warning(tmp_path):
    tree = trees.vm_one_gpu(tmp_path / "tree")
    r, got = launch(tmp_path, "--numa-binding", "node", tree=tree)
    assert r.returncode == 0, r.stderr
    assert "GPU 0 (0000:00:04.0) reports no NUMA node; its workers are bound to node 0's CPUs, as torch does." in r.stderr
    assert got[0]["cpus"] == THIS_MACHINE  # node 0 of the VM is CPUs 0-7: what is allowed of them here


@fake_trees
@two_cpus_here
def test_on_a_dgx_h100_a_launcher_allowed_two_cpus_binds_node_0s_gpus_and_refuses_node_1s(tmp_path):
    tree = trees.dgx_h100(tmp_path / "tree")
    r, got = launch(tmp_path, "--numa-binding", "node", "--selected_gpus", "0,1", tree=tree)
    assert r.returncode == 0, r.stderr
    assert [w["cpus"] for w in got] == [[0, 1], [0, 1]]  # node 0 is CPUs 0-55,112-167; 0 and 1 are allowed here
    r, got = launch(tmp_path / "all", "--numa-binding", "node", tree=tree)
    assert r.returncode == 2
    assert ("NUMA node 1 (CPUs 56-111,168-223) has none of the CPUs this launcher may use (0-1); run the launcher with "
            "those CPUs allowed, or leave out --numa-binding.") in r.stderr
    assert got == []
