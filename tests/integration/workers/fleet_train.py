"""Train a tiny MLP data-parallel through fleet in several set-ups; write what each rank found as JSON.

    fleet_train.py OUT_DIR SCENARIO...

For every scenario each rank trains on its shard of a global batch and, on the side, trains a private
copy of the model on the whole batch without any communication (the one-process reference). It records
the largest difference to the reference, the largest difference between ranks after every step, and
what the save/load round trip gave.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from launcher import fleet

STEPS = 8
GLOBAL_BATCH = 16

# name: (api, strategy options, environment flags)
SCENARIOS = {
    "opt": ("optimizer", {}, {}),
    "opt_unfused": ("optimizer", {"fuse_all_reduce_ops": False}, {}),
    "opt_fused": ("optimizer", {"fuse_all_reduce_ops": True}, {"FLAGS_fuse_parameter_groups_size": "2"}),
    "opt_comm3": ("optimizer", {"nccl_comm_num": 3, "fuse_all_reduce_ops": True}, {"FLAGS_fuse_parameter_memory_size": "0.0001"}),
    "opt_sync": ("optimizer", {"nccl_comm_num": 2}, {"FLAGS_sync_nccl_allreduce": "1"}),
    "minimize": ("minimize", {}, {}),
    "hier": ("optimizer", {"use_hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": 2}, {}),
    "hier_comm2_fused": ("optimizer", {"use_hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": 2,
                                       "nccl_comm_num": 2, "fuse_all_reduce_ops": True}, {"FLAGS_fuse_parameter_groups_size": "3"}),
    "model": ("model", {}, {}),
    "model_unfused": ("model", {"fuse_all_reduce_ops": False}, {}),
    "model_fused": ("model", {"fuse_all_reduce_ops": True}, {"FLAGS_fuse_parameter_memory_size": "0.0001"}),
    "model_comm2": ("model", {"nccl_comm_num": 2}, {}),
    "model_hier": ("model", {"use_hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": 2}, {}),
    "local_sgd": ("optimizer", {"use_local_sgd": True, "local_sgd_steps": 3, "local_sgd_is_warm_steps": 2}, {}),
    "model_local_sgd": ("model", {"use_local_sgd": True, "local_sgd_steps": 3, "local_sgd_is_warm_steps": 2}, {}),
}
FLAG_NAMES = ("FLAGS_fuse_parameter_groups_size", "FLAGS_fuse_parameter_memory_size", "FLAGS_sync_nccl_allreduce")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 2))


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.rand(GLOBAL_BATCH, 8, generator=g), torch.randint(0, 2, (GLOBAL_BATCH,), generator=g)


def shard(x, rank, world):
    n = GLOBAL_BATCH // world
    return x[rank * n:(rank + 1) * n]


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def rank_spread(model):
    """Largest difference between this rank's parameters and any other rank's."""
    mine = flat(model)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return max((t - mine).abs().max().item() for t in every)


def run(name):
    api, options, flags = SCENARIOS[name]
    for flag in FLAG_NAMES:
        os.environ.pop(flag, None)
    os.environ.update(flags)
    rank, world = fleet.worker_index(), fleet.worker_num()
    torch.manual_seed(0)
    reference = mlp()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch.manual_seed(rank)  # every rank starts elsewhere: the wrap must make them rank 0's
    model = mlp()
    if rank == 0:
        model.load_state_dict(reference.state_dict())
    strategy = fleet.DistributedStrategy()
    for key, value in options.items():
        setattr(strategy, key, value)
    net = fleet.distributed_model(model, strategy) if api == "model" else model
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), strategy=strategy)
    spread = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = torch.nn.functional.cross_entropy(net(shard(x, rank, world)), shard(y, rank, world))
        if api == "minimize":
            optimizer.minimize(loss)
        else:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
        spread.append(rank_spread(model))
    ddp_buckets = None
    if api == "model":  # DDP's buckets as rebuilt after the first step
        ddp_buckets = len(str(net._get_ddp_logging_data()["rebuilt_bucket_sizes"]).split(","))
    return {"reference_diff": (flat(model) - flat(reference)).abs().max().item(), "spread": spread, "ddp_buckets": ddp_buckets,
            "buckets": len(optimizer._sync.buckets), "channels": len(optimizer._sync.channels),
            "optimizer_allreduces": optimizer._sync.calls}


def local_sgd_adam():
    """Local SGD with Adam against Paddle 1.8's LocalSGD program (python/paddle/fluid/transpiler/collective.py,
    LocalSGD._transpile_main_program): after each rank's own optimizer step, param = snapshot - allreduce_sum(
    snapshot - param) / nranks (the mean over ranks), snapshot = param; no gradient is all-reduced. Here that
    runs at each warm-up step and then every local_sgd_steps, simulated on one copy per rank."""
    rank, world = fleet.worker_index(), fleet.worker_num()
    strategy = fleet.DistributedStrategy()
    strategy.use_local_sgd, strategy.local_sgd_steps, strategy.local_sgd_is_warm_steps = True, 3, 2
    torch.manual_seed(0)
    model = mlp()
    copies = [mlp() for _ in range(world)]
    for c in copies:
        c.load_state_dict(model.state_dict())
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.05), strategy)
    ref_opts = [torch.optim.Adam(c.parameters(), lr=0.05) for c in copies]
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(shard(x, rank, world)), shard(y, rank, world)).backward()
        optimizer.step()
        for r, (c, o) in enumerate(zip(copies, ref_opts)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(c(shard(x, r, world)), shard(y, r, world)).backward()
            o.step()
        if step < 2 or (step - 2) % 3 == 0:
            with torch.no_grad():
                for ps in zip(*(c.parameters() for c in copies)):
                    mean = torch.stack([p.detach() for p in ps]).mean(0)
                    for p in ps:
                        p.copy_(mean)
    return {"reference_diff": (flat(model) - flat(copies[rank])).abs().max().item(), "spread": [],
            "optimizer_allreduces": optimizer._sync.calls}


def save_load(out):
    """Ranks hold different values; after the save, every rank loads rank 0's."""
    rank = fleet.worker_index()
    model = mlp()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(rank + 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5 + rank)
    where = os.path.join(out, "saved")
    fleet.save_persistables(where, model, optimizer)
    fresh, fresh_opt = mlp(), torch.optim.SGD(mlp().parameters(), lr=9.0)
    fleet.load_persistables(where, fresh, fresh_opt)
    return {"files": sorted(os.listdir(where)), "loaded": sorted({p.detach().unique().item() for p in fresh.parameters()}),
            "lr": fresh_opt.param_groups[0]["lr"]}


def main():
    out, names = sys.argv[1], sys.argv[2:]
    penv = fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=True))
    result = {"rank": penv.rank, "world_size": penv.world_size, "backend": penv.backend, "device": str(penv.device),
              "endpoints": fleet.worker_endpoints(), "first": fleet.is_first_worker()}
    for name in names:
        result[name] = save_load(out) if name == "save_load" else local_sgd_adam() if name == "local_sgd_adam" else run(name)
        fleet.barrier_worker()
    with open(os.path.join(out, f"result.{penv.rank}.json"), "w") as f:
        json.dump(result, f)
    print("done", penv.rank, flush=True)


if __name__ == "__main__":
    main()
