"""Benchmark worker for parameter-server mode: a click-through-rate model on CPU workers.

    ctr.py API MODEL ROWS STEPS OUT_DIR

API is how the two trainers are kept in step:
  ps          our Fleet parameter-server flow in sync mode (under ``python -m launcher
              --server_num 2 --worker_num 2``): the same script runs the servers
  ddp         hand-written DistributedDataParallel (under torchrun); the embedding has dense
              gradients, as a plain DDP user writes it
  ddp-sparse  the same with ``sparse=True``: DDP on gloo all-gathers the sparse gradients
MODEL is what is trained:
  sparse  Criteo-like: 26 id slots looked up in one ``ROWS`` x 16 embedding, concatenated with
          13 dense features, then an MLP (429 -> 256 -> 128 -> 1); BCE loss, SGD
  dense   the MLP alone, on 429 dense features (ROWS is ignored)

Batch ``i`` of trainer ``r`` is drawn from a generator seeded with (r, i), so both APIs see the
same batches; the initial weights are the same everywhere (seed 0). Each trainer writes
OUT_DIR/ctr.<rank>.json: steps per second over STEPS timed steps (after WARMUP untimed ones),
its CPU time per step, its peak resident memory (VmHWM) over the whole run and over the timed
steps alone (VmHWM is reset after the warm-up), its loss at the last step, and a checksum of its
MLP's parameters.
"""

import json
import os
import re
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

WARMUP = 3
BATCH, SLOTS, DIM, DENSE = 256, 26, 16, 13
WIDTH = SLOTS * DIM + DENSE  # the MLP's input


class CTR(nn.Module):
    def __init__(self, rows: int, sparse: bool):
        super().__init__()
        self.embedding = nn.Embedding(rows, DIM, sparse=sparse)
        self.mlp = mlp()

    def forward(self, ids, dense):
        return self.mlp(torch.cat([self.embedding(ids).flatten(1), dense], 1)).squeeze(1)


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = mlp()

    def forward(self, ids, dense):
        return self.mlp(dense).squeeze(1)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))


def make_model(kind: str, rows: int, sparse: bool) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every trainer and server
    return CTR(rows, sparse) if kind == "sparse" else Dense()


def batch(rank: int, step: int, rows: int, kind: str):
    """Ids (None for the dense model), dense features and 0/1 labels of trainer ``rank``'s batch ``step``."""
    gen = torch.Generator().manual_seed(1_000_003 * (rank + 1) + step)
    ids = torch.randint(rows, (BATCH, SLOTS), generator=gen) if kind == "sparse" else None
    dense = torch.rand(BATCH, DENSE if kind == "sparse" else WIDTH, generator=gen)
    return ids, dense, torch.randint(2, (BATCH,), generator=gen).float()


def memory_kib() -> dict:
    status = open("/proc/self/status").read()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", status).group(1)) for k in ("VmHWM", "VmRSS")}


def reset_peak() -> None:
    """Start VmHWM again from the current resident size (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def train(step, rank: int, rows: int, kind: str, steps: int, model: nn.Module, out_dir: str) -> None:
    """WARMUP untimed steps, then ``steps`` timed ones; write what was measured."""
    loss = None
    for i in range(WARMUP):
        loss = step(*batch(rank, i, rows, kind))
    whole_run = memory_kib()["VmHWM"]
    reset_peak()
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(WARMUP, WARMUP + steps):
        loss = step(*batch(rank, i, rows, kind))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    mem = memory_kib()
    result = {
        "steps_per_s": steps / elapsed, "cpu_ms_per_step": 1000 * cpu / steps,
        "peak_rss_mib": max(whole_run, mem["VmHWM"]) / 1024, "timed_peak_rss_mib": mem["VmHWM"] / 1024,
        "loss": float(loss), "checksum": float(sum(p.detach().double().sum() for p in model.mlp.parameters())),
    }
    with open(os.path.join(out_dir, f"ctr.{rank}.json"), "w") as f:
        json.dump(result, f)


def ddp(kind: str, rows: int, steps: int, out_dir: str, sparse: bool) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = make_model(kind, rows, sparse)
    wrapped = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(ids, dense, labels):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(wrapped(ids, dense), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    train(step, dist.get_rank(), rows, kind, steps, model, out_dir)
    dist.destroy_process_group()


def ps(kind: str, rows: int, steps: int, out_dir: str) -> None:
    from launcher import fleet

    role = fleet.role_maker.PaddleCloudRoleMaker(is_collective=False)
    fleet.init(role)
    model = make_model(kind, rows, sparse=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = fleet.distributed_optimizer(opt, fleet.StrategyFactory.create_sync_strategy())
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()  # returns when the trainers are done
        return
    fleet.init_worker()

    def step(ids, dense, labels):
        loss = F.binary_cross_entropy_with_logits(model(ids, dense), labels)
        opt.minimize(loss)
        return loss.detach()

    train(step, fleet.worker_index(), rows, kind, steps, model, out_dir)
    fleet.stop_worker()


def main(api: str, kind: str, rows: int, steps: int, out_dir: str) -> None:
    if api == "ps":
        ps(kind, rows, steps, out_dir)
    else:
        ddp(kind, rows, steps, out_dir, sparse=api == "ddp-sparse")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
