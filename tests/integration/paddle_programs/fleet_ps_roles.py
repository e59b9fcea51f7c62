"""fleet's role parsing in parameter-server mode (Paddle 3.x has no PS runtime on CPU: roles only).

Writes OUT_DIR/role.server.N.json or role.trainer.N.json. A trainer then waits (up to 60 s) for every
server's file: server 0 serves fleet's gloo rendezvous and is done only after the trainers have used it.
"""
import glob
import json
import os
import sys
import time

import paddle
from paddle.distributed import fleet

paddle.enable_static()
role = fleet.PaddleCloudRoleMaker(is_collective=False)
role._generate_role()
kind = "server" if role._is_server() else "trainer"
index = role._server_index() if role._is_server() else role._worker_index()
result = {"role": kind, "index": index, "workers": role._worker_num(), "servers": role._server_num(),
          "server_endpoints": role._get_pserver_endpoints(), "trainer_endpoints": role._get_trainer_endpoints()}
with open(os.path.join(sys.argv[1], f"role.{kind}.{index}.json"), "w") as f:
    json.dump(result, f)
if kind == "trainer":
    deadline = time.monotonic() + 60
    while len(glob.glob(os.path.join(sys.argv[1], "role.server.*.json"))) < role._server_num() and time.monotonic() < deadline:
        time.sleep(0.2)
