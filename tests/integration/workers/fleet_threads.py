"""The short fleet script, noting which threads the process still has once the runtime has left the job.

The note is written by an atexit function registered before the runtime's own, so it runs after it:
OUT/threads.RANK holds the thread names (from /proc) at that point.
"""

import atexit
import os
import sys


def note_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in sorted(os.listdir("/proc/self/task"))]
    with open(os.path.join(sys.argv[1], f"threads.{os.environ['RANK']}"), "w") as f:
        f.write("\n".join(names))


atexit.register(note_threads)

import torch  # noqa: E402

from launcher import fleet  # noqa: E402

fleet.init()
model = torch.nn.Linear(4, 2)
optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))  # imports torch.distributed.nn
for _ in range(5):
    optimizer.minimize(model(torch.rand(3, 4)).sum())
