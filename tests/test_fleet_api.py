"""The fleet API in this process, as a world of one (the multi-worker runs are in tests/integration)."""

import pytest
import torch

from launcher import envvars as ev
from launcher import fleet
from launcher.fleet import state as st
from launcher.runtime import FleetWarning


@pytest.fixture(autouse=True)
def fresh():
    """Every test starts with no fleet, no process group and no warning given."""
    st.reset()
    yield
    st.reset()


@pytest.fixture
def alone(monkeypatch):
    for name in (ev.TRAINER_ID, ev.RANK, ev.TRAINERS_NUM, ev.WORLD_SIZE, ev.SELECTED_GPUS, ev.TRAINER_ENDPOINTS):
        monkeypatch.delenv(name, raising=False)
    return fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=True))


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
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["persistables.pt"]  # the pair in one file
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.3, momentum=0.9)
    fleet.load_persistables(str(tmp_path / "ckpt"), fresh, fresh_opt)
    assert torch.equal(params(fresh), params(model))
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_fleet_needs_init_first():
    st.set_current(None)
    with pytest.raises(RuntimeError, match=r"call fleet.init\(\) first"):
        fleet.worker_index()


def test_parameter_server_mode_outside_a_parameter_server_job_names_the_missing_variable(monkeypatch):
    monkeypatch.delenv(ev.TRAINING_ROLE, raising=False)
    with pytest.raises(ValueError, match="TRAINING_ROLE=''.*--server_num"):
        fleet.role_maker.PaddleCloudRoleMaker(is_collective=False)
    with pytest.raises(ValueError, match="TRAINING_ROLE"):
        fleet.init(is_collective=False)


def test_the_parameter_server_role_maker_reads_the_job(monkeypatch):
    variables = {ev.TRAINING_ROLE: "PSERVER", ev.PSERVER_ID: "1", ev.PSERVERS_IP_PORT_LIST: "h:1,h:2", ev.TRAINERS_NUM: "3"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    role = fleet.role_maker.PaddleCloudRoleMaker(is_collective=False)
    assert (role.is_server(), role.is_worker(), role.server_index(), role.server_num(), role.worker_num()) == \
        (True, False, 1, 2, 3)
    assert role.get_pserver_endpoints() == ["h:1", "h:2"]


def test_parameter_server_calls_in_collective_mode_say_how_to_get_there(alone):
    assert (fleet.is_server(), fleet.is_worker(), fleet.server_num()) == (False, True, 0)
    with pytest.raises(RuntimeError, match="--server_num S --worker_num T"):
        fleet.run_server()
    with pytest.raises(TypeError, match=r"distributed_optimizer\(model=...\) is for parameter-server mode"):
        fleet.distributed_optimizer(torch.optim.SGD(mlp().parameters(), lr=0.1), model=mlp())


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


class Executor:
    """What a Paddle script passes first to fleet's save functions (fluid.Executor); fleet ignores it."""


def test_save_persistables_takes_paddles_executor_first_form(alone, tmp_path):
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9))
    train(model, optimizer, steps=1)
    with pytest.raises(TypeError, match=r"write fleet.save_persistables\(dirname, model, optimizer\)"):
        fleet.save_persistables(Executor(), str(tmp_path))  # no model known to fleet: it cannot be mapped
    fleet.save_persistables(Executor(), str(tmp_path), main_program=model)
    fleet.distributed_model(model)
    fleet.save_persistables(Executor(), str(tmp_path / "b"))  # the model of fleet.distributed_model
    for where in (tmp_path, tmp_path / "b"):
        fresh, fresh_opt = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)), None
        fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.3, momentum=0.9)
        fleet.load_persistables(Executor(), str(where), main_program=fresh)
        fleet.load_persistables(str(where), fresh, fresh_opt)
        assert torch.equal(params(fresh), params(model))
        assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_save_inference_model_exports_what_torch_loads(alone, tmp_path):
    model = mlp()
    fleet.save_inference_model(str(tmp_path), fleet.distributed_model(model), (torch.rand(3, 4),))
    loaded = torch.export.load(str(tmp_path / "model.pt2")).module()
    x = torch.rand(3, 4)
    assert torch.allclose(loaded(x), model(x))
    with pytest.raises(TypeError, match=r"write fleet.save_inference_model\(dirname, model, \(example_input,\)\)"):
        fleet.save_inference_model(Executor(), str(tmp_path), ["x"], [None])


def test_minimize_takes_paddles_arguments(alone):
    model = mlp()
    first, last = model[0], model[2]
    first_before, last_before = first.weight.detach().clone(), last.weight.detach().clone()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.rand(6, 4)).sum()
    with pytest.warns(FleetWarning, match="startup_program"):
        optimizer.minimize(loss, object(), parameter_list=[last.weight, last.bias, first.weight], no_grad_set={first.weight})
    assert (first.weight.grad, first.bias.grad) == (None, None)
    assert torch.equal(first.weight, first_before) and not torch.equal(last.weight, last_before)
    with pytest.raises(TypeError, match="pass the tensors themselves"):
        optimizer.minimize(model(torch.rand(6, 4)).sum(), parameter_list=["fc_0.w_0"])


def test_static_program_attributes_say_what_to_write_instead():
    with pytest.raises(AttributeError, match=r"run model\(x\) and optimizer.minimize\(loss\)"):
        fleet.main_program
    with pytest.raises(AttributeError, match="drop exe.run"):
        fleet.startup_program
    assert (fleet.init_worker(), fleet.stop_worker()) == (None, None)  # nothing to do in collective mode


def test_unused_parameters_keep_no_gradient_and_do_not_move(alone):
    model = mlp()
    spare = torch.nn.Linear(4, 2)
    before = spare.weight.detach().clone()
    optimizer = fleet.distributed_optimizer(torch.optim.AdamW(list(model.parameters()) + list(spare.parameters()), lr=0.1))
    train(model, optimizer, steps=2)
    assert spare.weight.grad is None and torch.equal(spare.weight, before)


def test_averaged_gradients_are_in_place_when_backward_returns(alone):
    model = mlp()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.rand(6, 4)).sum().backward()
    assert (optimizer._sync.calls, optimizer._sync.synced) == (1, True)
    optimizer.step()
    assert optimizer._sync.calls == 1  # step() does not average a second time
    with optimizer.no_sync():
        model(torch.rand(6, 4)).sum().backward()
    assert optimizer._sync.calls == 1
    optimizer.step()  # what no backward averaged, step() does
    assert optimizer._sync.calls == 2


def test_distributed_model_passes_ddp_options(alone):
    net = fleet.distributed_model(mlp(), find_unused_parameters=True, static_graph=False)
    assert net.find_unused_parameters is True


def test_local_sgd_steps_1_lets_no_torch_warning_through(alone):
    import warnings

    strategy = fleet.DistributedStrategy()
    strategy.use_local_sgd = True  # local_sgd_steps=1: Paddle's default, valid there
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), strategy)
        train(model, optimizer)
