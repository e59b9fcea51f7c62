"""This machine's CPUs, NUMA nodes and NVIDIA GPUs, read from sysfs and the driver's /proc files, never from CUDA.

Read only when a placement option asks for it (``--numa-binding``, ``--bind_cores_to_rank``). A file that is missing
or unreadable leaves its fact at a plain default, as on a VM that reports no NUMA node: no node folder means one
node 0 that holds every CPU, no socket means socket 0, no hyperthread siblings or caches mean each CPU alone.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from launcher.plan.topology import Cpu, Gpu, Topology, parse_cpu_list

_NUMBERED = re.compile(r"(cpu|node|index)([0-9]+)")
_CACHE_TYPES = ("Unified", "Data")  # an instruction cache holds no data a worker shares


def read_topology(sys_root: str = "/sys", proc_root: str = "/proc", allowed=None) -> Topology:
    """The machine as ``sys_root`` and ``proc_root`` describe it; ``allowed``: the CPUs this launcher may use
    (None: its own affinity, ``os.sched_getaffinity(0)``)."""
    cpu_dir = os.path.join(sys_root, "devices", "system", "cpu")
    cpu_ids = _cpu_ids(cpu_dir)
    if allowed is None:
        allowed = os.sched_getaffinity(0)
    return Topology(
        cpus=tuple(_cpu(cpu_dir, i) for i in sorted(cpu_ids)),
        nodes=_nodes(os.path.join(sys_root, "devices", "system", "node"), cpu_ids),
        gpus=tuple(_gpus(sys_root, proc_root)),
        allowed=frozenset(allowed),
    )


def _cpu_ids(cpu_dir: str) -> frozenset:
    """The CPUs sysfs reports: ``online``, else ``possible``, else the cpuN folders."""
    for name in ("online", "possible"):
        found = _read_list(os.path.join(cpu_dir, name))
        if found:
            return found
    return frozenset(_numbered(cpu_dir, "cpu"))


def _cpu(cpu_dir: str, index: int) -> Cpu:
    here = os.path.join(cpu_dir, f"cpu{index}")
    package = _read_int(os.path.join(here, "topology", "physical_package_id"))
    siblings = _read_list(os.path.join(here, "topology", "thread_siblings_list"))
    cache = _largest_cache(os.path.join(here, "cache"))
    return Cpu(index=index, core=min(siblings) if siblings else index, package=package if package is not None else 0,
               cache=min(cache) if cache else index)


def _largest_cache(cache_dir: str) -> Optional[frozenset]:
    """The CPUs sharing the highest-level data or unified cache of a CPU (the lowest indexN on a tie); None if unknown."""
    best_level, best = -1, None
    for n in sorted(_numbered(cache_dir, "index")):
        here = os.path.join(cache_dir, f"index{n}")
        level = _read_int(os.path.join(here, "level"))
        if _read_text(os.path.join(here, "type")) not in _CACHE_TYPES or level is None or level <= best_level:
            continue
        shared = _read_list(os.path.join(here, "shared_cpu_list"))
        if shared:
            best_level, best = level, shared
    return best


def _nodes(node_dir: str, cpu_ids: frozenset) -> dict:
    """Each NUMA node that has a folder (of those ``possible`` names) and its CPUs; one node 0 with every CPU when
    sysfs reports no node."""
    ids = _read_list(os.path.join(node_dir, "possible"))
    if ids is None:
        ids = frozenset(_numbered(node_dir, "node"))
    cpus = {n: _read_list(os.path.join(node_dir, f"node{n}", "cpulist")) for n in sorted(ids)}
    return {n: found for n, found in cpus.items() if found is not None} or {0: cpu_ids}


def _gpus(sys_root: str, proc_root: str):
    """The GPUs the NVIDIA driver lists, a folder each named by its PCI address, in PCI order."""
    driver = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        addresses = sorted(os.listdir(driver), key=_pci_order)
    except OSError:
        return
    for index, pci in enumerate(addresses):
        device = os.path.join(sys_root, "bus", "pci", "devices", pci)
        node = _read_int(os.path.join(device, "numa_node"))
        yield Gpu(index=index, pci=pci, numa_node=node if node is not None else -1,
                  uuid=_uuid(os.path.join(driver, pci, "information")),
                  local_cpus=_read_list(os.path.join(device, "local_cpulist")) or frozenset())


def _pci_order(address: str):
    """A PCI address (domain:bus:device.function, hexadecimal) as numbers, for sorting; unknown forms last."""
    try:
        rest, function = address.rsplit(".", 1)
        return (0, *(int(part, 16) for part in rest.split(":")), int(function, 16), address)
    except ValueError:
        return (1, address)


def _uuid(information: str) -> Optional[str]:
    """The "GPU UUID:" line of the driver's information file of a GPU."""
    for line in (_read_text(information) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "GPU UUID" and value.strip():
            return value.strip()
    return None


def _numbered(folder: str, prefix: str) -> list:
    """N of each ``prefixN`` entry of ``folder``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [int(m.group(2)) for m in map(_NUMBERED.fullmatch, names) if m and m.group(1) == prefix]


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 16).strip()
    except OSError:
        return None


def _read_int(path: str) -> Optional[int]:
    return _read_as(path, int)


def _read_list(path: str) -> Optional[frozenset]:
    return _read_as(path, parse_cpu_list)


def _read_as(path: str, parse):
    """The file's text as ``parse`` reads it; None where the file is missing or its text is not that."""
    text = _read_text(path)
    try:
        return parse(text) if text is not None else None
    except ValueError:
        return None
