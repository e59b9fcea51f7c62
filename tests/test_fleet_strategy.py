"""fleet.DistributedStrategy and the buckets it asks for (pure: no process group)."""

import pytest
import torch

from launcher import fleet
from launcher.fleet import state as st
from launcher.fleet.comm import BucketLimits, make_buckets
from launcher.runtime import flags as fl


def test_options_have_paddles_defaults():
    s = fleet.DistributedStrategy()
    assert (s.nccl_comm_num, s.fuse_all_reduce_ops, s.use_hierarchical_allreduce, s.use_local_sgd) == (1, None, False, False)
    assert (s.num_iteration_per_drop_scope, s.fetch_frequency, s.local_sgd_steps, s.local_sgd_is_warm_steps) == (1, 1, 1, 1)
    assert s.num_threads is None  # keep OMP_NUM_THREADS from the launcher


def test_exec_strategy_options_read_through_the_strategy():
    s = fleet.DistributedStrategy()
    e = fleet.ExecutionStrategy()
    e.num_threads, e.num_iteration_per_drop_scope = 3, 30
    s.exec_strategy = e
    assert (s.num_threads, s.num_iteration_per_drop_scope) == (3, 30)
    s.num_threads = 2
    assert e.num_threads == 2


def test_unknown_options_are_refused_with_the_nearest_name():
    s = fleet.DistributedStrategy()
    with pytest.raises(AttributeError, match="Did you mean 'nccl_comm_num'"):
        s.nccl_comm_nums = 2
    with pytest.raises(AttributeError, match="'use_amp'"):
        s.use_amp = True
    with pytest.raises(AttributeError, match="num_threads"):
        fleet.ExecutionStrategy().num_thread = 2


@pytest.mark.parametrize("option, value, words", [
    ("nccl_comm_num", 0, "nccl_comm_num=0"),
    ("local_sgd_steps", 0, "local_sgd_steps=0"),
    ("fetch_frequency", 1.5, "fetch_frequency=1.5"),
    ("fuse_all_reduce_ops", "yes", "must be True, False or None"),
    ("hierarchical_allreduce_inter_nranks", 3, "does not divide the 4 workers"),
])
def test_values_that_cannot_work_are_refused(option, value, words):
    s = fleet.DistributedStrategy()
    s.use_hierarchical_allreduce = True
    setattr(s, option, value)
    with pytest.raises(ValueError, match=words):
        s.check(world_size=4, local_world_size=2)


def test_hierarchy_defaults_to_the_workers_of_a_node():
    s = fleet.DistributedStrategy()
    assert s.inter_nranks(local_world_size=8) == 8
    s.hierarchical_allreduce_inter_nranks = 2
    assert s.inter_nranks(local_world_size=8) == 2


def tensors(*sizes):
    return [torch.zeros(n) for n in sizes]


def test_unfused_is_one_bucket_per_gradient_last_layer_first():
    params = tensors(10, 20, 30)
    buckets = make_buckets(params, BucketLimits(fuse=False))
    assert [[p.numel() for p in b] for b in buckets] == [[30], [20], [10]]


def test_fused_buckets_close_when_they_reach_the_size_or_count():
    params = tensors(100, 100, 100, 100, 100)  # 400 bytes each
    by_bytes = make_buckets(params, BucketLimits(fuse=True, cap_mb=800 / 2**20))
    assert [len(b) for b in by_bytes] == [2, 2, 1]
    by_count = make_buckets(params, BucketLimits(fuse=True, max_tensors=3))
    assert [len(b) for b in by_count] == [3, 2]
    everything = make_buckets(params, BucketLimits(fuse=True))
    assert [len(b) for b in everything] == [5]


def test_default_buckets_are_ddps_a_small_first_one_then_25_mb():
    example_mlp = [torch.zeros(1280, 32), torch.zeros(1280), torch.zeros(1280, 1280), torch.zeros(1280),
                torch.zeros(2, 1280), torch.zeros(2)]
    buckets = make_buckets(example_mlp, BucketLimits(fuse=True))
    assert [[tuple(p.shape) for p in b] for b in buckets] == [[(2,), (2, 1280), (1280,), (1280, 1280)], [(1280,), (1280, 32)]]


def test_buckets_never_mix_dtypes():
    params = [torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(4)]
    assert [len(b) for b in make_buckets(params, BucketLimits(fuse=True))] == [1, 1, 1]


def test_fuse_flags_size_the_buckets_only_when_fusing(monkeypatch):
    fl.reset_warnings()
    s = fleet.DistributedStrategy()
    flags = fl.Flags(fuse_memory_mb=16.0, fuse_groups_size=50)
    assert st.bucket_limits(s, fl.Flags(), ddp=True) == BucketLimits(fuse=True, cap_mb=None)  # unset: DDP's defaults
    s.fuse_all_reduce_ops = False
    with pytest.warns(fl.FleetWarning, match="no effect while fuse_all_reduce_ops is False"):
        assert st.bucket_limits(s, flags, ddp=False) == BucketLimits(fuse=False)
    s.fuse_all_reduce_ops = True
    assert st.bucket_limits(s, flags, ddp=False) == BucketLimits(fuse=True, cap_mb=16.0, max_tensors=50)
    with pytest.warns(fl.FleetWarning, match="bytes only"):
        assert st.bucket_limits(s, flags, ddp=True) == BucketLimits(fuse=True, cap_mb=16.0, max_tensors=None)


def test_executor_options_warn_once_and_num_threads_sets_torch_threads(monkeypatch):
    fl.reset_warnings()
    before = torch.get_num_threads()
    s = fleet.DistributedStrategy()
    s.num_iteration_per_drop_scope, s.fetch_frequency, s.num_threads = 30, 2, 1
    try:
        with pytest.warns(fl.FleetWarning) as record:
            st.apply_exec_options(s)
            st.apply_exec_options(s)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    messages = sorted(str(w.message).split(" has")[0] for w in record)
    assert messages == ["fetch_frequency", "num_iteration_per_drop_scope"]


def test_the_two_defaults_that_differ_from_paddle_on_purpose():
    # Paddle 1.8: DEFINE_bool(sync_nccl_allreduce, true, ...) (paddle/fluid/platform/flags.cc), and
    # incubate/fleet/collective/__init__.py, CollectiveOptimizer._try_to_compile: when FLAGS_sync_nccl_allreduce
    # is unset or "1", exec_strategy.num_threads = nccl_comm_num + 1 (2 * nccl_comm_num + 1 hierarchical).
    # Here the all-reduces stay asynchronous by default (torch overlaps them with backward; Paddle overlaps with
    # those executor threads), and num_threads is torch's CPU thread count, not an executor's: neither is copied
    # (docs/fleet.md, "Differences from Paddle 1.8").
    assert fl.read_flags({}).sync_allreduce is False
    strategy = fleet.DistributedStrategy()
    strategy.nccl_comm_num = 3
    assert strategy.num_threads is None
