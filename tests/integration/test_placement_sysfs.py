"""The oracle for --numa-binding: torch's own torch/numa/binding.py and ours, side by side, on the fake trees of real
machines (tests/sysfs_trees.py) bind-mounted over the real /sys/devices/system, /sys/bus/pci/devices and /proc/driver
in a mount namespace of their own (root), so that both read exactly the files a real machine would show them.

Torch is patched only where it needs CUDA or the real affinity: the NUMA node of GPU i (read here from the PCI
device of the driver's i-th GPU in PCI order, -1 counted as 0 as torch does), the GPU count, and the allowed CPUs
(every CPU of the tree, or a scenario's own set). ``_get_logical_cpus_to_bind_to`` is called directly (its caller
checks for numactl). One process takes every tree in turn, so that torch is imported once."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import sysfs_trees as trees
from conftest import REPO

TARGETS = trees.MOUNTED

ORACLE = r'''
import json, os, subprocess, sys
import torch.numa.binding as b  # imported before the mounts: torch's start-up reads the real CPUs

from launcher.errors import LaunchError
from launcher.host.topology import read_topology
from launcher.plan.placement import NUMA_MODES, numa_cpus
from launcher.plan.topology import parse_cpu_list

TARGETS = %(targets)r


def torch_answer(mode, gpu):
    try:
        options = b.NumaOptions(affinity_mode=b.AffinityMode(mode))
        return sorted(b._get_logical_cpus_to_bind_to(gpu_index=gpu, numa_options=options))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def our_answer(mode, topology, gpu):
    try:
        return sorted(numa_cpus(mode, topology, [topology.gpus[gpu]], topology.gpus)[0][0])
    except LaunchError as e:
        return {"error": str(e)}


results = {}
for case in json.loads(sys.argv[1]):
    for target in TARGETS:
        subprocess.run(["mount", "--bind", os.path.join(case["tree"], target), "/" + target], check=True)
    addresses = sorted(os.listdir("/proc/driver/nvidia/gpus"))

    def node_of(*, gpu_index):
        with open(f"/sys/bus/pci/devices/{addresses[gpu_index]}/numa_node") as f:
            return max(int(f.read().strip()), 0)

    b._get_numa_node_index_for_gpu_index = node_of
    b._get_gpu_count = lambda: len(addresses)
    with open("/sys/devices/system/cpu/online") as f:
        every = parse_cpu_list(f.read())
    for name, allowed in case["scenarios"].items():
        allowed = parse_cpu_list(allowed) if allowed is not None else every
        b._get_allowed_cpu_indices_for_current_thread = lambda allowed=allowed: set(allowed)
        topology = read_topology(allowed=allowed)
        results[name] = {"cpus": len(topology.cpus), "gpus": len(addresses), "modes": {
            mode: [{"torch": torch_answer(mode, g), "ours": our_answer(mode, topology, g)} for g in range(len(addresses))]
            for mode in NUMA_MODES}}
    for target in reversed(TARGETS):
        subprocess.run(["umount", "/" + target], check=True)
print(json.dumps(results))
''' % {"targets": TARGETS}


pytestmark = pytest.mark.skipif(not trees.mounts_available(),
                                reason="mounting fake sysfs trees needs root and a mount namespace (unshare --mount)")


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Torch's and our CPUs for every scenario, mode and GPU, computed in one private mount namespace."""
    pytest.importorskip("torch.numa.binding")
    made = {name: write(tmp_path_factory.mktemp(name)) for name, write in trees.TREES.items() if name != "two_cpus"}
    made["vm_no_numa"] = trees.vm_one_gpu(tmp_path_factory.mktemp("vm_no_numa"), numa="none")
    made["vm_no_cache"] = trees.vm_one_gpu(tmp_path_factory.mktemp("vm_no_cache"))
    for i in range(8):
        shutil.rmtree(made["vm_no_cache"] / f"sys/devices/system/cpu/cpu{i}/cache")
    cases = [
        {"tree": str(made["dgx_h100"]), "scenarios": {"dgx_h100": None, "dgx_node0_only": "0-55,112-167"}},
        {"tree": str(made["epyc_nps2"]), "scenarios": {"epyc_nps2": None, "epyc_uneven": "1-63,65-127"}},
        {"tree": str(made["vm_one_gpu"]), "scenarios": {"vm_one_gpu": None}},
        {"tree": str(made["vm_no_numa"]), "scenarios": {"vm_no_numa": None}},
        {"tree": str(made["vm_no_cache"]), "scenarios": {"vm_no_cache": None}},
    ]
    script = tmp_path_factory.mktemp("oracle") / "oracle.py"
    script.write_text(ORACLE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, str(script), json.dumps(cases)],
                       capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario, cpus, gpus", [
    ("dgx_h100", 224, 8), ("epyc_nps2", 128, 4), ("epyc_uneven", 128, 4), ("vm_one_gpu", 8, 1)])
def test_ours_is_torchs_answer_for_every_gpu_and_mode(answers, scenario, cpus, gpus):
    found = answers[scenario]
    assert (found["cpus"], found["gpus"]) == (cpus, gpus)  # the tree, not this machine, was read
    for mode, per_gpu in found["modes"].items():
        for gpu, both in enumerate(per_gpu):
            assert isinstance(both["torch"], list) and both["torch"], (mode, gpu, both)
            assert both["ours"] == both["torch"], (scenario, mode, gpu)


def test_the_trees_tell_the_modes_apart(answers):
    """The trees are not too plain to test anything: each mode binds differently somewhere."""
    modes = answers["epyc_uneven"]["modes"]
    as_sets = {mode: [tuple(both["ours"]) for both in per_gpu] for mode, per_gpu in modes.items()}
    assert len({tuple(v) for v in as_sets.values()}) == 4
    assert len(modes["exclusive"][1]["ours"]) == 32 and len(modes["exclusive"][3]["ours"]) == 30  # 31 cores: 16, 15


def test_where_torch_fails_on_a_node_with_none_of_the_allowed_cpus(answers):
    """Only node 0's CPUs allowed: torch's socket mode fails for every GPU (min() of node 1's empty set), and its node
    mode gives node 1's GPUs no CPU at all (its caller then refuses); we bind node 0's GPUs and refuse node 1's."""
    modes = answers["dgx_node0_only"]["modes"]
    node0 = list(range(0, 56)) + list(range(112, 168))
    for gpu in range(4):
        assert modes["node"][gpu]["ours"] == modes["node"][gpu]["torch"] == node0
        assert "error" in modes["socket"][gpu]["torch"] and modes["socket"][gpu]["ours"] == node0
        assert modes["exclusive"][gpu]["ours"] == modes["exclusive"][gpu]["torch"]
    for gpu in range(4, 8):
        assert modes["node"][gpu]["torch"] == []
        for mode in modes:
            assert modes[mode][gpu]["ours"]["error"].startswith("NUMA node 1 (CPUs 56-111,168-223) has none of the")


def test_where_torch_fails_on_a_machine_without_numa_folders(answers):
    """No /sys/devices/system/node: torch cannot find node 0's CPUs; we take every CPU as node 0."""
    for per_gpu in answers["vm_no_numa"]["modes"].values():
        assert "error" in per_gpu[0]["torch"] and per_gpu[0]["ours"] == list(range(8))


def test_where_torch_fails_on_a_machine_without_cache_facts(answers):
    """No cpuN/cache folders: torch's core-complex cannot list them; we take each CPU as its own complex."""
    modes = answers["vm_no_cache"]["modes"]
    assert "error" in modes["core-complex"][0]["torch"] and modes["core-complex"][0]["ours"] == [0]
    for mode in ("node", "socket", "exclusive"):
        assert modes[mode][0]["ours"] == modes[mode][0]["torch"] == list(range(8))
