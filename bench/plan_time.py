"""Benchmark helper for planning: time to compute the launch plan of node 0 in a big cluster,
and the size of the environment the launcher adds for one worker. Starts no process.

    plan_time.py ours|torchrun NODES GPUS_PER_NODE REPEATS

Prints one JSON object: {"seconds": median time of one plan, "env_bytes": the largest worker's
added variables, counted as the kernel stores them (NAME=value plus a NUL byte)}.

ours:     launcher.plan.planner.make_plan for --cluster_node_ips of NODES addresses, --selected_gpus 0..G-1.
torchrun: what torch.distributed.elastic's agent of node 0 computes for the same cluster once
          rendezvous is done: worker ranks (_assign_worker_ranks, against a real in-process
          TCPStore holding the other nodes' role infos, as the agent of node 0 hosts it) and the
          worker environments (_start_workers, with process creation replaced by a recorder).
"""

import json
import os
import statistics
import sys
import time

SCRIPT = "train.py"
PORT = 6170


def node_ips(nodes: int) -> list:
    return [f"10.1.{i // 256}.{i % 256}" for i in range(nodes)]


def env_bytes(env: dict) -> int:
    return sum(len(k) + len(v) + 2 for k, v in env.items())


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours(nodes: int, gpus: int, repeats: int) -> dict:
    from launcher.plan.model import HostFacts, LaunchOptions
    from launcher.plan.planner import make_plan

    ips = node_ips(nodes)
    opts = LaunchOptions(
        training_script=SCRIPT, cluster_node_ips=",".join(ips), node_ip=ips[0],
        started_port=PORT, selected_gpus=",".join(map(str, range(gpus))),
    )
    host = HostFacts(gpu_count=gpus, cpu_count=os.cpu_count() or 1, python=sys.executable)
    env = dict(os.environ)
    plan = make_plan(opts, env, host)
    size = max(env_bytes(dict(w.env)) for w in plan.workers)
    return {"seconds": median_time(lambda: make_plan(opts, env, host), repeats), "env_bytes": size}


def torchrun(nodes: int, gpus: int, repeats: int) -> dict:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.agent.server import api, local_elastic_agent
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rdzv_registry
    from torch.distributed.run import config_from_args, get_args_parser

    ips = node_ips(nodes)
    args = get_args_parser().parse_args([
        "--nnodes", str(nodes), "--nproc-per-node", str(gpus), "--node-rank", "0",
        "--master-addr", ips[0], "--master-port", str(PORT), SCRIPT,
    ])
    config, cmd, cmd_args = config_from_args(args)
    params = RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
        min_nodes=config.min_nodes, max_nodes=config.max_nodes, **config.rdzv_configs,
    )
    spec = api.WorkerSpec(
        role=config.role, local_world_size=config.nproc_per_node, entrypoint=cmd,
        args=tuple(cmd_args), rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
        master_addr=ips[0], master_port=PORT,
    )
    agent = local_elastic_agent.LocalElasticAgent(spec=spec, logs_specs=config.logs_specs)
    recorded = []

    class Recorder:
        def __init__(self, envs):
            recorded.append(envs)
            self.envs = envs

        def pids(self):
            return {rank: 0 for rank in self.envs}

    local_elastic_agent.start_processes = lambda **kw: Recorder(kw["envs"])
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for rank in range(1, nodes):  # what the other nodes' agents write during rendezvous
        info = api._RoleInstanceInfo(spec.role, rank, gpus)
        store.set(f"torchelastic/role_info/{rank}", info.serialize())

    def plan():
        group = agent._worker_group
        group.workers = agent._assign_worker_ranks(store, 0, nodes, spec)
        group.store, group.group_rank, group.group_world_size = store, 0, nodes
        group.master_addr, group.master_port = ips[0], PORT
        agent._start_workers(group)

    seconds = median_time(plan, repeats)
    size = max(env_bytes(env) for env in recorded[-1].values())
    return {"seconds": seconds, "env_bytes": size}


if __name__ == "__main__":
    side, n, g, r = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps({"ours": ours, "torchrun": torchrun}[side](n, g, r)))
