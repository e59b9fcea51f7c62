"""The DistributeTranspiler's checks, and its nccl2 mode (a world of one, in this process)."""


import pytest
import torch

from launcher.fleet import state as st
from launcher.transpiler import DistributeTranspiler, DistributeTranspilerConfig
from conftest import free_port


@pytest.fixture(autouse=True)
def fresh():
    st.reset()
    yield
    st.reset()


def model_and_optimizer():
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_nccl2_mode_joins_the_collective_group_as_fleet_does():
    from launcher import fleet

    config = DistributeTranspilerConfig()
    config.mode = "nccl2"
    endpoint = f"127.0.0.1:{free_port()}"
    model, _ = model_and_optimizer()
    penv = DistributeTranspiler(config).transpile(0, program=model, trainers=endpoint, current_endpoint=endpoint)
    assert (penv.rank, penv.world_size, penv.backend, penv.endpoints) == (0, 1, "gloo", (endpoint,))
    assert fleet.worker_index() == 0 and fleet.worker_num() == 1
    model(torch.ones(2, 3)).sum().backward()
    assert st.current().transpiled.calls == 1  # backward averaged the gradients (over a world of one)


def test_nccl2_mode_needs_the_model_as_program():
    config = DistributeTranspilerConfig()
    config.mode = "nccl2"
    with pytest.raises(TypeError, match="in nccl2 mode pass the model as program"):
        DistributeTranspiler(config).transpile(0, trainers="127.0.0.1:1", current_endpoint="127.0.0.1:1")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(program="main_program"), TypeError, "pass the model and its torch optimizer"),
    (dict(trainers="127.0.0.1:1"), ValueError, "in pserver mode it is the number of trainers"),
    (dict(trainers=0), ValueError, "trainers=0"),
    (dict(pservers=""), ValueError, "pservers is empty"),
    (dict(pservers="h"), ValueError, "'h' where ip:port belongs"),
])
def test_pserver_mode_arguments_are_checked(kwargs, error, match):
    model, optimizer = model_and_optimizer()
    args = {**dict(program=model, pservers="127.0.0.1:6174", trainers=2, optimizer=optimizer), **kwargs}
    with pytest.raises(error, match=match):
        DistributeTranspiler().transpile(0, **args)


def test_programs_need_transpile_and_a_known_endpoint():
    t = DistributeTranspiler()
    with pytest.raises(RuntimeError, match="call transpile"):
        t.get_trainer_program()
    model, optimizer = model_and_optimizer()
    t.transpile(0, program=model, pservers="127.0.0.1:6174", trainers=1, optimizer=optimizer)
    with pytest.raises(ValueError, match="'127.0.0.1:9' is not one of the pservers"):
        t.get_pserver_program("127.0.0.1:9")


def test_the_mode_follows_sync_mode_and_the_config():
    t = DistributeTranspiler()
    assert (t._mode(True), t._mode(False)) == ("sync", "async")
    t.config.half_async = True
    assert t._mode(False) == "half_async"
    t.config.geo_sgd_mode = True
    assert t._mode(True) == "geo"
    with pytest.raises(ValueError, match="mode='ring' must be 'pserver', 'nccl2' or 'collective'"):
        t.config.mode = "ring"
        t.transpile(0)
    with pytest.raises(ValueError, match="collective_mode='local_sgd': mode='collective' runs collective_mode='grad_allreduce'"):
        t.config.mode, t.config.collective_mode = "collective", "local_sgd"
        t.transpile(0)


def test_nccl2_mode_takes_the_configs_communicators():
    config = DistributeTranspilerConfig()
    config.mode, config.nccl_comm_num = "nccl2", 2
    endpoint = f"127.0.0.1:{free_port()}"
    model, _ = model_and_optimizer()
    DistributeTranspiler(config).transpile(0, program=model, trainers=endpoint, current_endpoint=endpoint)
    assert st.current().strategy.nccl_comm_num == 2 and len(st.current().transpiled.channels) == 2
