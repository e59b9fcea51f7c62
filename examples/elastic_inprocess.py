"""An elastic job whose workers survive membership changes in place (``launcher.runtime.elastic``).

On every node (here three on one machine):

    python -m launcher --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=job1 examples/elastic_inprocess.py --steps 1000

Each step is a data-parallel step of a small model (about 0.05 s on a CPU): each rank takes its share of a
batch, the gradients are all-reduced, the optimizer steps. Lose a node and the survivors go on in the same
processes (the same ``pid=``) at the next step, in a smaller world; start a launcher again and it joins,
with the survivors' parameters. One line per step and rank:

    time=1733350000.123 step=42 world=3 rank=0 pid=4242 loss=0.0312 round=0 source=0

``--check FILE``: each rank writes, at each round's first step, a digest of its parameters there (one JSON
line), so that a test can check that every rank of a round holds the same ones, bit for bit.

``--fleet``: the same program written with Fleet's API (``fleet.elastic_run`` instead of ``fleet.init``, and
``fleet.distributed_optimizer`` averaging the gradients, wrapped again in each round).
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

from launcher import fleet
from launcher.runtime import elastic

BATCH = 256
FEATURES = 64


def batch_of(step: int):
    """The step's whole batch, the same on every rank: a fixed linear map plus noise."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    w = torch.linspace(-1, 1, FEATURES).unsqueeze(1)
    return x, x @ w + 0.01 * torch.randn(BATCH, 1, generator=g)


def digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def device_of_worker() -> torch.device:
    """The worker's GPU where there is one (NCCL), else the CPU (gloo): what ``elastic.run`` picks too."""
    if torch.cuda.is_available() and "FLAGS_selected_gpus" in os.environ:
        return torch.device("cuda", int(os.environ["FLAGS_selected_gpus"].split(",")[0]))
    return torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--check", default=None, help="a file each rank appends its parameters' digest to")
    parser.add_argument("--fleet", action="store_true", help="Fleet's API: fleet.elastic_run, fleet.distributed_optimizer")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = device_of_worker()
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    state = {"model": model, "optimizer": optimizer, "step": 0}

    def train(round_: elastic.Round) -> None:
        first = True
        step = fleet.distributed_optimizer(optimizer) if args.fleet else optimizer  # Fleet: the gradients averaged
        while state["step"] < args.steps:
            x, y = (t.to(device) for t in batch_of(state["step"]))
            share = slice(round_.rank * BATCH // round_.world_size, (round_.rank + 1) * BATCH // round_.world_size)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[share]), y[share])
            loss.backward()
            if not args.fleet:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= round_.world_size
            if first and args.check:
                with open(args.check, "a") as f:
                    f.write(json.dumps({"world": round_.world_size,
                                        "step": state["step"], "rank": round_.rank, "pid": os.getpid(),
                                        "digest": digest(model)}) + "\n")
                first = False
            step.step()
            state["step"] += 1
            print(f"time={time.time():.3f} step={state['step']} world={round_.world_size} rank={round_.rank} "
                  f"pid={os.getpid()} loss={loss.item():.4f} round={round_.number} source={round_.source}", flush=True)
            time.sleep(0.04)

    run = fleet.elastic_run if args.fleet else elastic.run
    run(train, state, backend="nccl" if device.type == "cuda" else "gloo")


if __name__ == "__main__":
    main()
