"""Paddle 1.8's slicing and dispatch of parameters over servers, against hand-computed tables."""

import pytest

from launcher.ps.placement import block_sizes, format_table, place


def table(slices):
    return [(s.name, s.offset, s.size, s.server) for s in slices]


@pytest.mark.parametrize("shape, servers, min_block, sizes", [
    ((1000, 64), 3, 8192, [21376, 21376, 21248]),   # ceil(64000/3)=21334, rounded up to 334 rows of 64
    ((100,), 3, 8192, [100]),                        # smaller than one block
    ((1000, 64), 2, 8192, [32000, 32000]),
    ((1000, 64), 10, 8192, [9152, 9152, 9152, 9152, 9152, 9152, 9088]),  # 64000//8192 = 7 blocks at most
    ((20000,), 3, 8192, [10000, 10000]),             # 20000//8192 = 2
    ((10, 3), 4, 2, [9, 9, 9, 3]),                   # ceil(30/4)=8 -> 9 (whole rows of 3): 4 slices
    ((5, 7), 2, 1, [21, 14]),                        # ceil(35/2)=18 -> 21 (3 rows)
    ((8192,), 5, 8192, [8192]),
])
def test_block_sizes_follow_paddles_slice_variable(shape, servers, min_block, sizes):
    assert block_sizes(shape, servers, min_block) == sizes
    assert sum(sizes) == __import__("math").prod(shape)


def test_slice_var_up_false_keeps_every_parameter_whole():
    assert block_sizes((1000, 64), 3, 8192, slice_var_up=False) == [64000]
    slices = place([("w", (1000, 64)), ("b", (100,))], 3, slice_var_up=False)
    assert table(slices) == [("w", 0, 64000, 1), ("b", 0, 100, 0)]  # shuffled (seed 0): b first


# Paddle 1.8, python/paddle/fluid/transpiler/distribute_transpiler.py, DistributeTranspiler.transpile:
#     grad_var_mapping_items = list(six.iteritems(self.grad_var_mapping))
#     if not self.config.slice_var_up:
#         np.random.seed(self.origin_program.random_seed)
#         np.random.shuffle(grad_var_mapping_items)
#     for grad_varname, splited_vars in grad_var_mapping_items:
#         eplist = ps_dispatcher.dispatch(splited_vars)
# ps_dispatcher.py, RoundRobin.dispatch: endpoints in turn, the counter kept across calls.
SEED_MLP = [("fc_0.w_0", (32, 1280)), ("fc_0.b_0", (1280,)), ("fc_1.w_0", (1280, 1280)), ("fc_1.b_0", (1280,)),
            ("fc_2.w_0", (1280, 2)), ("fc_2.b_0", (2,))]  # seed 000's mlp(hid_dim=1280, label_dim=2) on 32 inputs


def paddles_whole_placement(params, servers, seed):
    import numpy as np

    items = list(params)
    np.random.seed(seed)
    np.random.shuffle(items)
    return {name: turn % servers for turn, (name, _) in enumerate(items)}


@pytest.mark.parametrize("seed", [0, 1, 7, 2024])
@pytest.mark.parametrize("servers", [2, 3, 4])
def test_whole_parameters_are_shuffled_before_dispatch_as_paddles_transpile_does(servers, seed):
    slices = place(SEED_MLP, servers, slice_var_up=False, random_seed=seed)
    assert {s.param: s.server for s in slices} == paddles_whole_placement(SEED_MLP, servers, seed)
    assert [s.param for s in slices] == [name for name, _ in SEED_MLP]  # listed in parameter order


def test_seed_002s_setting_does_not_put_every_weight_on_server_0():
    # slice_var_up=False, 2 servers, program.random_seed 0 (Paddle's default): the shuffle gives order
    # b_2, w_1, b_0, b_1, w_0, w_2, so server 0 holds fc_0.w_0 and the biases b_0, b_2; server 1 fc_1, fc_2.w_0
    slices = place(SEED_MLP, 2, slice_var_up=False)
    assert {s.param: s.server for s in slices} == {"fc_0.w_0": 0, "fc_0.b_0": 0, "fc_1.w_0": 1, "fc_1.b_0": 1,
                                                   "fc_2.w_0": 1, "fc_2.b_0": 0}
    weights_on_0 = sum(s.size for s in slices if s.server == 0 and ".w_" in s.param)
    assert weights_on_0 == 40960  # not 1,681,920 (every weight) as without the shuffle


def test_round_robin_counts_on_across_parameters():
    slices = place([("fc_0.w_0", (1000, 64)), ("fc_0.b_0", (100,)), ("fc_1.w_0", (64, 512))], 3)
    assert table(slices) == [
        ("fc_0.w_0.block0", 0, 21376, 0), ("fc_0.w_0.block1", 21376, 21376, 1), ("fc_0.w_0.block2", 42752, 21248, 2),
        ("fc_0.b_0", 0, 100, 0),
        ("fc_1.w_0.block0", 0, 11264, 1), ("fc_1.w_0.block1", 11264, 11264, 2), ("fc_1.w_0.block2", 22528, 10240, 0),
    ]


def test_round_robin_on_two_servers():
    slices = place([("a", (4,)), ("b", (4,)), ("c", (20000,))], 2)
    assert table(slices) == [("a", 0, 4, 0), ("b", 0, 4, 1), ("c.block0", 0, 10000, 0), ("c.block1", 10000, 10000, 1)]


def test_hash_name_uses_a_crc_of_the_slice_name_the_same_everywhere():
    import zlib

    slices = place([("fc_0.w_0", (1000, 64)), ("fc_0.b_0", (100,))], 3, split_method="HashName")
    expected = [zlib.crc32(n.encode()) % 3 for n in ("fc_0.w_0.block0", "fc_0.w_0.block1", "fc_0.w_0.block2", "fc_0.b_0")]
    assert [s.server for s in slices] == expected
    assert place([("fc_0.w_0", (1000, 64)), ("fc_0.b_0", (100,))], 3, split_method="HashName") == slices


def test_one_server_takes_everything():
    assert {s.server for s in place([("w", (1000, 64)), ("b", (100,))], 1)} == {0}


@pytest.mark.parametrize("args, match", [
    (dict(servers=0), "at least one"),
    (dict(servers=2, split_method="Random"), "split_method='Random'"),
    (dict(servers=2, min_block_size=0), "min_block_size=0"),
])
def test_bad_placement_settings_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        place([("w", (10,))], **args)


def test_the_placement_table_names_slice_offset_size_and_endpoint():
    text = format_table(place([("w", (1000, 64))], 3), ["h:1", "h:2", "h:3"], [("emb", 1000)])
    lines = text.splitlines()
    assert lines[0].split() == ["parameter", "slice", "offset", "size", "server"]
    assert lines[2].split() == ["w", "w.block1", "21376", "21376", "1", "h:2"]
    assert lines[-1].startswith("emb")
