"""Reads every variable torchrun's agent gives a worker (a missing one is a KeyError, exit 1), prints
them, and leaves an empty file named by its global rank in DIR. With --fail it raises instead.

usage: agent_vars.py DIR [--fail]
"""

import os
import sys
from pathlib import Path

AGENT_VARS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
              "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
              "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")

for name in (*AGENT_VARS, *os.environ.get("EXPECT_VARS", "").split()):
    print(f"{name} = {os.environ[name]}", flush=True)
if "--fail" in sys.argv:
    raise RuntimeError("asked to fail")
Path(sys.argv[1], os.environ["RANK"]).touch()
print(f"created {os.environ['RANK']}", flush=True)
