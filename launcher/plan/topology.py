"""This machine's CPUs, NUMA nodes and GPUs as sysfs and the NVIDIA driver describe them, as plain data, and the CPU
lists sysfs writes ("0-3,8,10-11"). Pure: ``launcher.host.topology`` reads the files.

What the workers' placement (``launcher.plan.placement``) needs and nothing more: each CPU's physical core, socket and
largest cache, the CPUs of each NUMA node, each GPU's PCI address and NUMA node, and the CPUs the launcher may use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping, Optional

from launcher.errors import LaunchError
from launcher.plan.parsing import DIGITS

MAX_CPUS = 1 << 16  # Linux numbers at most 8,192 CPUs (CONFIG_NR_CPUS); a list past this is a mistake, not a machine
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


@dataclass(frozen=True)
class Cpu:
    """One logical CPU: ``core`` is the smallest CPU on its physical core (its hyperthread siblings share it),
    ``package`` its socket, ``cache`` the smallest CPU sharing its largest cache (the CPU itself when none is known)."""

    index: int
    core: int
    package: int
    cache: int


@dataclass(frozen=True)
class Gpu:
    """One GPU the NVIDIA driver lists: ``index`` is its place in PCI order (nvidia-smi's and CUDA's with
    CUDA_DEVICE_ORDER=PCI_BUS_ID), ``numa_node`` as its PCI device reports it (-1: none), ``local_cpus`` from its
    PCI device's ``local_cpulist`` (empty when not known)."""

    index: int
    pci: str
    numa_node: int
    uuid: Optional[str] = None
    local_cpus: frozenset = frozenset()

    @property
    def node(self) -> int:
        """The NUMA node its workers are placed on: the one it reports, or node 0 when it reports none (as torch)."""
        return max(self.numa_node, 0)

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.pci})"


@dataclass(frozen=True)
class Topology:
    """The CPUs, the NUMA nodes (node, its CPUs) in node order, the GPUs in PCI order, and the CPUs this launcher may
    use (its affinity). A CPU that ``cpus`` does not describe is its own core, cache and socket 0."""

    cpus: tuple = ()
    nodes: tuple = ()
    gpus: tuple = ()
    allowed: frozenset = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        nodes = self.nodes.items() if isinstance(self.nodes, Mapping) else self.nodes
        object.__setattr__(self, "nodes", tuple(sorted((int(n), frozenset(c)) for n, c in nodes)))
        object.__setattr__(self, "cpus", tuple(sorted(self.cpus, key=lambda c: c.index)))
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "allowed", frozenset(self.allowed))

    @cached_property
    def _by_index(self) -> dict:
        return {c.index: c for c in self.cpus}

    @cached_property
    def _node_map(self) -> dict:
        return dict(self.nodes)

    def cpu(self, index: int) -> Cpu:
        """The CPU ``index`` (a plain one when the tree does not describe it)."""
        return self._by_index.get(index) or Cpu(index, index, 0, index)

    def node_ids(self) -> tuple:
        """The NUMA nodes this machine has, in order."""
        return tuple(n for n, _ in self.nodes)

    def node_cpus(self, node: int) -> Optional[frozenset]:
        """Every CPU of NUMA node ``node``, allowed or not; None when the machine has no such node."""
        return self._node_map.get(node)

    def allowed_on(self, node: int) -> frozenset:
        """The CPUs of NUMA node ``node`` this launcher may use (empty when there is no such node)."""
        return (self._node_map.get(node) or frozenset()) & self.allowed

    def cores_of(self, cpus: Iterable[int]) -> tuple:
        """``cpus`` grouped by physical core (hyperthread siblings together), cores in order of their smallest CPU."""
        return _grouped(cpus, lambda i: self.cpu(i).core)

    def caches_of(self, cpus: Iterable[int]) -> tuple:
        """``cpus`` grouped by the largest cache they share, in order of the cache's smallest CPU."""
        return _grouped(cpus, lambda i: self.cpu(i).cache)


def _grouped(cpus: Iterable[int], key) -> tuple:
    groups: dict = {}
    for i in cpus:
        groups.setdefault(key(i), set()).add(i)
    return tuple((k, frozenset(groups[k])) for k in sorted(groups))


def parse_cpu_list(text: str) -> frozenset:
    """The CPUs (or nodes) of a list as sysfs writes one: "0-3,8,10-11"; "" (a node with no CPU) is none.
    ValueError for anything else: a bad number, a range that runs backwards, an empty item."""
    text = text.strip()
    if not text:
        return frozenset()
    found: set = set()
    for item in text.split(","):
        m = _RANGE.fullmatch(item.strip())
        if m is None:
            raise ValueError(f"malformed CPU list {text!r}: {item.strip()!r} is not a number or a range such as 0-3")
        low, high = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if high < low:
            raise ValueError(f"malformed CPU list {text!r}: the range {item.strip()} runs backwards")
        if high >= MAX_CPUS:
            raise ValueError(f"CPU list {text!r} names CPU {high}, beyond the {MAX_CPUS} a kernel can number")
        found.update(range(low, high + 1))
    return frozenset(found)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``cpus`` as sysfs and numactl write them: sorted, runs as ranges ("0-3,8,10-11"); "" for none."""
    parts = []
    run: list = []
    for i in sorted(set(cpus)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(_run_text(run))
        run = [i]
    if run:
        parts.append(_run_text(run))
    return ",".join(parts)


def _run_text(run: list) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def gpu_named(topology: Topology, name: str) -> Gpu:
    """The GPU ``name`` names as CUDA_VISIBLE_DEVICES names devices: its machine index ("3", "03") or its UUID
    ("GPU-..."; a unique start of one, as CUDA takes). LaunchError when the driver lists no such GPU."""
    name = name.strip()
    if DIGITS.fullmatch(name) and int(name) < len(topology.gpus):
        return topology.gpus[int(name)]
    if not DIGITS.fullmatch(name) and name:
        wanted = name.lower()
        exact = [g for g in topology.gpus if g.uuid and g.uuid.lower() == wanted]
        found = exact or [g for g in topology.gpus if g.uuid and g.uuid.lower().startswith(wanted)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise LaunchError(f"GPU {name!r} is the start of the UUIDs of {', '.join(str(g) for g in found)}; give "
                              "more of the UUID of the one you mean.")
    raise LaunchError(f"GPU {name!r} is not one the NVIDIA driver lists ({_listed(topology)}); name a GPU by its "
                      "index or its UUID.")


def _listed(topology: Topology) -> str:
    if not topology.gpus:
        return "it lists none in /proc/driver/nvidia/gpus"
    return "; ".join(f"{g.index}: {g.pci}" + (f" {g.uuid}" if g.uuid else "") for g in topology.gpus)
