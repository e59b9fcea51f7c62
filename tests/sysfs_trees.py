"""Fake sysfs and procfs trees of real machines, written under a folder (``root/sys/...``, ``root/proc/...``): the
files ``launcher.host.topology`` and torch/numa/binding.py read, laid out as Linux and the NVIDIA driver lay them out.

Each function writes one machine and returns its root. ``read_topology(sys_root=root / "sys", proc_root=root /
"proc")`` reads it; tests/integration/test_placement_sysfs.py bind-mounts it over the real /sys and /proc paths.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence


MOUNTED = ("sys/devices/system", "sys/bus/pci/devices", "proc/driver")  # where a tree goes, over the real paths


def mounts_available() -> bool:
    """Whether a tree can be bind-mounted over the real paths here: root, and a mount namespace of one's own."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as empty:
        mounts = " && ".join(f"mount --bind {empty} /{target}" for target in MOUNTED)
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts],
                           capture_output=True, timeout=20)
    return r.returncode == 0


@dataclass
class Machine:
    """What a tree says: per CPU its socket, its hyperthread siblings and, per cache level, the CPUs sharing that
    cache; the NUMA nodes' CPUs; the GPUs' PCI addresses and NUMA nodes."""

    packages: dict  # cpu -> socket
    siblings: dict  # cpu -> the CPUs on its physical core
    caches: dict  # cpu -> [(level, type, the CPUs sharing it)]
    nodes: Optional[dict]  # node -> its CPUs; None: no node folder at all
    gpus: Sequence  # (pci address, numa_node) in any order
    possible_nodes: Optional[str] = None  # node/possible as written (default: the nodes)
    extra: dict = field(default_factory=dict)  # path under root -> text: anything else


def cpu_list(cpus) -> str:
    """"0-3,8" for a set of CPUs (written here, not taken from the code under test)."""
    out, run = [], []
    for i in sorted(cpus):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def gpu_uuid(pci: str) -> str:
    """A stable, made-up UUID for the GPU at ``pci``."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, 'fake-gpu/' + pci)}"


def write(root: Path, machine: Machine) -> Path:
    """Write ``machine``'s tree under ``root``; returns ``root``."""
    root = Path(root)
    cpus = sorted(machine.packages)
    system = root / "sys" / "devices" / "system"
    for name in ("online", "possible", "present"):
        _put(system / "cpu" / name, cpu_list(cpus))
    for i in cpus:
        here = system / "cpu" / f"cpu{i}"
        _put(here / "topology" / "physical_package_id", str(machine.packages[i]))
        _put(here / "topology" / "thread_siblings_list", cpu_list(machine.siblings[i]))
        _put(here / "topology" / "core_cpus_list", cpu_list(machine.siblings[i]))
        _put(here / "topology" / "package_cpus_list",
             cpu_list(c for c in cpus if machine.packages[c] == machine.packages[i]))
        for n, (level, kind, shared) in enumerate(machine.caches.get(i, ())):
            _put(here / "cache" / f"index{n}" / "level", str(level))
            _put(here / "cache" / f"index{n}" / "type", kind)
            _put(here / "cache" / f"index{n}" / "shared_cpu_list", cpu_list(shared))
    if machine.nodes is not None:
        node_ids = cpu_list(machine.nodes)
        _put(system / "node" / "possible", machine.possible_nodes or node_ids)
        _put(system / "node" / "online", node_ids)
        _put(system / "node" / "has_cpu", cpu_list(n for n, c in machine.nodes.items() if c))
        for n, node_cpus in machine.nodes.items():
            _put(system / "node" / f"node{n}" / "cpulist", cpu_list(node_cpus))
    for minor, (pci, numa_node) in enumerate(sorted(machine.gpus)):
        device = root / "sys" / "bus" / "pci" / "devices" / pci
        _put(device / "numa_node", str(numa_node))
        local = machine.nodes[numa_node] if machine.nodes and numa_node in machine.nodes else cpus
        _put(device / "local_cpulist", cpu_list(local))
        _put(root / "proc" / "driver" / "nvidia" / "gpus" / pci / "information", _information(pci, minor))
    for path, text in machine.extra.items():
        _put(root / path, text)
    return root


def _information(pci: str, minor: int) -> str:
    """The driver's /proc/driver/nvidia/gpus/<pci>/information, as its fields are laid out (values made up)."""
    return (f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t {120 + minor}\nGPU UUID: \t {gpu_uuid(pci)}\n"
            f"Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {pci}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n")


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _smt_machine(cores_per_socket: int, sockets: int, threads: int, l3_cores: int) -> tuple:
    """Linux's numbering of an x86 machine: the first thread of every core first (socket by socket), then the second
    threads in the same order; L1d and L2 per core, one L3 per ``l3_cores`` cores. (packages, siblings, caches)."""
    cores = cores_per_socket * sockets
    packages, siblings, caches = {}, {}, {}
    for core in range(cores):
        mine = [core + t * cores for t in range(threads)]
        first = core - core % l3_cores
        l3 = [c + t * cores for c in range(first, first + l3_cores) for t in range(threads)]
        for cpu in mine:
            packages[cpu] = core // cores_per_socket
            siblings[cpu] = mine
            caches[cpu] = [(1, "Data", mine), (1, "Instruction", mine), (2, "Unified", mine), (3, "Unified", l3)]
    return packages, siblings, caches


# (a) NVIDIA DGX H100. From NVIDIA's "DGX H100/H200 User Guide" (its hardware overview, and its network-module
# table that puts GPUs 0-3 behind CPU 0 and GPUs 4-7 behind CPU 1): two Intel Xeon Platinum 8480C sockets of 56
# cores, 112 cores in all, hyperthreading on (224 logical CPUs); with sub-NUMA clustering off (its default) one NUMA
# node per socket, and one L3 per socket. The eight GPUs at the PCI addresses nvidia-smi lists on that system.
# Linux numbers socket 0's cores 0-55 and socket 1's 56-111, then their second threads 112-167 and 168-223.
DGX_H100_GPUS = (("0000:18:00.0", 0), ("0000:2a:00.0", 0), ("0000:3a:00.0", 0), ("0000:5d:00.0", 0),
                 ("0000:9a:00.0", 1), ("0000:ab:00.0", 1), ("0000:ba:00.0", 1), ("0000:db:00.0", 1))


def dgx_h100(root: Path) -> Path:
    packages, siblings, caches = _smt_machine(56, 2, 2, 56)
    nodes = {0: set(range(0, 56)) | set(range(112, 168)), 1: set(range(56, 112)) | set(range(168, 224))}
    return write(root, Machine(packages, siblings, caches, nodes, DGX_H100_GPUS))


# (b) A one-socket AMD EPYC 7763 (Zen 3, "Milan") host in NPS2 mode. From AMD's EPYC 7003 documentation (the
# processor's specifications, and the NPS (NUMA nodes per socket) setting its BIOS and workload tuning guides
# describe): 64 cores, SMT2 (128 logical CPUs), eight 8-core CCDs, each one core complex with its own L3; NPS2 splits
# the socket's memory and cores into two NUMA nodes of four CCDs each. Linux numbers the cores 0-63, then their
# second threads 64-127. Four GPUs, two per node; their PCI addresses are plausible ones for such a host (one root
# complex per I/O-die quadrant), chosen so that PCI order and node order interleave.
EPYC_NPS2_GPUS = (("0000:01:00.0", 1), ("0000:41:00.0", 0), ("0000:81:00.0", 1), ("0000:c1:00.0", 0))


def epyc_nps2(root: Path) -> Path:
    packages, siblings, caches = _smt_machine(64, 1, 2, 8)
    nodes = {0: set(range(0, 32)) | set(range(64, 96)), 1: set(range(32, 64)) | set(range(96, 128))}
    return write(root, Machine(packages, siblings, caches, nodes, EPYC_NPS2_GPUS))


# (c) A cloud VM with 8 vCPUs (4 cores, 2 threads each, numbered as the hypervisor presents them: 0-3 then their
# siblings 4-7), one L3 for all, and one GPU passed through whose PCI device reports no NUMA node (numa_node -1, as
# on most single-node VMs). ``numa``: "node0" writes node/possible and node0 only; "none" writes no node folder.
VM_GPUS = (("0000:00:04.0", -1),)


def vm_one_gpu(root: Path, numa: str = "node0") -> Path:
    packages, siblings, caches = _smt_machine(4, 1, 2, 4)
    nodes = {0: set(range(8))} if numa == "node0" else None
    return write(root, Machine(packages, siblings, caches, nodes, VM_GPUS))


# (d) This test machine's own two CPUs (0 and 1), each its own core, cache and NUMA node on one socket, with one GPU
# on each node: for end-to-end tests whose workers really get bound.
TWO_CPU_GPUS = (("0000:3b:00.0", 0), ("0000:86:00.0", 1))


def two_cpus(root: Path) -> Path:
    packages = {0: 0, 1: 0}
    siblings = {0: [0], 1: [1]}
    caches = {i: [(1, "Data", [i]), (2, "Unified", [i]), (3, "Unified", [i])] for i in (0, 1)}
    return write(root, Machine(packages, siblings, caches, {0: {0}, 1: {1}}, TWO_CPU_GPUS))


TREES = {"dgx_h100": dgx_h100, "epyc_nps2": epyc_nps2, "vm_one_gpu": vm_one_gpu, "two_cpus": two_cpus}


IB_ACTIVE, IB_DOWN, IB_INIT = "4: ACTIVE", "1: DOWN", "2: INIT"
PHYS_LINK_UP, PHYS_POLLING, PHYS_DISABLED = "5: LinkUp", "2: Polling", "3: Disabled"


def infiniband(root: Path, ports: dict) -> Path:
    """/sys/class/infiniband as the kernel lays it out: ``ports`` maps (device, port) to (state, phys_state), such as
    {("mlx5_0", 1): (IB_ACTIVE, PHYS_LINK_UP)}; returns the sysfs root (``root/sys``)."""
    for (device, port), (state, physical) in ports.items():
        folder = Path(root) / "sys" / "class" / "infiniband" / device / "ports" / str(port)
        _put(folder / "state", state)
        _put(folder / "phys_state", physical)
        _put(folder / "link_layer", "InfiniBand")
    return Path(root) / "sys"
