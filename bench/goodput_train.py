"""The data-parallel program of bench/goodput.py: the same file under torchrun, our launcher with restarts, and ours
in place.

    goodput_train.py OUT_DIR [--until EPOCH_SECONDS] [--batch G] [--sleep S] [--checkpoint-every N] [--inprocess]

Step ``s`` trains the samples ``s*G .. s*G+G-1`` (G, the global batch, fixed whatever the world size): rank ``r``
of ``W`` takes its share ``s*G + r*G//W .. s*G + (r+1)*G//W - 1``, computes its gradients, and all gradients are
averaged in one all-reduce (gloo), which also carries every rank's wish to stop (past ``--until``), so that all
ranks stop at the same step. After the optimizer's step each rank writes one line of JSON, to its own file
``OUT_DIR/steps.<node>.<pid>.jsonl`` (flushed) and to its standard output (what its launcher keeps):

    {"gp": 1, "t": ..., "node": "n1", "world_id": 7355..., "world": 3, "rank": 1, "pid": 4242, "step": 17,
     "lo": 1664, "hi": 1696, "seq": 52}

``t`` is the time the all-reduce returned (the step's commit on this rank), ``world_id`` a random number rank 0
draws when a group forms and broadcasts (the same on every rank of one world, another for every world), ``lo``
and ``hi`` the share's sample ids (``hi`` excluded), ``seq`` this process's line count from 0 (a gap is a lost
line), ``node`` the variable GOODPUT_NODE its launcher was given.

With restarts (the default), rank 0 saves the model and the step every ``--checkpoint-every`` steps
(``OUT_DIR/checkpoint.pt``, written aside and renamed over it), and a new group starts from it: rank 0 loads it
and broadcasts the step and the parameters. With ``--inprocess`` the loop is the training function of
``launcher.runtime.elastic.run`` (the model and the step its state): the survivors of a membership change go on
from their own step, a joiner gets their state, and nothing is saved. Under our launcher each step is also
reported (``launcher.runtime.report``, its compute time), for the straggler's search.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

FEATURES, HIDDEN = 128, 768

try:  # our launcher's progress report; a no-op elsewhere (and absent under torchrun's PYTHONPATH)
    from launcher.runtime import report
except ImportError:
    def report(**_kw) -> None:
        return None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--until", type=float, default=float("inf"), help="wall-clock deadline (time.time())")
    parser.add_argument("--batch", type=int, default=96, help="the global batch: samples per step, all ranks")
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds of sleep per step (data loading, say)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between two checkpoints")
    parser.add_argument("--inprocess", action="store_true", help="re-enter in place (launcher.runtime.elastic)")
    return parser.parse_args()


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def share(step: int, batch: int, rank: int, world: int) -> tuple:
    """The sample ids ``(lo, hi)`` rank ``rank`` of ``world`` trains at ``step`` (``hi`` excluded)."""
    return step * batch + rank * batch // world, step * batch + (rank + 1) * batch // world


def samples(lo: int, hi: int) -> tuple:
    """Samples ``lo .. hi-1``: each a function of its id alone, whichever rank trains it."""
    g = torch.Generator().manual_seed(lo)
    x = torch.randn(hi - lo, FEATURES, generator=g)
    return x, x[:, :1] * 0.5 + 0.1 * torch.randn(hi - lo, 1, generator=g)


def world_id() -> int:
    """A number rank 0 draws for this group, the same on every rank."""
    drawn = torch.tensor([random.SystemRandom().getrandbits(52) if dist.get_rank() == 0 else 0], dtype=torch.int64)
    dist.broadcast(drawn, 0)
    return int(drawn[0])


class Lines:
    """This process's step lines: its own file and its standard output, numbered."""

    def __init__(self, out_dir: Path):
        self.node = os.environ.get("GOODPUT_NODE", "?")
        self.file = open(out_dir / f"steps.{self.node}.{os.getpid()}.jsonl", "a")
        self.seq = 0

    def write(self, **fields) -> None:
        line = json.dumps({"gp": 1, **fields, "node": self.node, "pid": os.getpid(), "seq": self.seq})
        self.seq += 1
        self.file.write(line + "\n")
        self.file.flush()
        print(line, flush=True)


def steps(args: argparse.Namespace, state: dict, lines: Lines, checkpoint: bool) -> None:
    """Steps in the group formed, from ``state["step"]`` (moved with each optimizer step) until all ranks stop."""
    model, optimizer = state["model"], state["optimizer"]
    rank, world, wid = dist.get_rank(), dist.get_world_size(), world_id()
    params = list(model.parameters())
    while True:
        began = time.perf_counter()
        lo, hi = share(state["step"], args.batch, rank, world)
        x, y = samples(lo, hi)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / args.batch
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([float(time.time() >= args.until)])])
        compute = time.perf_counter() - began
        dist.all_reduce(flat)
        committed = time.time()
        if flat[-1] > 0:
            break
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()
        state["step"] += 1
        lines.write(t=committed, world_id=wid, world=world, rank=rank, step=state["step"] - 1, lo=lo, hi=hi)
        report(step=state["step"], compute=compute)
        if checkpoint and rank == 0 and state["step"] % args.checkpoint_every == 0:
            save(args.out_dir / "checkpoint.pt", model, state["step"])
        time.sleep(args.sleep)
    dist.barrier()


def save(path: Path, model: torch.nn.Module, step: int) -> None:
    aside = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict()}, aside)
    os.replace(aside, path)


def resume(path: Path, model: torch.nn.Module) -> int:
    """Rank 0's checkpoint (if any) on every rank: its step returned, its parameters loaded."""
    step = torch.zeros(1, dtype=torch.int64)
    if dist.get_rank() == 0 and path.exists():
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        step[0] = saved["step"]
    dist.broadcast(step, 0)
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    return int(step[0])


def main() -> int:
    args = parse()
    torch.set_num_threads(1)
    model = make_model()
    state = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01), "step": 0}
    lines = Lines(args.out_dir)
    if args.inprocess:
        from launcher.runtime import elastic

        elastic.run(lambda _round: steps(args, state, lines, checkpoint=False), state, backend="gloo")
        return 0
    dist.init_process_group("gloo")
    state["step"] = resume(args.out_dir / "checkpoint.pt", model)
    steps(args, state, lines, checkpoint=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
