"""Benchmark worker for Fleet's tuning knobs (bench/fleet_knobs.py starts it, one variant per run).

    knob_worker.py --model mlp|conv --api ddp|model|optimizer --steps N --out OUT_DIR
                   [--strategy JSON] [--device cpu|cuda] [--warmup W]

MODEL:
  mlp   the Fleet tutorial's MLP (32 -> 1280 -> 1280 -> 2, tanh; batch 128), as bench/train.py
  conv  a small CNN on 3x32x32 random images (batch 32): 5 conv + BatchNorm + ReLU, 2 max-pools,
        global average pool, linear to 10 classes (about 50 ms a step on one CPU thread)
API is how gradients are synchronised:
  ddp        hand-written DistributedDataParallel (torchrun or ours: only the env:// variables are used)
  model      our fleet.distributed_model + plain SGD (under python -m launcher)
  optimizer  our fleet.distributed_optimizer(SGD, strategy) with optimizer.minimize(loss)
--strategy sets attributes of a fleet.DistributedStrategy (JSON object, e.g. '{"nccl_comm_num": 2}');
the FLAGS_* environment variables are read by fleet itself. SGD, lr 0.01, on every API.

Each step is reported with launcher.runtime.report(step=...) (what launcher tune measures: bench/tune_vs_grid.py).
Each rank writes OUT_DIR/result.<rank>.json: steps/s over STEPS timed steps (after W untimed ones),
CPU ms per timed step of the whole process (time.process_time, every thread), and a checksum of its
parameters. Every API but local SGD keeps the ranks identical at every step: the checksum is taken
at the end. Local SGD averages the parameters only at some steps: the checksum is taken right after
the last step at which averaging was due (its index in ``checksum_step``; the timers are paused
meanwhile), the only place where the ranks must agree. With --device cuda the model is on
cuda:FLAGS_selected_gpus (ours) or cuda:LOCAL_RANK (ddp), NCCL between ranks, and each timer reading
follows a synchronize.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from launcher.runtime import report

MODELS = ("mlp", "conv")
APIS = ("ddp", "model", "optimizer")
LR = 0.01
DATA_BATCHES = 8  # distinct batches per rank, cycled


def mlp() -> nn.Module:
    """fc(1280, tanh) -> fc(1280, tanh) -> fc(2), as in the Fleet tutorial (and bench/train.py)."""
    return nn.Sequential(nn.Linear(32, 1280), nn.Tanh(), nn.Linear(1280, 1280), nn.Tanh(), nn.Linear(1280, 2))


def conv() -> nn.Module:
    """A small VGG-like CNN for 3x32x32 images: 0.14 M parameters in 17 tensors (5 convolutions and their
    BatchNorms, one linear); about 50 ms a step on one CPU thread: compute-bound, many small gradients."""
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16), nn.MaxPool2d(2),                      # 32x32 -> 16x16
        *block(16, 32), *block(32, 64), nn.MaxPool2d(2),     # 16x16 -> 8x8
        *block(64, 64), *block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(128, 10),
    )


def batches(model: str, gen: torch.Generator) -> list:
    """DATA_BATCHES (input, label) pairs, different on every rank (the generator's seed)."""
    if model == "mlp":
        return [(torch.rand(128, 32, generator=gen), torch.randint(2, (128,), generator=gen)) for _ in range(DATA_BATCHES)]
    return [(torch.randn(32, 3, 32, 32, generator=gen), torch.randint(10, (32,), generator=gen)) for _ in range(DATA_BATCHES)]


def strategy_of(settings: dict):
    from launcher import fleet

    strategy = fleet.DistributedStrategy()
    for name, value in settings.items():
        setattr(strategy, name, value)  # an unknown name is refused by the strategy itself
    return strategy


def setup(api: str, model: nn.Module, settings: dict, device_kind: str):
    """(device, the model as trained, a callable doing one step on (x, y), the strategy or None)."""
    if api == "ddp":
        if device_kind == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        model.to(device)
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
        return device, wrapped, lambda x, y: _plain_step(wrapped, opt, x, y), None
    from launcher import fleet

    device = fleet.init(is_collective=True).device
    if device.type != device_kind:
        raise SystemExit(f"knob_worker: asked for --device {device_kind}, but fleet gave this worker {device}")
    model.to(device)
    strategy = strategy_of(settings)
    if api == "model":
        if settings:
            raise SystemExit("knob_worker: --strategy is for --api optimizer (fleet.distributed_model runs with the default)")
        wrapped = fleet.distributed_model(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
        return device, wrapped, lambda x, y: _plain_step(wrapped, opt, x, y), None
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=LR), strategy)
    return device, model, lambda x, y: opt.minimize(F.cross_entropy(model(x), y)), strategy


def _plain_step(model, opt, x, y) -> None:
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def last_averaging_step(strategy, total: int):
    """Local SGD: the index (from 0) of the last of ``total`` steps after which the parameters are averaged;
    None when every step keeps the ranks identical."""
    if strategy is None or not strategy.use_local_sgd:
        return None
    from launcher.fleet.optimizer import averaging_due

    return max(i for i in range(total) if averaging_due(i, strategy))


def checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--api", choices=APIS, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="{}", help="JSON object of DistributedStrategy attributes")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    settings = json.loads(args.strategy)

    rank = int(os.environ["RANK"])
    torch.manual_seed(0)  # the same initial weights on every rank
    model = {"mlp": mlp, "conv": conv}[args.model]()
    device, _trained, step, strategy = setup(args.api, model, settings, args.device)
    data = [(x.to(device), y.to(device)) for x, y in batches(args.model, torch.Generator().manual_seed(1000 + rank))]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    total = args.warmup + args.steps
    check_at = last_averaging_step(strategy, total)
    check_at = total - 1 if check_at is None else check_at
    paused_wall = paused_cpu = 0.0
    sums = None
    for i in range(total):
        if i == args.warmup:
            sync()
            start, cpu_start = time.perf_counter(), time.process_time()
        step(*data[i % len(data)])
        report(step=i)
        if i == check_at:
            sync()
            w, c = time.perf_counter(), time.process_time()
            sums = checksum(model)
            paused_wall += time.perf_counter() - w
            paused_cpu += time.process_time() - c
    sync()
    elapsed = time.perf_counter() - start - (paused_wall if check_at >= args.warmup else 0.0)
    cpu = time.process_time() - cpu_start - (paused_cpu if check_at >= args.warmup else 0.0)
    result = {
        "model": args.model, "api": args.api, "strategy": settings, "device": str(device),
        "backend": dist.get_backend(), "world_size": dist.get_world_size(),
        "steps": args.steps, "warmup": args.warmup,
        "steps_per_s": args.steps / elapsed, "cpu_ms_per_step": 1000 * cpu / args.steps,
        "checksum": sums, "checksum_step": check_at, "local_sgd": bool(settings.get("use_local_sgd")),
        "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    path = os.path.join(args.out, f"result.{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    if args.api == "ddp":  # fleet tears its group down at exit; a DDP program must (else torch may abort at exit)
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
