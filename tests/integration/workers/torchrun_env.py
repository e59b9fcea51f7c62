"""Writes DIR/env.RANK.json: the variables torchrun gives a worker, and what torch itself makes of them (with
WORKER_GROUP=store, conftest.workers_without_torch's: the variables alone, no torch imported)."""

import json
import os
import sys

if os.environ.get("WORKER_GROUP") == "store":
    def is_torchelastic_launched():
        return None
else:
    from torch.distributed import is_torchelastic_launched

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
         "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
         "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
         "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
record = {name: os.environ.get(name) for name in NAMES}
record["is_torchelastic_launched"] = is_torchelastic_launched()
record["executable"] = sys.executable
record["marker"] = os.environ.get("PYTHON_EXEC_MARKER")
with open(os.path.join(sys.argv[1], f"env.{record['RANK']}.json"), "w") as f:
    json.dump(record, f)
