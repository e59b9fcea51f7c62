"""The workers' CPU placement from sysfs: the topology read from fake trees of real machines (tests/sysfs_trees.py),
torchrun's four --numa-binding modes, DeepSpeed's --bind_cores_to_rank, the CPU lists and the GPUs' names.
tests/integration/test_placement_sysfs.py checks the modes against torch's own code."""

import os
import random
import shutil

import pytest

import sysfs_trees as trees
from launcher.errors import LaunchError
from launcher.host.topology import read_topology
from launcher.plan.placement import NUMA_MODES, core_cpus, numa_cpus, threads_for
from launcher.plan.topology import Cpu, Gpu, Topology, format_cpu_list, gpu_named, parse_cpu_list


def cpus(text):
    return parse_cpu_list(text)


@pytest.fixture(scope="module")
def tree_roots(tmp_path_factory):
    """Each machine's tree, written once for the module."""
    roots = {}
    for name, write in trees.TREES.items():
        roots[name] = write(tmp_path_factory.mktemp(name))
    roots["vm_no_numa"] = trees.vm_one_gpu(tmp_path_factory.mktemp("vm_no_numa"), numa="none")
    return roots


def machine(roots, name, allowed=None):
    root = roots[name]
    every = parse_cpu_list((root / "sys/devices/system/cpu/online").read_text())
    return read_topology(sys_root=str(root / "sys"), proc_root=str(root / "proc"),
                         allowed=every if allowed is None else allowed)


@pytest.fixture(scope="module")
def dgx(tree_roots):
    return machine(tree_roots, "dgx_h100")


@pytest.fixture(scope="module")
def epyc(tree_roots):
    return machine(tree_roots, "epyc_nps2")


def one(mode, topology, gpu, visible=None):
    """The CPUs of one worker on ``gpu`` (an index), every GPU of the machine visible unless told."""
    sets, _ = numa_cpus(mode, topology, [topology.gpus[gpu]], topology.gpus if visible is None else visible)
    return format_cpu_list(sets[0])


# ---- the CPU lists -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("0", {0}), ("", set()), ("\n", set()), ("5-5", {5}),
    ("0-1,1-2", {0, 1, 2}), (" 2, 4 \n", {2, 4}), ("56-111,168-223", set(range(56, 112)) | set(range(168, 224))),
])
def test_a_cpu_list_is_parsed(text, expected):
    assert parse_cpu_list(text) == frozenset(expected)


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", ",", "1 2", "0x3", "1-2-3", "0-10:2", "½"])
def test_a_malformed_cpu_list_is_refused(text):
    with pytest.raises(ValueError, match="malformed CPU list"):
        parse_cpu_list(text)


def test_a_cpu_list_is_written_sorted_with_ranges():
    assert format_cpu_list({11, 0, 3, 2, 1, 8, 10}) == "0-3,8,10-11"
    assert format_cpu_list([]) == ""
    assert format_cpu_list([7]) == "7"
    assert format_cpu_list([4, 5]) == "4-5"


def test_cpu_lists_round_trip():
    rng = random.Random(7)
    for _ in range(200):
        chosen = frozenset(rng.sample(range(300), rng.randint(0, 60)))
        assert parse_cpu_list(format_cpu_list(chosen)) == chosen
    for text in ("0-3,8,10-11", "0", "0-223", "1,3,5"):
        assert format_cpu_list(parse_cpu_list(text)) == text


# ---- reading the trees -------------------------------------------------------------------------------------------

def test_the_dgx_h100_as_read(dgx):
    assert len(dgx.cpus) == 224 and dgx.node_ids() == (0, 1)
    assert dgx.node_cpus(0) == cpus("0-55,112-167") and dgx.node_cpus(1) == cpus("56-111,168-223")
    assert dgx.cpu(112) == Cpu(index=112, core=0, package=0, cache=0)
    assert dgx.cpu(200) == Cpu(index=200, core=88, package=1, cache=56)
    assert [g.pci for g in dgx.gpus] == [pci for pci, _ in trees.DGX_H100_GPUS]
    assert [g.numa_node for g in dgx.gpus] == [0] * 4 + [1] * 4
    assert dgx.gpus[5].uuid == trees.gpu_uuid("0000:ab:00.0")
    assert dgx.gpus[5].local_cpus == cpus("56-111,168-223")


def test_the_epyc_core_complexes_as_read(epyc):
    assert epyc.cpu(9).cache == 8 and epyc.cpu(73).cache == 8 and epyc.cpu(73).core == 9
    assert [(g.index, g.pci, g.numa_node) for g in epyc.gpus] == [
        (0, "0000:01:00.0", 1), (1, "0000:41:00.0", 0), (2, "0000:81:00.0", 1), (3, "0000:c1:00.0", 0)]


def test_allowed_defaults_to_the_launchers_own_affinity(tree_roots):
    root = tree_roots["two_cpus"]
    topology = read_topology(sys_root=str(root / "sys"), proc_root=str(root / "proc"))
    assert topology.allowed == frozenset(os.sched_getaffinity(0))


def test_a_vm_without_any_numa_folder_is_one_node_0_of_every_cpu(tree_roots):
    vm = machine(tree_roots, "vm_no_numa")
    assert vm.nodes == ((0, cpus("0-7")),)
    assert vm.gpus[0].numa_node == -1 and vm.gpus[0].node == 0
    assert numa_cpus("node", vm, vm.gpus, vm.gpus)[0] == (cpus("0-7"),)


def test_missing_files_leave_plain_defaults(tmp_path):
    root = trees.vm_one_gpu(tmp_path)
    cpu_dir = root / "sys/devices/system/cpu"
    for i in range(8):
        shutil.rmtree(cpu_dir / f"cpu{i}")
    (root / "sys/bus/pci/devices/0000:00:04.0/numa_node").unlink()
    (root / "sys/bus/pci/devices/0000:00:04.0/local_cpulist").write_text("garbage\n")
    (root / "proc/driver/nvidia/gpus/0000:00:04.0/information").unlink()
    vm = read_topology(sys_root=str(root / "sys"), proc_root=str(root / "proc"), allowed=range(8))
    assert vm.cpu(5) == Cpu(index=5, core=5, package=0, cache=5)
    assert vm.gpus == (Gpu(index=0, pci="0000:00:04.0", numa_node=-1, uuid=None, local_cpus=frozenset()),)
    assert threads_for(cpus("0-7"), vm) == 8


def test_nodes_possible_but_absent_are_left_out(tmp_path):
    root = trees.write(tmp_path, trees.Machine(
        packages={0: 0, 1: 0}, siblings={0: [0], 1: [1]}, caches={}, nodes={0: {0}, 1: {1}},
        gpus=[("0000:3b:00.0", 1)], possible_nodes="0-3"))
    topology = read_topology(sys_root=str(root / "sys"), proc_root=str(root / "proc"), allowed={0, 1})
    assert topology.node_ids() == (0, 1)
    assert numa_cpus("socket", topology, topology.gpus, topology.gpus)[0] == (cpus("0-1"),)


def test_no_cpu_lists_at_all_fall_back_to_the_cpu_folders(tmp_path):
    root = trees.two_cpus(tmp_path)
    for name in ("online", "possible", "present"):
        (root / "sys/devices/system/cpu" / name).unlink()
    shutil.rmtree(root / "sys/devices/system/node")
    topology = read_topology(sys_root=str(root / "sys"), proc_root=str(root / "proc"), allowed={0, 1})
    assert topology.nodes == ((0, cpus("0-1")),)


def test_gpus_are_in_pci_order(tmp_path):
    gpus = tmp_path / "proc/driver/nvidia/gpus"
    for pci in ("10000:01:00.0", "0000:ff:00.0", "0000:1a:00.0"):
        (gpus / pci).mkdir(parents=True)
    topology = read_topology(sys_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"), allowed={0})
    assert [g.pci for g in topology.gpus] == ["0000:1a:00.0", "0000:ff:00.0", "10000:01:00.0"]
    assert read_topology(sys_root=str(tmp_path / "none"), proc_root=str(tmp_path / "none"), allowed={0}).gpus == ()


def test_a_topology_takes_its_nodes_as_a_mapping():
    topology = Topology(nodes={1: {2, 3}, 0: [0, 1]}, allowed=[0, 1, 2])
    assert topology.nodes == ((0, cpus("0-1")), (1, cpus("2-3")))
    assert topology.allowed_on(1) == {2} and topology.allowed_on(5) == frozenset()


# ---- --numa-binding ----------------------------------------------------------------------------------------------

def test_node_binds_each_worker_to_its_gpus_node(dgx, epyc):
    assert one("node", dgx, 0) == one("node", dgx, 3) == "0-55,112-167"
    assert one("node", dgx, 5) == "56-111,168-223"
    assert one("node", epyc, 0) == "32-63,96-127" and one("node", epyc, 1) == "0-31,64-95"


def test_node_keeps_to_the_allowed_cpus(tree_roots):
    dgx = machine(tree_roots, "dgx_h100", allowed=cpus("0-7,56-63"))
    assert one("node", dgx, 1) == "0-7" and one("node", dgx, 6) == "56-63"


def test_socket_binds_to_every_node_of_the_socket(dgx, epyc):
    assert one("socket", dgx, 2) == "0-55,112-167"  # one node per socket: the node
    assert one("socket", dgx, 7) == "56-111,168-223"
    assert {one("socket", epyc, i) for i in range(4)} == {"0-127"}  # NPS2: both nodes of the one socket


def test_socket_passes_over_a_node_with_no_allowed_cpu(tree_roots):
    """torch fails here (min() of the other node's empty set); the other node adds nothing anyway."""
    dgx = machine(tree_roots, "dgx_h100", allowed=cpus("0-55,112-167"))
    assert one("socket", dgx, 0) == "0-55,112-167"


def test_exclusive_divides_a_nodes_cores_among_its_gpus(dgx):
    assert one("exclusive", dgx, 0) == "0-13,112-125"
    assert one("exclusive", dgx, 3) == "42-55,154-167"
    assert one("exclusive", dgx, 4) == "56-69,168-181"
    assert one("exclusive", dgx, 7) == "98-111,210-223"


def test_exclusive_gives_the_first_gpus_one_core_more_when_the_cores_do_not_divide(tree_roots):
    dgx = machine(tree_roots, "dgx_h100", allowed=cpus("0-53,112-165"))  # 54 cores for 4 GPUs
    assert [one("exclusive", dgx, i) for i in range(4)] == [
        "0-13,112-125", "14-27,126-139", "28-40,140-152", "41-53,153-165"]


def test_exclusive_counts_the_visible_gpus_in_cudas_order(dgx):
    four, five = dgx.gpus[4], dgx.gpus[5]
    assert one("exclusive", dgx, 4, visible=[four, five]) == "56-83,168-195"
    assert one("exclusive", dgx, 5, visible=[four, five]) == "84-111,196-223"
    assert one("exclusive", dgx, 4, visible=[five, four]) == "84-111,196-223"  # CUDA_VISIBLE_DEVICES=5,4


def test_exclusive_on_interleaved_nodes(epyc):
    assert [one("exclusive", epyc, i) for i in range(4)] == [
        "32-47,96-111", "0-15,64-79", "48-63,112-127", "16-31,80-95"]


def test_exclusive_with_fewer_cores_than_gpus_is_refused(tree_roots):
    dgx = machine(tree_roots, "dgx_h100", allowed=cpus("0-2,112-114,56-111"))
    with pytest.raises(LaunchError) as e:
        numa_cpus("exclusive", dgx, [dgx.gpus[0]], dgx.gpus)
    assert str(e.value) == ("--numa-binding exclusive gives each GPU of NUMA node 0 cores of its own, but the node has "
                            "3 physical core(s) this launcher may use (0-2,112-114) for its 4 GPUs (0, 1, 2, 3); use "
                            "--numa-binding node, or allow more CPUs.")
    assert one("exclusive", dgx, 4) == "56-69"  # node 1 is fine


def test_core_complex_gives_each_gpu_of_a_node_its_own_complex(epyc):
    assert [one("core-complex", epyc, i) for i in range(4)] == [
        "32-39,96-103", "0-7,64-71", "40-47,104-111", "8-15,72-79"]


def test_core_complex_prefers_the_complexes_with_more_allowed_cpus(tree_roots):
    epyc = machine(tree_roots, "epyc_nps2", allowed=cpus("1-127"))  # node 0's first complex has 15 CPUs left
    assert one("core-complex", epyc, 1) == "8-15,72-79"
    assert one("core-complex", epyc, 3) == "16-23,80-87"


def test_core_complex_goes_round_when_a_node_has_more_gpus_than_complexes(dgx):
    assert {one("core-complex", dgx, i) for i in range(4)} == {"0-55,112-167"}  # one L3 per socket


def test_core_complex_without_cache_facts_takes_single_cpus(tmp_path):
    root = trees.vm_one_gpu(tmp_path)
    for i in range(8):
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{i}/cache")
    vm = read_topology(sys_root=str(root / "sys"), proc_root=str(root / "proc"), allowed=range(8))
    assert one("core-complex", vm, 0) == "0"


def test_the_vm_binds_its_one_gpu_to_every_cpu_with_a_note(tree_roots):
    vm = machine(tree_roots, "vm_one_gpu")
    for mode in NUMA_MODES:
        sets, notes = numa_cpus(mode, vm, [vm.gpus[0], vm.gpus[0]], vm.gpus)
        assert sets == (cpus("0-7"), cpus("0-7"))
        assert notes == ("GPU 0 (0000:00:04.0) reports no NUMA node; its workers are bound to node 0's CPUs, "
                         "as torch does.",)


def test_two_cpus_one_node_each(tree_roots):
    two = machine(tree_roots, "two_cpus", allowed={0, 1})
    assert numa_cpus("node", two, two.gpus, two.gpus) == ((cpus("0"), cpus("1")), ())
    assert numa_cpus("socket", two, two.gpus, two.gpus)[0] == (cpus("0-1"), cpus("0-1"))
    assert numa_cpus("exclusive", two, two.gpus[::-1], two.gpus)[0] == (cpus("1"), cpus("0"))


def test_a_node_with_none_of_the_allowed_cpus_is_refused(tree_roots):
    dgx = machine(tree_roots, "dgx_h100", allowed={0, 1})
    for mode in NUMA_MODES:
        with pytest.raises(LaunchError) as e:
            numa_cpus(mode, dgx, [dgx.gpus[0], dgx.gpus[4]], dgx.gpus)
        assert str(e.value) == ("NUMA node 1 (CPUs 56-111,168-223) has none of the CPUs this launcher may use (0-1); "
                                "run the launcher with those CPUs allowed, or leave out --numa-binding.")


def test_a_node_the_tree_does_not_have_is_refused(dgx):
    stray = Gpu(index=8, pci="0000:e1:00.0", numa_node=3)
    with pytest.raises(LaunchError) as e:
        numa_cpus("node", dgx, [stray], [*dgx.gpus, stray])
    assert str(e.value) == ("GPU 8 (0000:e1:00.0) is on NUMA node 3, which /sys/devices/system/node does not list (it "
                            "lists 0, 1); check the machine's NUMA set-up, or leave out --numa-binding.")


def test_a_gpu_on_a_memory_only_node_is_refused():
    gpu = Gpu(index=0, pci="0009:01:00.0", numa_node=2)
    topology = Topology(nodes={0: {0, 1}, 2: set()}, gpus=(gpu,), allowed={0, 1})
    with pytest.raises(LaunchError) as e:
        numa_cpus("node", topology, [gpu], [gpu])
    assert str(e.value) == ("GPU 0 (0009:01:00.0) is on NUMA node 2, which has no CPU (memory only); leave out "
                            "--numa-binding, or bind with --bind_cores_to_rank.")


def test_an_unknown_mode_is_refused(dgx):
    with pytest.raises(LaunchError) as e:
        numa_cpus("cache", dgx, dgx.gpus[:1], dgx.gpus)
    assert str(e.value) == ("--numa-binding cache is not a mode torchrun knows; give one of node, socket, exclusive, "
                            "core-complex.")


def test_a_worker_gpu_must_be_visible(dgx):
    with pytest.raises(ValueError):
        numa_cpus("node", dgx, [dgx.gpus[0]], dgx.gpus[1:])


# ---- --bind_cores_to_rank ----------------------------------------------------------------------------------------

def test_cores_divide_evenly_with_their_siblings(dgx, tree_roots):
    sets = core_cpus(dgx, 8)
    assert format_cpu_list(sets[0]) == "0-13,112-125" and format_cpu_list(sets[7]) == "98-111,210-223"
    two = machine(tree_roots, "two_cpus", allowed={0, 1})
    assert core_cpus(two, 2) == (cpus("0"), cpus("1"))


def test_the_lowest_ranks_get_one_core_more(tree_roots):
    vm = machine(tree_roots, "vm_one_gpu")
    assert core_cpus(vm, 3) == (cpus("0-1,4-5"), cpus("2,6"), cpus("3,7"))
    assert core_cpus(vm, 2) == (cpus("0-1,4-5"), cpus("2-3,6-7"))  # hyperthread siblings stay together


def test_a_core_list_is_what_gets_divided(tree_roots):
    vm = machine(tree_roots, "vm_one_gpu")
    assert core_cpus(vm, 2, cpus("0-3")) == (cpus("0-1"), cpus("2-3"))
    assert core_cpus(vm, 2, cpus("0-1,4")) == (cpus("0,4"), cpus("1"))


def test_a_core_list_outside_the_allowed_cpus_is_refused(tree_roots):
    vm = machine(tree_roots, "vm_one_gpu", allowed=cpus("0-3"))
    with pytest.raises(LaunchError) as e:
        core_cpus(vm, 1, cpus("2,5-6"))
    assert str(e.value) == ("--bind_core_list names CPU 5, which this launcher may not use (it may use 0-3); give "
                            "CPUs among those.")
    with pytest.raises(LaunchError, match="--bind_core_list names no CPU"):
        core_cpus(vm, 1, frozenset())


def test_more_workers_than_cores_is_refused(tree_roots):
    two = machine(tree_roots, "two_cpus", allowed={0, 1})
    with pytest.raises(LaunchError) as e:
        core_cpus(two, 3)
    assert str(e.value) == ("--nproc_per_node 3 asks for more workers than the 2 cores allowed here (0-1) for "
                            "--bind_cores_to_rank; give at most 2 workers, or more cores with --bind_core_list.")
    vm = machine(tree_roots, "vm_one_gpu")
    with pytest.raises(LaunchError) as e:
        core_cpus(vm, 2, cpus("0,4"))
    assert str(e.value) == ("--nproc_per_node 2 asks for more workers than the 1 cores --bind_core_list gives (0,4) "
                            "for --bind_cores_to_rank; give at most 1 workers, or more cores with --bind_core_list.")
    with pytest.raises(ValueError):
        core_cpus(vm, 0)


def test_threads_are_the_physical_cores(dgx):
    assert threads_for(cpus("0-13,112-125"), dgx) == 14
    assert threads_for(cpus("0,112,1"), dgx) == 2
    assert threads_for(frozenset(), dgx) == 1


# ---- naming a GPU ------------------------------------------------------------------------------------------------

def test_a_gpu_is_named_by_index_or_uuid(dgx):
    assert gpu_named(dgx, "3") is dgx.gpus[3]
    assert gpu_named(dgx, "03") is dgx.gpus[3]
    uuid = trees.gpu_uuid("0000:ba:00.0")
    assert gpu_named(dgx, uuid) is dgx.gpus[6]
    assert gpu_named(dgx, uuid.upper()) is dgx.gpus[6]
    assert gpu_named(dgx, uuid[:12]) is dgx.gpus[6]  # a unique start, as CUDA takes


def test_a_gpu_the_driver_does_not_list_is_refused(dgx):
    with pytest.raises(LaunchError) as e:
        gpu_named(dgx, "8")
    text = str(e.value)
    assert text.startswith("GPU '8' is not one the NVIDIA driver lists (0: 0000:18:00.0 GPU-")
    assert "; 7: 0000:db:00.0 GPU-" in text and text.endswith("); name a GPU by its index or its UUID.")
    with pytest.raises(LaunchError, match="GPU 'GPU-nope' is not one the NVIDIA driver lists"):
        gpu_named(dgx, "GPU-nope")
    with pytest.raises(LaunchError) as e:
        gpu_named(dgx, "GPU-")
    assert str(e.value).startswith("GPU 'GPU-' is the start of the UUIDs of GPU 0 (0000:18:00.0), GPU 1")
    assert str(e.value).endswith("; give more of the UUID of the one you mean.")
    with pytest.raises(LaunchError) as e:
        gpu_named(Topology(), "0")
    assert str(e.value) == ("GPU '0' is not one the NVIDIA driver lists (it lists none in /proc/driver/nvidia/gpus); "
                            "name a GPU by its index or its UUID.")
