"""DistributedStrategy: Paddle 1.8's collective tuning options, as plain attributes.

An option that is not one of these is refused (AttributeError naming the valid ones), so a typo or a
Paddle option that has no meaning here never passes silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from launcher.runtime.strict import refuse_unknown


@dataclass
class ExecutionStrategy:
    """The two options of Paddle's ``fluid.ExecutionStrategy`` that collective tuning uses."""

    num_threads: Optional[int] = None  # None: keep OMP_NUM_THREADS (the launcher's share of the cores)
    num_iteration_per_drop_scope: int = 1

    def __setattr__(self, name, value):
        refuse_unknown(self, name)
        object.__setattr__(self, name, value)


@dataclass
class DistributedStrategy:
    """How gradients travel between workers (``fleet.DistributedStrategy`` of Paddle 1.8)."""

    nccl_comm_num: int = 1  # communicators used in turn, one bucket each
    # None (not set): PyTorch's default, DDP-sized buckets; True: buckets sized by FLAGS_fuse_parameter_*;
    # False: one all-reduce per gradient (Paddle's BuildStrategy keeps this option unset by default too)
    fuse_all_reduce_ops: Optional[bool] = None
    use_hierarchical_allreduce: bool = False  # reduce in the node, all-reduce across nodes, broadcast in the node
    hierarchical_allreduce_inter_nranks: int = 0  # workers per node for it; 0: LOCAL_WORLD_SIZE
    use_local_sgd: bool = False
    local_sgd_steps: int = 1  # average the parameters every this many steps
    local_sgd_is_warm_steps: int = 1  # plain synchronous steps before local SGD starts
    fetch_frequency: int = 1  # the training loop's business in PyTorch: warned about
    exec_strategy: ExecutionStrategy = field(default_factory=ExecutionStrategy)

    # Paddle puts these two on exec_strategy; they are accepted here as well.
    @property
    def num_threads(self) -> Optional[int]:
        return self.exec_strategy.num_threads

    @num_threads.setter
    def num_threads(self, value: Optional[int]) -> None:
        self.exec_strategy.num_threads = value

    @property
    def num_iteration_per_drop_scope(self) -> int:
        return self.exec_strategy.num_iteration_per_drop_scope

    @num_iteration_per_drop_scope.setter
    def num_iteration_per_drop_scope(self, value: int) -> None:
        self.exec_strategy.num_iteration_per_drop_scope = value

    def __setattr__(self, name, value):
        refuse_unknown(self, name, extra=("num_threads", "num_iteration_per_drop_scope"))
        object.__setattr__(self, name, value)

    def check(self, world_size: int, local_world_size: int) -> None:
        """Refuse values that cannot work for this world (ValueError naming the option)."""
        _at_least(self, "nccl_comm_num", 1)
        _at_least(self, "local_sgd_steps", 1)
        _at_least(self, "local_sgd_is_warm_steps", 0)
        _at_least(self, "fetch_frequency", 1)
        _at_least(self, "num_iteration_per_drop_scope", 1)
        _at_least(self, "hierarchical_allreduce_inter_nranks", 0)
        if self.num_threads is not None:
            _at_least(self, "num_threads", 1)
        if self.fuse_all_reduce_ops not in (None, True, False):
            raise ValueError(f"DistributedStrategy.fuse_all_reduce_ops={self.fuse_all_reduce_ops!r} must be True, False or None.")
        if self.exec_strategy is None or not isinstance(self.exec_strategy, ExecutionStrategy):
            raise ValueError("exec_strategy must be a fleet.ExecutionStrategy.")
        if self.use_hierarchical_allreduce:
            inner = self.inter_nranks(local_world_size)
            if world_size % inner:
                raise ValueError(f"hierarchical_allreduce_inter_nranks={inner} does not divide the {world_size} workers into nodes.")

    def inter_nranks(self, local_world_size: int) -> int:
        """Workers per node for hierarchical all-reduce."""
        return self.hierarchical_allreduce_inter_nranks or local_world_size


def _at_least(strategy, name: str, low: int) -> None:
    value = getattr(strategy, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"DistributedStrategy.{name}={value!r} must be a whole number of at least {low}.")


def set_by_launcher(strategy: DistributedStrategy, text: str) -> list:
    """The fields the launcher gives (``envvars.STRATEGY``: a JSON object of fields, written by
    ``launcher.plan.strategy_fields``) set over ``strategy``; the ``name=value (the program's: old)`` of each. A value the field refuses is a ValueError naming it, as ``check`` says."""
    import json

    try:
        fields = json.loads(text)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise ValueError(f"LAUNCHER_STRATEGY={text!r} is not a JSON object of DistributedStrategy fields.")
    changed = []
    for name, value in fields.items():
        old = getattr(strategy, name)  # an unknown field: AttributeError naming the valid ones
        setattr(strategy, name, value)
        changed.append(f"{name}={value!r} (the program's: {old!r})")
    return changed
