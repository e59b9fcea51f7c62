"""The fleet API in this process, as a world of one (the multi-worker runs are in tests/integration)."""

import pytest
import torch

from launcher import envvars as ev
from launcher import fleet
from launcher.fleet import state as st


@pytest.fixture
def alone(monkeypatch):
    for name in (ev.TRAINER_ID, ev.RANK, ev.TRAINERS_NUM, ev.WORLD_SIZE, ev.SELECTED_GPUS, ev.TRAINER_ENDPOINTS):
        monkeypatch.delenv(name, raising=False)
    penv = fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=True))
    yield penv
    st.set_current(None)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def train(model, optimizer, use_minimize=False, steps=5):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(torch.rand(6, 4, generator=g)), torch.randint(0, 2, (6,), generator=g))
        if use_minimize:
            optimizer.minimize(loss)
        else:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_alone_fleet_is_a_world_of_one(alone):
    assert (fleet.worker_index(), fleet.worker_num(), fleet.is_first_worker(), fleet.worker_endpoints()) == (0, 1, True, [])
    assert fleet.parallel_env() is alone
    fleet.barrier_worker()


@pytest.mark.parametrize("options, use_minimize", [({}, False), ({}, True), ({"fuse_all_reduce_ops": True, "nccl_comm_num": 2}, True)])
def test_distributed_optimizer_alone_trains_like_the_plain_one(alone, options, use_minimize):
    plain = mlp()
    train(plain, torch.optim.SGD(plain.parameters(), lr=0.1))
    model = mlp()
    strategy = fleet.DistributedStrategy()
    for key, value in options.items():
        setattr(strategy, key, value)
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), strategy=strategy)
    train(model, optimizer, use_minimize)
    assert torch.allclose(params(model), params(plain), atol=1e-6)
    assert optimizer._sync.calls == 5
    assert isinstance(optimizer, torch.optim.Optimizer)


def test_lr_scheduler_drives_the_wrapped_optimizer(alone):
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    train(model, optimizer, steps=1)
    scheduler.step()
    assert optimizer.optimizer.param_groups[0]["lr"] == 0.5


def test_distributed_model_leaves_the_all_reduce_to_ddp(alone):
    model = mlp()
    net = fleet.distributed_model(model)
    assert isinstance(net, torch.nn.parallel.DistributedDataParallel)
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    train(net, optimizer)
    assert optimizer._sync.calls == 0


def test_different_local_sgd_for_model_and_optimizer_is_refused(alone):
    model = mlp()
    strategy = fleet.DistributedStrategy()
    strategy.use_local_sgd, strategy.local_sgd_steps = True, 2
    net = fleet.distributed_model(model, strategy)
    other = fleet.DistributedStrategy()
    other.use_local_sgd, other.local_sgd_steps = True, 3
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), other)
    with pytest.raises(ValueError, match="different local SGD settings"):
        train(net, optimizer, steps=1)


def test_save_and_load_round_trip(alone, tmp_path):
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9))
    train(model, optimizer, steps=2)
    fleet.save_persistables(str(tmp_path / "ckpt"), fleet.distributed_model(model), optimizer)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["model.pt", "optimizer.pt"]
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.3, momentum=0.9)
    fleet.load_persistables(str(tmp_path / "ckpt"), fresh, fresh_opt)
    assert torch.equal(params(fresh), params(model))
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_fleet_needs_init_first():
    st.set_current(None)
    with pytest.raises(RuntimeError, match=r"call fleet.init\(\) first"):
        fleet.worker_index()


def test_parameter_server_mode_is_refused():
    with pytest.raises(ValueError, match="parameter-server"):
        fleet.role_maker.PaddleCloudRoleMaker(is_collective=False)
    with pytest.raises(ValueError, match="parameter-server"):
        fleet.init(is_collective=False)


def test_user_defined_role_maker_describes_the_given_endpoints():
    role = fleet.role_maker.UserDefinedRoleMaker(current_id=1, worker_endpoints=["127.0.0.1:6170", "127.0.0.1:6171"])
    assert (role.worker_index(), role.worker_num(), role.is_first_worker()) == (1, 2, False)
    assert role.worker_env().master_port == 6170


def test_local_sgd_model_with_a_plain_optimizer_is_refused(alone):
    strategy = fleet.DistributedStrategy()
    strategy.use_local_sgd = True
    net = fleet.distributed_model(mlp(), strategy)
    with pytest.raises(RuntimeError, match="needs fleet.distributed_optimizer"):
        net(torch.rand(2, 4))
