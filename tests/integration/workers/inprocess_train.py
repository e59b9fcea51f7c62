"""A worker that re-enters in place (launcher.runtime.elastic.run): the data-parallel steps of
examples/elastic_inprocess.py, with what the tests of tests/integration/test_inprocess*.py watch.

    inprocess_train.py FOLDER [STEPS]

Each step, one line on stdout (``step=N world=W rank=R pid=P``); at each round's first step, one JSON line in
FOLDER/digests.jsonl: the step, world size, rank, pid and a digest of the parameters, so that a test checks
that every rank of a round holds the same ones, bit for bit. Every rank ends once it made the number of steps
that FOLDER/finish holds (or STEPS). With FOLDER/armed present, the state's gate holds
the rank that sends the state (its ``state_dict``, called only there): it writes FOLDER/sending.PID and waits
(60 s at most) for FOLDER/open, so that a test can lose a node while the state is being sent.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.runtime import elastic

FOLDER = Path(sys.argv[1])
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000


class Gate:
    """Part of the state: holds the sender while FOLDER/armed is there (see the module's docstring)."""

    def state_dict(self):
        if (FOLDER / "armed").exists():
            (FOLDER / f"sending.{os.getpid()}").touch()
            deadline = time.monotonic() + 60
            while not (FOLDER / "open").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return {}

    def load_state_dict(self, _):
        pass


def last_step() -> int:
    try:
        return int((FOLDER / "finish").read_text())
    except (OSError, ValueError):
        return STEPS


def digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    torch.manual_seed(os.getpid())  # every process starts from other parameters: only the broadcast makes them one
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    state = {"model": model, "optimizer": optimizer, "step": 0, "gate": Gate()}

    def train(round_):
        first = True
        while state["step"] < last_step():
            g = torch.Generator().manual_seed(state["step"])
            x = torch.randn(32, 16, generator=g)
            y = x.sum(dim=1, keepdim=True)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= round_.world_size
            if first:
                with open(FOLDER / "digests.jsonl", "a") as f:
                    f.write(json.dumps({"step": state["step"], "world": round_.world_size, "rank": round_.rank,
                                        "pid": os.getpid(), "digest": digest(model)}) + "\n")
                first = False
            optimizer.step()
            state["step"] += 1
            print(f"step={state['step']} world={round_.world_size} rank={round_.rank} pid={os.getpid()} "
                  f"loss={loss.item():.4f}", flush=True)
            time.sleep(0.02)

    elastic.run(train, state)


if __name__ == "__main__":
    main()
