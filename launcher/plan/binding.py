"""The placement options applied to a node's workers: which CPUs each one is bound to, and the thread counts that
go with them. Pure: the machine's topology (``launcher.host.topology``) comes in with the host facts.

torchrun's ``--numa-binding`` binds GPU workers near their GPUs (``placement.numa_cpus``); ``--bind_cores_to_rank``
(and ``--bind_core_list``) gives each worker, CPU or GPU, cores of its own (``placement.core_cpus``) and sets
OMP_NUM_THREADS and MKL_NUM_THREADS to them, unless the user set them.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan import placement
from launcher.plan.devices import device_of
from launcher.plan.model import LaunchOptions
from launcher.plan.topology import gpu_named, parse_cpu_list


def place(opts: LaunchOptions, topology, gpus: Optional[Sequence[str]], env: Mapping[str, str], nper: int) -> tuple:
    """(each local worker's (CPUs, the thread variables that go with them); the notes to show). ``gpus``: each
    worker's FLAGS_selected_gpus, None for CPU workers; ``env``: the workers' environment (CUDA_VISIBLE_DEVICES, the
    thread counts the user set)."""
    cpus_of, notes = worker_cpus(opts, topology, gpus, env, nper)
    return tuple((cpus, thread_vars(opts, cpus, topology, env)) for cpus in cpus_of), notes


def worker_cpus(opts: LaunchOptions, topology, gpus: Optional[Sequence[str]], env: Mapping[str, str], nper: int) -> tuple:
    """(each local worker's CPUs; the notes to show), for options that place the workers."""
    if topology is None:
        raise ValueError("the placement options need the host's topology")
    if opts.numa_binding and (opts.bind_cores_to_rank or opts.bind_core_list):
        raise LaunchError(f"--numa-binding {opts.numa_binding} and --bind_cores_to_rank both choose the workers' CPUs; "
                          "give one of them.")
    if not opts.numa_binding:
        core_list = parse_cpu_list(opts.bind_core_list) if opts.bind_core_list else None
        return placement.core_cpus(topology, nper, core_list), ()
    if gpus is None:
        raise LaunchError(f"--numa-binding {opts.numa_binding} binds each worker to the CPUs near its GPU, but the "
                          "workers here are CPU workers; give them cores of their own with --bind_cores_to_rank.")
    worker_gpus = [gpu_named(topology, device_of(g, env)) for g in gpus]
    visible = env.get(ev.CUDA_VISIBLE_DEVICES)
    shown = ([gpu_named(topology, v.strip()) for v in visible.split(",") if v.strip()] if visible is not None
             else list(topology.gpus))
    return placement.numa_cpus(opts.numa_binding, topology, worker_gpus, shown)


def thread_vars(opts: LaunchOptions, cpus: Optional[frozenset], topology, env: Mapping[str, str]) -> dict:
    """OMP_NUM_THREADS and MKL_NUM_THREADS for a worker bound to cores of its own: one thread per core. A value the
    user set is kept; where the user set OMP_NUM_THREADS, MKL_NUM_THREADS is left to follow it, as MKL does."""
    if cpus is None or opts.numa_binding or ev.OMP_NUM_THREADS in env:
        return {}
    threads = str(placement.threads_for(cpus, topology))
    return {name: threads for name in (ev.OMP_NUM_THREADS, ev.MKL_NUM_THREADS) if name not in env}
