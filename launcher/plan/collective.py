"""The plan of a collective job: one worker per GPU (or CPU worker) on each node, ranks, endpoints, environments. Pure.

Options, environment values and host facts in, a Plan of frozen worker specs out; no I/O, no ``os.environ``.
Bad input raises LaunchError. The nodes come from a cluster source (``clusters.registry``), the GPUs from ``devices``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Mapping, Sequence

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan import agent_store
from launcher.plan.clusters import registry
from launcher.plan.common import (check_run_options, command, control_spec, endpoint_vars, error_file_of, node_vars,
                                  python_of, run_fields)
from launcher.plan.devices import device_of, select_gpus
from launcher.plan.model import MAX_WORKERS_PER_NODE, HostFacts, LaunchOptions, Plan, WorkerSpec
from launcher.plan import node_ports
from launcher.plan.parsing import node_endpoints
from launcher.plan.roles import WORKER
from launcher.plan import streams

DEFAULT_CPU_WORKERS = 2
FR_BUFFER_ENTRIES = "2000"  # collectives torch's flight recorder keeps when the launcher switches it on


def make_collective_plan(
    opts: LaunchOptions,
    env: Mapping[str, str],
    host: HostFacts,
    find_free_ports: Callable[[str, int], Sequence[int]] = lambda ip, n: (),
) -> Plan:
    """Resolve devices, nodes, ranks, endpoints and each local worker's environment.

    ``find_free_ports(ip, n)`` is called only when one node runs without --started_port.
    """
    opts = _with_nproc_word(opts, host)
    _check_nproc(opts.nproc_per_node)
    check_run_options(opts)
    source, chosen_by = registry.choose(opts, env)
    opts = _with_defaults(opts, registry.device_defaults(source, env))
    base_env = {**env, **dict(opts.extra_env)}
    gpus, gpu_notes = select_gpus(opts, base_env, host.gpu_count)
    nper = len(gpus) if gpus is not None else (opts.nproc_per_node or DEFAULT_CPU_WORKERS)
    cluster = registry.resolve(source, env, opts, host, nper, chosen_by)
    notes = tuple(gpu_notes) + cluster.notes
    if gpus is None:
        base_env.pop(ev.SELECTED_GPUS, None)
    counts = _node_counts(opts, cluster, nper)
    return _assemble(opts, host, base_env, cluster, _every_node_ports(opts, cluster, counts, find_free_ports), gpus, notes)


def _node_counts(opts: LaunchOptions, cluster, nper: int) -> tuple:
    """Each node's number of workers, by node rank: an elastic round's (its members' seats, which may differ, as under
    torchrun), else this node's on every node."""
    counts = tuple(opts.node_workers) or (nper,) * len(cluster.node_ips)
    mine = counts[cluster.node_rank] if len(counts) == len(cluster.node_ips) else None
    if mine != nper:
        raise LaunchError(f"the round seats node {cluster.node_rank} with {mine} worker(s), but it runs {nper}; start "
                          "its launcher again.")
    return counts


def _every_node_ports(opts: LaunchOptions, cluster, counts: tuple, find_free_ports) -> tuple:
    """Each node's worker ports, by node rank: the source's, free ones (one node), or the first node's shifted
    where nodes share a host (launcher.plan.node_ports), as many as each node's workers."""
    nper = counts[cluster.node_rank]
    if cluster.node_ports is not None:
        return cluster.node_ports
    if cluster.ports is None:
        ports = tuple(find_free_ports(cluster.node_ips[cluster.node_rank], nper))
        if len(ports) != nper:
            raise LaunchError(f"could not find {nper} free ports on {cluster.node_ips[cluster.node_rank]}; give --started_port.")
        return (ports,)
    start = f"--started_port {opts.started_port}" if opts.started_port is not None else f"the start port {cluster.ports[0]}"
    return node_ports.every_node(cluster.node_ips, cluster.ports, start, counts)


def _with_defaults(opts: LaunchOptions, defaults: Mapping[str, object]) -> LaunchOptions:
    """A scheduler's values (its GPUs, its processes per node) for the options the user left unset."""
    unset = {k: v for k, v in defaults.items() if getattr(opts, k) is None}
    return dataclasses.replace(opts, **unset) if unset else opts


def _with_nproc_word(opts: LaunchOptions, host: HostFacts) -> LaunchOptions:
    """torchrun's --nproc-per-node auto (every GPU, else a worker per CPU core), gpu (every GPU), cpu (a worker per core)."""
    word = opts.nproc_per_node
    if word not in ("auto", "gpu", "cpu"):
        return opts
    if word == "gpu" and not host.gpu_count:
        raise LaunchError("--nproc_per_node gpu, but this machine has no GPU that can be found; give a number of CPU workers.")
    n = None if word != "cpu" and host.gpu_count else host.cpu_count
    return dataclasses.replace(opts, nproc_per_node=n)


def _check_nproc(n) -> None:
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int):
        raise LaunchError(f"--nproc_per_node {n!r} is not a whole number; give a count of workers such as 2.")
    if n < 1:
        raise LaunchError(f"--nproc_per_node {n} is below 1; give at least 1 worker per node.")
    if n > MAX_WORKERS_PER_NODE:
        raise LaunchError(f"--nproc_per_node {n} is more workers than a node has ports; give at most {MAX_WORKERS_PER_NODE}.")


def _assemble(opts, host, base_env, cluster, every_node, gpus, notes) -> Plan:
    ports, first = every_node[cluster.node_rank], every_node[0]  # this node's, node 0's
    nper = len(ports)
    world = sum(len(p) for p in every_node)  # each node's own number of workers (an elastic round's may differ)
    offset = sum(len(p) for p in every_node[:cluster.node_rank])  # the global rank of this node's local rank 0
    endpoints = node_endpoints(cluster.node_ips, every_node)
    files, endpoint_env = endpoint_vars(",".join(endpoints), host, base_env)
    node_ip = cluster.node_ips[cluster.node_rank]
    python = python_of(base_env, host)
    cmd = command(opts, python)
    use_agent_store = agent_store.uses_agent_store(opts.agent_store, len(cluster.node_ips), opts.no_python, python,
                                                   host.python, host.importable, host.torch_version)
    control = control_spec(opts, base_env, cluster.node_ips, first, cmd, cluster.job_id,
                           node_ports.on_host_of(cluster.node_ips, 0, every_node))
    shared = {
        ev.TRAINERS_NUM: str(world),
        ev.WORLD_SIZE: str(world),
        ev.LOCAL_WORLD_SIZE: str(nper),
        ev.GROUP_RANK: str(cluster.node_rank),
        ev.GROUP_WORLD_SIZE: str(len(cluster.node_ips)),
        ev.MASTER_ADDR: cluster.node_ips[0],
        ev.MASTER_PORT: str(first[0]),
        ev.RUN_ID: host.run_id,
        **endpoint_env,
        **paddle_collective_vars(endpoints[0], world, tuple(len(p) for p in every_node), cluster.node_rank, gpus,
                                 opts.log_dir, host, base_env),
        **torchrun_vars(opts, base_env, world, control.job_id if control else opts.job_id or host.run_id, use_agent_store),
    }
    shared.update(node_vars(base_env, host, node_ip, nper, (ev.GLOO_SOCKET_IFNAME,)))
    if opts.log_dir:  # a GPU hang leaves its trace next to the logs
        shared.update(flight_recorder_vars(opts, base_env, host.cwd))
    if opts.stream_choice and opts.stream_choice.needs_files and not opts.log_dir:
        raise LaunchError("--redirects and --tee write log files; give --log-dir too.")
    filtered = duplicates_of(opts)
    placement = ((None, {}),) * nper  # each worker's CPUs and thread variables
    if opts.places_workers:  # imported only then: a job that places nothing pays nothing
        from launcher.plan import binding

        placement, placed = binding.place(opts, host.topology, gpus, base_env, nper)
        notes += placed
    workers = []
    for local in range(nper):
        rank = offset + local
        own = {
            ev.TRAINER_ID: str(rank),
            ev.RANK: str(rank),
            ev.LOCAL_RANK: str(local),
            ev.CURRENT_ENDPOINT: endpoints[rank],
            ev.ROLE_RANK: str(rank),
            ev.ERROR_FILE: error_file_of(host, rank),
            ev.GLOBAL_RANK: str(rank),  # and Paddle 2.6/3.x's
            ev.PADDLE_LOCAL_RANK: str(local),
            ev.RANK_IN_NODE: str(local),
        }
        cpus, threads = placement[local]
        own.update(threads)
        gpu = gpus[local] if gpus is not None else None
        if gpu is not None:
            own.update({ev.SELECTED_GPUS: gpu, ev.SELECTED_ACCELERATORS: gpu, ev.LOCAL_DEVICE_IDS: gpu})
        if opts.virtual_local_rank:
            own.update(virtual_local_rank_vars(gpu, base_env))
        route = streams.route(opts.stream_choice, local, bool(opts.log_dir)) if opts.stream_choice else None
        to_file = opts.log_dir and (route is None or route.to_file)
        log_file = os.path.join(opts.log_dir, WORKER.log_name_of(rank)) if to_file else None
        duplicated = streams.teed(route, bool(log_file), local) & sum(d.stream for d in filtered)
        workers.append(WorkerSpec(rank, local, endpoints[rank], gpu, cmd, {**shared, **own}, log_file, route=route,
                                  duplicated=duplicated, cpus=cpus))
    copied = streams.NONE
    for w in workers:
        copied |= w.duplicated
    notes += tuple(_nothing_copied(stream) for stream, filters in _filters(opts) if filters and not copied & stream)
    return Plan(
        node_ips=cluster.node_ips,
        node_rank=cluster.node_rank,
        world_size=world,
        ports=ports,
        device="gpu" if gpus is not None else "cpu",
        workers=tuple(workers),
        notes=notes,
        cpu_default=gpus is None and opts.nproc_per_node is None,
        gpus_not_found=gpus is not None and not host.gpu_count,
        control=control,
        straggler_policy=opts.straggler_policy,
        cluster=cluster.description,
        agent_store=agent_store.served_store(use_agent_store, cluster.node_rank, cluster.node_ips[0], first[0]),
        node_ports=every_node,
        duplicates=tuple(d for d in filtered if copied & d.stream),
        **run_fields(opts, base_env, files, node_ip),
    )


def duplicates_of(opts: LaunchOptions) -> tuple:
    """torchrun's --duplicate-stdout-filters and --duplicate-stderr-filters as ``streams.Duplicate``s: one per
    stream that has filters, copied into the log dir's filtered_stdout.log or filtered_stderr.log (none without
    --log_dir, where no stream is teed)."""
    if not opts.log_dir:
        return ()
    return tuple(streams.Duplicate(stream, tuple(filters), os.path.join(opts.log_dir, streams.FILTERED_FILES[stream]))
                 for stream, filters in _filters(opts) if filters)


def _filters(opts: LaunchOptions) -> tuple:
    return (streams.OUT, opts.duplicate_stdout_filters), (streams.ERR, opts.duplicate_stderr_filters)


def _nothing_copied(stream: int) -> str:
    option = "--duplicate-stdout-filters" if stream == streams.OUT else "--duplicate-stderr-filters"
    return (f"{option} copies the lines of the streams that go to a log file and to the console (--tee, or the "
            f"node's first worker with --log_dir alone), and no worker's is: nothing is copied.")


def virtual_local_rank_vars(gpu, env: Mapping[str, str]) -> dict:
    """torchrun's --virtual-local-rank: every worker is local rank 0 (LOCAL_RANK, and Paddle's PADDLE_LOCAL_RANK and
    PADDLE_RANK_IN_NODE alike), and a GPU worker sees its own GPU alone: CUDA_VISIBLE_DEVICES narrowed to it, so that it
    is device 0, which FLAGS_selected_gpus and the other device ids then name. LOCAL_WORLD_SIZE stays the node's count;
    a CPU worker's CUDA_VISIBLE_DEVICES stays as it was."""
    out = {ev.LOCAL_RANK: "0", ev.PADDLE_LOCAL_RANK: "0", ev.RANK_IN_NODE: "0"}
    if gpu is not None:
        out.update({ev.CUDA_VISIBLE_DEVICES: device_of(gpu, env), ev.SELECTED_GPUS: "0", ev.SELECTED_ACCELERATORS: "0",
                    ev.LOCAL_DEVICE_IDS: "0"})
    return out


def flight_recorder_vars(opts: LaunchOptions, env: Mapping[str, str], cwd: str) -> dict:
    """Where torch's NCCL flight recorder writes its dumps (next to the logs) and, when a stop takes stacks
    (--hang_timeout, --dump_stacks), the recorder switched on with the pipe the launcher pokes for a dump.
    A variable the user set is kept."""
    stem = os.path.normpath(os.path.join(cwd, opts.log_dir, "nccl_trace_rank_"))
    wanted = {ev.FR_DUMP_TEMP_FILE: stem, ev.FR_DUMP_TEMP_FILE_OLD: env.get(ev.FR_DUMP_TEMP_FILE, stem)}
    if opts.hang_timeout is not None or opts.dump_stacks:
        wanted[ev.FR_PIPE_FILE] = stem
        if ev.FR_BUFFER_SIZE not in env and ev.FR_BUFFER_SIZE_OLD not in env:
            wanted[ev.FR_BUFFER_SIZE] = wanted[ev.FR_BUFFER_SIZE_OLD] = FR_BUFFER_ENTRIES
    return {name: value for name, value in wanted.items() if name not in env}


def paddle_collective_vars(master: str, world: int, counts: tuple, node_rank: int, gpus, log_dir, host: HostFacts,
                           env: Mapping[str, str]) -> dict:
    """What Paddle 2.6/3.x's launcher gives every collective worker of a node, beyond Paddle 1.8's variables;
    ``counts``: each node's number of workers, by node rank."""
    nper = counts[node_rank]
    out = {ev.PADDLE_MASTER: master, ev.GLOBAL_SIZE: str(world), ev.LOCAL_SIZE: str(nper), ev.NNODES: str(len(counts))}
    if gpus is None and ev.DISTRI_BACKEND not in env:
        out[ev.DISTRI_BACKEND] = "gloo"  # as Paddle's launcher: with "auto", a CPU build of Paddle creates no group
    if gpus is not None:  # a node of this one's size runs the same GPUs; one of another size, its first ones
        out[ev.WORLD_DEVICE_IDS] = ",".join(":".join(gpus if n == nper else map(str, range(n))) for n in counts)
    if log_dir:
        out[ev.LOG_DIR] = os.path.normpath(os.path.join(host.cwd, log_dir))
    return out


def torchrun_vars(opts: LaunchOptions, env: Mapping[str, str], world: int, run_id: str, agent_hosts_store: bool = False) -> dict:
    """What torchrun's agent gives every worker besides RANK and the like: one role, all ranks in it.
    The store is node 0's launcher's (TORCHELASTIC_USE_AGENT_STORE=True: every rank a client, as under
    torchrun), or rank 0's (False: rank 0 hosts it, torch's env:// rule without an agent)."""
    return {
        ev.ROLE_NAME: opts.role,
        ev.ROLE_WORLD_SIZE: str(world),
        ev.ELASTIC_RUN_ID: run_id,
        ev.ELASTIC_MAX_RESTARTS: str(opts.max_restarts),
        ev.ELASTIC_USE_AGENT_STORE: str(agent_hosts_store),
        ev.NCCL_ASYNC_ERROR_HANDLING: env.get(ev.NCCL_ASYNC_ERROR_HANDLING, "1"),
    }
