"""A real fleet parameter-server program (Paddle 2.6: static graph, a sparse embedding on the servers,
asynchronous SGD), then fleet.util.all_reduce across the trainers.

Each trainer writes OUT_DIR/ps.N.json: its index, the trainer count, the all_reduce sum of 1.0 from each
trainer (right: the number of trainers), its last loss.
"""
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

paddle.enable_static()
fleet.init()
ids = paddle.static.data(name="ids", shape=[None, 1], dtype="int64")
label = paddle.static.data(name="label", shape=[None, 1], dtype="float32")
emb = paddle.static.nn.sparse_embedding(input=ids, size=[1000, 8])
pred = paddle.static.nn.fc(paddle.reshape(emb, [-1, 8]), size=1)
loss = paddle.mean(paddle.square(pred - label))
strategy = fleet.DistributedStrategy()
strategy.a_sync = True
optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.05), strategy)
optimizer.minimize(loss)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    rng = np.random.default_rng(fleet.worker_index())
    for _ in range(20):
        batch = rng.integers(0, 1000, size=(16, 1)).astype("int64")
        (last,) = exe.run(paddle.static.default_main_program(),
                          feed={"ids": batch, "label": (batch % 7).astype("float32")}, fetch_list=[loss])
    total = fleet.util.all_reduce(np.array([1.0]), "sum")
    result = {"index": fleet.worker_index(), "workers": fleet.worker_num(), "sum": float(np.asarray(total).ravel()[0]),
              "loss": float(np.asarray(last).ravel()[0])}
    with open(os.path.join(sys.argv[1], f"ps.{fleet.worker_index()}.json"), "w") as f:
        json.dump(result, f)
    fleet.stop_worker()
