# -*- coding: utf-8 -*-
"""Seed 002's pserver-mode listing (分布式同步训练, "pserver 模式分布式训练") on PyTorch, around seed 000's MLP.

    python -m launcher --server_num 2 --worker_num 1 examples/dist_transpiler_pserver.py

The transpile call is the seed's, with two differences PyTorch needs: program is the model, and
the optimizer (which Paddle finds in the program) is passed. The launcher gives every process
its role and endpoints (TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, ...), as Paddle's did.
"""
import os

import torch
from torch import nn

from launcher import transpiler as fluid  # fluid.DistributeTranspilerConfig, fluid.DistributeTranspiler

torch.manual_seed(0)  # every process builds the same model
main_program = nn.Sequential(nn.Linear(32, 1280), nn.Tanh(), nn.Linear(1280, 1280), nn.Tanh(), nn.Linear(1280, 2))
optimizer = torch.optim.SGD(main_program.parameters(), lr=0.01)
trainer_id = int(os.getenv("PADDLE_TRAINER_ID", "0"))

config = fluid.DistributeTranspilerConfig()
# 配置策略 config
config.slice_var_up = False
config.print_log = True  # the placement table (Paddle's shuffle of whole parameters) in every log
t = fluid.DistributeTranspiler(config=config)
t.transpile(trainer_id,
            program=main_program,
            pservers=os.getenv("PADDLE_PSERVERS_IP_PORT_LIST", "192.168.0.1:6174,192.168.0.2:6174"),
            trainers=int(os.getenv("PADDLE_TRAINERS_NUM", "1")),
            sync_mode=True,
            optimizer=optimizer)

if os.getenv("TRAINING_ROLE") == "PSERVER":
    t.get_pserver_program(os.getenv("PADDLE_CURRENT_ENDPOINT")).run()
else:
    program = t.get_trainer_program()
    generator = torch.Generator().manual_seed(trainer_id)
    for i in range(20):
        x, y = torch.rand(128, 32, generator=generator), torch.randint(2, (128,), generator=generator)
        cost = nn.functional.cross_entropy(main_program(x), y)
        program.optimizer.minimize(cost)
        print("step%d cost=%f" % (i, cost.item()))
    program.save_persistables("./output")
    program.stop()
