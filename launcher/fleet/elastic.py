"""fleet.elastic_run: a Fleet program that keeps its processes at a membership change (launcher.runtime.elastic).

    state = {"model": model, "optimizer": optimizer, "step": 0}    # the plain model and optimizer

    def train(round_):
        model_ = fleet.distributed_model(model, strategy)           # wrapped again in every round
        optimizer_ = fleet.distributed_optimizer(optimizer, strategy)
        while state["step"] < steps:
            ...
            state["step"] += 1

    fleet.elastic_run(train, state, strategy=strategy)             # instead of fleet.init

Each round is joined as fleet.init joins a job (fleet.init called in ``train`` returns where this worker is in
the round). At a round's end what its wrappers hooked onto the model's parameters is taken off (the gradient
syncs, DistributedDataParallel's reducer), and its communicators (``nccl_comm_num``, hierarchical all-reduce)
are interrupted with the round, so that the next round's wrappers start from the plain model and optimizer.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, Optional

from launcher.fleet import state as st
from launcher.fleet.strategy import DistributedStrategy
from launcher.runtime import elastic, init_parallel_env
from launcher.runtime.environment import read_worker_env


def elastic_run(train: Callable[[elastic.Round], Any], state: dict, strategy: Optional[DistributedStrategy] = None,
                backend: Optional[str] = None, timeout: Optional[timedelta] = None) -> Any:
    """launcher.runtime.elastic.run for a Fleet program: ``train(round_)`` is called in each round with the fleet
    joined to that round (``strategy`` in force); what it returned, once it returns."""
    if st.ps_session() is not None or (st.initialised() and st.round_in_force() is None):
        raise RuntimeError("fleet.elastic_run joins each round of the job itself: call it instead of fleet.init() "
                           "(fleet.init() inside the training function is fine), in collective mode.")

    def each_round(round_: elastic.Round) -> Any:
        penv = init_parallel_env(round_.backend, env=read_worker_env(os.environ))  # the round's process group, formed by ``run``
        st.set_current(st.make_state(penv, strategy, in_round=True))
        try:
            return train(round_)
        finally:
            st.end_round()

    return elastic.run(each_round, state, backend=backend, timeout=timeout)
