"""Benchmark worker of bench/elastic.py: an elastic training loop that resumes from rank 0's checkpoint.

    elastic_train.py OUT_DIR [--until EPOCH_SECONDS] [--steps N] [--sleep S] [--inprocess]

Joins the gloo group (``init_process_group("gloo")``, from the launcher's variables), takes the step
number from rank 0's checkpoint (OUT_DIR/checkpoint.json, if any; rank 0 reads it and broadcasts it,
so the ranks agree whatever their file systems), then runs steps: one small all-reduce (which also
carries every rank's wish to stop: past ``--until`` or at ``--steps``, so that all ranks stop at the
same step), then rank 0 saves the step (written aside, then renamed over the checkpoint), every rank
appends one line of JSON to OUT_DIR/steps.<pid>.jsonl (flushed) and sleeps ``--sleep`` seconds:

    {"t": time.time(), "step": n, "rank": r, "world": w, "pid": os.getpid(), "host_pid": its parent}

``host_pid`` is the worker's parent, the launcher of its node under both launchers measured. At the
end: a barrier, the group destroyed, exit 0. With ``--inprocess`` the loop is the training function of
``launcher.runtime.elastic.run`` (the step is its state): the survivors of a membership change go on in their
processes, and a joiner takes the step from them.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--until", type=float, default=float("inf"), help="wall-clock deadline (time.time())")
    parser.add_argument("--steps", type=int, default=1 << 30, help="the step to stop at")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds of sleep per step")
    parser.add_argument("--inprocess", action="store_true", help="re-enter in place (launcher.runtime.elastic)")
    return parser.parse_args()


def resumed_step(checkpoint: Path, rank: int) -> int:
    """Rank 0's saved step (0 without a checkpoint), the same on every rank."""
    step = torch.zeros(1, dtype=torch.int64)
    if rank == 0 and checkpoint.exists():
        step[0] = json.loads(checkpoint.read_text())["step"]
    dist.broadcast(step, 0)
    return int(step[0])


def save(checkpoint: Path, step: int) -> None:
    aside = checkpoint.with_suffix(".tmp")
    aside.write_text(json.dumps({"step": step}))
    os.replace(aside, checkpoint)


def steps(args: argparse.Namespace, state: dict) -> None:
    """Steps in the group formed, from ``state["step"]`` (moved with each step) until every rank stops."""
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = args.out_dir / "checkpoint.json"
    with open(args.out_dir / f"steps.{os.getpid()}.jsonl", "a") as log:
        while True:
            flags = torch.tensor([1.0, float(state["step"] >= args.steps or time.time() >= args.until)])
            dist.all_reduce(flags)
            if flags[1] > 0:
                break
            state["step"] += 1
            if rank == 0:
                save(checkpoint, state["step"])
            log.write(json.dumps({"t": time.time(), "step": state["step"], "rank": rank, "world": world,
                                  "pid": os.getpid(), "host_pid": os.getppid()}) + "\n")
            log.flush()
            time.sleep(args.sleep)
    dist.barrier()


def main() -> int:
    args = parse()
    if args.inprocess:
        from launcher.runtime import elastic

        state = {"step": 0}
        elastic.run(lambda _round: steps(args, state), state)
        return 0
    dist.init_process_group("gloo")
    steps(args, {"step": resumed_step(args.out_dir / "checkpoint.json", dist.get_rank())})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
