"""The training loops users write around fleet, on 2 ranks, each compared with one process on the whole batch.

    fleet_cases.py OUT_DIR CASE...

Every rank writes OUT_DIR/cases.RANK.json: for each case, the largest difference to the one-process
reference (a private copy trained on both shards, no communication) and what else the case checks.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from launcher import fleet

STEPS = 6


def batch(step, rank=None, size=8):
    """The global batch of ``step`` (2 shards of ``size``), or rank ``rank``'s shard of it."""
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.rand(2 * size, 4, generator=g), torch.randint(0, 2, (2 * size,), generator=g)
    return (x, y) if rank is None else (x[rank * size:(rank + 1) * size], y[rank * size:(rank + 1) * size])


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def clip(rank, use_model):
    """backward, clip_grad_norm_(0.1), step: the norm is the one of the averaged gradients."""
    model, reference = mlp(), mlp()
    net = fleet.distributed_model(model) if use_model else model
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(net, *batch(step, rank)).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        ref_opt.zero_grad()
        loss_of(reference, *batch(step)).backward()
        nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        ref_opt.step()
    return {"diff": (flat(model) - flat(reference)).abs().max().item()}


def scaler(rank, use_model):
    """GradScaler's loop; at step 2 rank 1's shard holds an inf, so every rank (and one process) skips that step."""
    model, reference = mlp(), mlp()
    net = fleet.distributed_model(model) if use_model else model
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2) for _ in range(2)]
    for step in range(STEPS):
        x, y = batch(step)
        if step == 2:
            x[-1, 0] = float("inf")
        n = len(x) // 2
        for s, m, opt, (xb, yb) in ((scalers[0], net, optimizer, (x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n])),
                                    (scalers[1], reference, ref_opt, (x, y))):
            opt.zero_grad()
            s.scale(loss_of(m, xb, yb)).backward()
            s.unscale_(opt)
            nn.utils.clip_grad_norm_(m.parameters() if m is reference else model.parameters(), 1.0)
            s.step(opt)
            s.update()
    return {"diff": (flat(model) - flat(reference)).abs().max().item(), "scale": scalers[0].get_scale(),
            "reference_scale": scalers[1].get_scale()}


class Branches(nn.Module):
    """``extra`` is used by rank 1 on even steps only; ``never`` by nobody."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.extra, self.never = nn.Linear(4, 2), nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x, use_extra):
        return self.body(x) + (self.extra(x) if use_extra else 0)


def unused(rank, _use_model):
    """AdamW with weight decay: a parameter no rank used in a step must not move in that step."""
    model, reference = Branches(), Branches()
    optimizer = fleet.distributed_optimizer(torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1))
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.1, weight_decay=0.1)
    for step in range(STEPS):
        uses = [False, step % 2 == 0]
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(batch(step, rank)[0], uses[rank]), batch(step, rank)[1]).backward()
        optimizer.step()
        ref_opt.zero_grad()
        sum(nn.functional.cross_entropy(reference(batch(step, r)[0], uses[r]), batch(step, r)[1]) for r in (0, 1)).div(2).backward()
        ref_opt.step()
    return {"diff": (flat(model) - flat(reference)).abs().max().item(), "never_grad": model.never.weight.grad is None,
            "never_moved": not torch.equal(model.never.weight, Branches().never.weight)}


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))


def buffers(rank, _use_model):
    """distributed_model and distributed_optimizer leave the same BatchNorm statistics on each rank."""
    found = []
    for use_model in (True, False):
        model = bn_model()
        net = fleet.distributed_model(model) if use_model else model
        optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for step in range(STEPS):
            optimizer.zero_grad()
            loss_of(net, *batch(step, rank)).backward()
            optimizer.step()
        found.append(model[1].running_mean.clone())
    local = bn_model()[1]
    every = [torch.empty_like(found[0]) for _ in range(2)]
    dist.all_gather(every, found[0])
    return {"diff": (found[0] - found[1]).abs().max().item(), "ranks_differ": not torch.equal(every[0], every[1]),
            "not_initial": not torch.equal(found[0], local.running_mean)}


class Executor:
    """What a Paddle script passes first to fleet.save_persistables (fluid.Executor)."""


def save(rank, _use_model, out):
    """Rank 0 alone saves (Paddle's habit), then every rank saves; then every rank loads rank 0's save."""
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    optimizer.minimize(loss_of(model, *batch(0, rank)))
    if fleet.worker_index() == 0:
        fleet.save_persistables(Executor(), os.path.join(out, "rank0"), main_program=model)
    total = torch.ones(3)
    dist.all_reduce(total)  # the next collective after a rank-0-only save
    with torch.no_grad():
        model[0].bias.fill_(rank + 1.0)  # ranks differ now: the load must give rank 0's
    fleet.save_persistables(os.path.join(out, "every"), model, optimizer)
    loaded = mlp()
    loaded_opt = torch.optim.SGD(loaded.parameters(), lr=9.0, momentum=0.9)
    fleet.load_persistables(os.path.join(out, "every"), loaded, loaded_opt)
    return {"diff": 0.0, "all_reduce": total.tolist(), "rank0_files": sorted(os.listdir(os.path.join(out, "rank0"))),
            "loaded_bias": loaded[0].bias.unique().tolist(), "loaded_lr": loaded_opt.param_groups[0]["lr"],
            "momentum": len(loaded_opt.state)}


def paddle_minimize(rank, _use_model):
    """optimizer.minimize(cost, startup_program, parameter_list=..., no_grad_set=...): only the listed layer moves."""
    model, reference = mlp(), mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    ref_opt = torch.optim.SGD(reference[2].parameters(), lr=0.5)
    startup_program = object()  # what fluid.default_startup_program() stands for
    for step in range(STEPS):
        optimizer.minimize(loss_of(model, *batch(step, rank)), startup_program,
                           parameter_list=list(model.parameters()), no_grad_set={model[0].weight, model[0].bias})
        ref_opt.zero_grad()
        loss_of(reference, *batch(step)).backward()
        ref_opt.step()
    return {"diff": (flat(model) - flat(reference)).abs().max().item(), "first_layer_grad": model[0].weight.grad is None}


def ddp_options(rank, _use_model):
    """distributed_model(model, strategy, find_unused_parameters=True): DDP's own option, for a layer some steps skip."""
    model, reference = Branches(), Branches()
    del model.never, reference.never
    net = fleet.distributed_model(model, fleet.DistributedStrategy(), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(STEPS):
        use = step % 2 == 0
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(batch(step, rank)[0], use), batch(step, rank)[1]).backward()
        optimizer.step()
        ref_opt.zero_grad()
        nn.functional.cross_entropy(reference(batch(step)[0], use), batch(step)[1]).backward()
        ref_opt.step()
    return {"diff": (flat(model) - flat(reference)).abs().max().item()}


def accumulate_in_place(rank, _use_model):
    """zero_grad(set_to_none=False) and two backward passes per step, each averaged: the gradients accumulate in place
    in the buckets (each gradient is its bucket's view), as one process accumulates the two batches' gradients."""
    model, reference = mlp(), mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=False)
        ref_opt.zero_grad(set_to_none=False)
        for micro in (2 * step, 2 * step + 1):
            loss_of(model, *batch(micro, rank)).backward()
            loss_of(reference, *batch(micro)).backward()
        optimizer.step()
        ref_opt.step()
    return {"diff": (flat(model) - flat(reference)).abs().max().item()}


def conv_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))


def channels_last(rank, _use_model):
    """A convolutional model in channels_last: its weights' gradients keep their own layout, and are averaged."""
    model, reference = conv_model().to(memory_format=torch.channels_last), conv_model()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)
    images, labels = torch.rand(STEPS, 8, 3, 8, 8, generator=g), torch.randint(0, 2, (STEPS, 8), generator=g)
    for step in range(STEPS):
        x, y = images[step], labels[step]
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[rank * 4:(rank + 1) * 4].contiguous(memory_format=torch.channels_last)),
                                    y[rank * 4:(rank + 1) * 4]).backward()
        optimizer.step()
        ref_opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    layouts = all(p.is_contiguous(memory_format=torch.channels_last) for p in model.parameters() if p.dim() == 4)
    return {"diff": (flat(model) - flat(reference)).abs().max().item(), "channels_last": layouts}


CASES = {
    "accumulate_in_place": lambda rank, out: accumulate_in_place(rank, False),
    "channels_last": lambda rank, out: channels_last(rank, False),
    "clip_optimizer": lambda rank, out: clip(rank, False),
    "clip_model": lambda rank, out: clip(rank, True),
    "scaler_optimizer": lambda rank, out: scaler(rank, False),
    "scaler_model": lambda rank, out: scaler(rank, True),
    "unused": lambda rank, out: unused(rank, False),
    "buffers": lambda rank, out: buffers(rank, False),
    "save": lambda rank, out: save(rank, False, out),
    "paddle_minimize": lambda rank, out: paddle_minimize(rank, False),
    "ddp_options": lambda rank, out: ddp_options(rank, False),
}


def main():
    out, names = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)
    rank = fleet.init(timeout=30).rank  # a case that desynchronises the ranks fails in 30 s, not 30 minutes
    results = {}
    for name in names:
        results[name] = CASES[name](rank, out)
        fleet.barrier_worker()
    with open(os.path.join(out, f"cases.{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
