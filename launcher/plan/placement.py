"""Which CPUs each local worker is bound to: torchrun's ``--numa-binding`` modes (the CPUs near the worker's GPU,
torch/numa/binding.py's rules) and DeepSpeed's ``--bind_cores_to_rank`` (the cores split among the workers). Pure.

Every CPU set is within the CPUs the launcher may use (``Topology.allowed``); every refusal is a LaunchError of one
sentence that names the value and the fix.
"""

from __future__ import annotations

from typing import Optional, Sequence

from launcher.errors import LaunchError
from launcher.plan.model import NUMA_MODES
from launcher.plan.topology import Gpu, Topology, format_cpu_list



def numa_cpus(mode: str, topology: Topology, worker_gpus: Sequence[Gpu],
              visible_gpus: Sequence[Gpu]) -> tuple:
    """(each local worker's CPUs, in local-rank order; the notes to show) for ``--numa-binding mode``.

    ``worker_gpus``: each worker's GPU; ``visible_gpus``: every GPU the workers can see, in CUDA's order (the order
    of CUDA_VISIBLE_DEVICES when it is set), which is the order ``exclusive`` and ``core-complex`` share a node's
    CPUs out in, as torch does (it counts the GPUs CUDA shows, not only the job's)."""
    if mode not in NUMA_MODES:
        raise LaunchError(f"--numa-binding {mode} is not a mode torchrun knows; give one of {', '.join(NUMA_MODES)}.")
    visible = list(visible_gpus)
    missing = [g for g in worker_gpus if g not in visible]
    if missing:
        raise ValueError(f"{missing[0]} is a worker's GPU but not among the visible GPUs")
    notes = []
    for gpu in dict.fromkeys(worker_gpus):
        _check_node(gpu, topology)
        if gpu.numa_node < 0:
            notes.append(f"{gpu} reports no NUMA node; its workers are bound to node 0's CPUs, as torch does.")
    place = _MODES[mode]
    return tuple(place(topology, gpu, visible) for gpu in worker_gpus), tuple(notes)


def _check_node(gpu: Gpu, topology: Topology) -> None:
    cpus = topology.node_cpus(gpu.node)
    if cpus is None:
        have = ", ".join(map(str, topology.node_ids()))
        raise LaunchError(f"{gpu} is on NUMA node {gpu.node}, which /sys/devices/system/node does not list (it lists "
                          f"{have}); check the machine's NUMA set-up, or leave out --numa-binding.")
    if not cpus:
        raise LaunchError(f"{gpu} is on NUMA node {gpu.node}, which has no CPU (memory only); leave out "
                          "--numa-binding, or bind with --bind_cores_to_rank.")
    if not cpus & topology.allowed:
        raise LaunchError(f"NUMA node {gpu.node} (CPUs {format_cpu_list(cpus)}) has none of the CPUs this launcher may "
                          f"use ({format_cpu_list(topology.allowed)}); run the launcher with those CPUs allowed, or "
                          "leave out --numa-binding.")


def _node(topology: Topology, gpu: Gpu, visible: list) -> frozenset:
    """The allowed CPUs of the GPU's node."""
    return topology.allowed_on(gpu.node)


def _socket(topology: Topology, gpu: Gpu, visible: list) -> frozenset:
    """The allowed CPUs of every node on the socket of the GPU's node (a node's socket: its smallest allowed CPU's)."""
    package = _package(topology, gpu.node)
    found: set = set()
    for node in topology.node_ids():
        if _package(topology, node) == package:
            found |= topology.allowed_on(node)
    return frozenset(found)


def _package(topology: Topology, node: int) -> Optional[int]:
    """The socket of a node's smallest allowed CPU; None for a node with no allowed CPU (torch fails on one)."""
    cpus = topology.allowed_on(node)
    return topology.cpu(min(cpus)).package if cpus else None


def _exclusive(topology: Topology, gpu: Gpu, visible: list) -> frozenset:
    """An even share of the physical cores of the GPU's node, the first GPUs of the node one core more when the
    cores do not divide."""
    peers = _peers(gpu, visible)
    cores = topology.cores_of(topology.allowed_on(gpu.node))
    if len(cores) < len(peers):
        raise LaunchError(f"--numa-binding exclusive gives each GPU of NUMA node {gpu.node} cores of its own, but the "
                          f"node has {len(cores)} physical core(s) this launcher may use "
                          f"({format_cpu_list(topology.allowed_on(gpu.node))}) for its {len(peers)} GPUs "
                          f"({', '.join(str(g.index) for g in peers)}); use --numa-binding node, or allow more CPUs.")
    start, end = _share(len(cores), len(peers), peers.index(gpu))
    return frozenset(i for _, cpus in cores[start:end] for i in cpus)


def _core_complex(topology: Topology, gpu: Gpu, visible: list) -> frozenset:
    """One group of the GPU's node's CPUs that share their largest cache: the biggest groups first, one per GPU of
    the node in turn (round and round when the node has more GPUs than groups)."""
    peers = _peers(gpu, visible)
    groups = sorted(topology.caches_of(topology.allowed_on(gpu.node)), key=lambda g: (-len(g[1]), g[0]))
    return groups[peers.index(gpu) % len(groups)][1]


def _peers(gpu: Gpu, visible: list) -> list:
    """The visible GPUs on the same NUMA node as ``gpu``, in CUDA's order."""
    return [g for g in visible if g.node == gpu.node]


_MODES = {"node": _node, "socket": _socket, "exclusive": _exclusive, "core-complex": _core_complex}


def _share(items: int, takers: int, which: int) -> tuple:
    """[start, end) of taker ``which``'s run when ``items`` are cut into ``takers`` contiguous runs, the first ones
    one longer when they do not divide."""
    each, extra = divmod(items, takers)
    start = which * each + min(which, extra)
    return start, start + each + (1 if which < extra else 0)


def core_cpus(topology: Topology, nper: int, core_list: Optional[frozenset] = None) -> tuple:
    """Each local worker's CPUs for ``--bind_cores_to_rank``: the CPUs of ``--bind_core_list`` (``core_list``), or else
    every CPU this launcher may use, by physical core (hyperthread siblings together), cut into ``nper`` contiguous
    runs of cores, the lowest local ranks one core more when they do not divide."""
    if nper < 1:
        raise ValueError(f"nper must be at least 1, not {nper}")
    allowed = format_cpu_list(topology.allowed)
    if core_list is not None:
        if not core_list:
            raise LaunchError("--bind_core_list names no CPU; give CPUs such as 0-7, or leave it out to use every CPU "
                              f"allowed here ({allowed}).")
        outside = sorted(set(core_list) - topology.allowed)
        if outside:
            raise LaunchError(f"--bind_core_list names CPU {outside[0]}, which this launcher may not use (it may use "
                              f"{allowed}); give CPUs among those.")
    cpus = frozenset(core_list) if core_list is not None else topology.allowed
    cores = topology.cores_of(cpus)
    if nper > len(cores):
        where = "--bind_core_list gives" if core_list is not None else "allowed here"
        raise LaunchError(f"--nproc_per_node {nper} asks for more workers than the {len(cores)} cores {where} "
                          f"({format_cpu_list(cpus)}) for --bind_cores_to_rank; give at most {len(cores)} workers, or "
                          "more cores with --bind_core_list.")
    runs = (_share(len(cores), nper, rank) for rank in range(nper))
    return tuple(frozenset(i for _, group in cores[start:end] for i in group) for start, end in runs)


def threads_for(cpus: frozenset, topology: Topology) -> int:
    """The physical cores among ``cpus`` (at least 1): the OMP_NUM_THREADS of a worker bound to them."""
    return max(1, len({topology.cpu(i).core for i in cpus}))
