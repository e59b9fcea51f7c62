"""A pytorch/examples-style elastic worker: it loads rank 0's checkpoint at the start (if any), runs
STEPS steps of one gloo all-reduce each, rank 0 saving the state after every step, and writes one
record of its run (a line of JSON appended to FOLDER/records.jsonl).

Usage: elastic_worker.py FOLDER STEPS [hold|fail_once]: with ``hold``, each worker writes "PID WORLD_SIZE" to
FOLDER/ready.RANK once in the group and waits (60 s at most) for FOLDER/go before its steps; with ``fail_once``,
the last rank exits 3 once in the group, the first time (FOLDER/failed marks it).
With WORKER_GROUP=store it imports no torch: its group is the launcher's store, spoken as torch
does (store_group.py), and its checkpoint is JSON; the same steps, sums and records.
"""

import json
import os
import sys
import time

if os.environ.get("WORKER_GROUP") == "store":
    from store_group import group as store_group

    group = store_group()
    rank, world = group.rank, group.world
    all_reduce, barrier, close = group.all_reduce, group.barrier, group.close

    def load(path):
        with open(path) as f:
            return json.load(f)

    def save(state, path):
        with open(path, "w") as f:
            json.dump(state, f)
else:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    load, save, barrier, close = torch.load, torch.save, dist.barrier, dist.destroy_process_group

    def all_reduce(value):
        t = torch.tensor([value])
        dist.all_reduce(t)
        return t.item()

folder, steps = sys.argv[1], int(sys.argv[2])
checkpoint = os.path.join(folder, "checkpoint.pt")
state = load(checkpoint) if os.path.exists(checkpoint) else {"step": 0, "total": 0.0}
resumed = state["step"]
if sys.argv[3:] == ["fail_once"] and rank == world - 1 and not os.path.exists(os.path.join(folder, "failed")):
    open(os.path.join(folder, "failed"), "w").close()
    sys.exit(3)
if sys.argv[3:] == ["hold"]:
    with open(os.path.join(folder, f"ready.{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {world}")
    os.replace(os.path.join(folder, f"ready.{rank}.tmp"), os.path.join(folder, f"ready.{rank}"))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
total = 0.0
for step in range(resumed, resumed + steps):
    total = all_reduce(float(rank + 1))
    state = {"step": step + 1, "total": state["total"] + total}
    if rank == 0:
        save(state, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
barrier()
record = {"pid": os.getpid(), "rank": rank, "world": world, "sum": total, "resumed": resumed,
          "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR",
                                                  "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "PADDLE_TRAINER_ID",
                                                  "PADDLE_TRAINERS_NUM", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
                                                  "ROLE_RANK", "ROLE_WORLD_SIZE", "PADDLE_TRAINER_ENDPOINTS",
                                                  "PADDLE_CURRENT_ENDPOINT", "PADDLE_LOCAL_SIZE", "PADDLE_RANK_IN_NODE")}}
with open(os.path.join(folder, "records.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")
print(f"rank {rank}/{world}: sum {total}, resumed at step {resumed}", flush=True)
close()
