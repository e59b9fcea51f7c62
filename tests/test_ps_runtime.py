"""Parameter-server mode's pure parts and its server's arithmetic, in one process (no RPC)."""

import pytest
import torch

from launcher.fleet import StrategyFactory
from launcher.ps.config import DistributeTranspilerConfig, PsOptions
from launcher.ps.env import is_ps_environment, read_ps_env
from launcher.ps.model import describe
from launcher.ps.placement import place
from launcher.ps.server import Server, dc_asgd
from launcher.runtime import flags as fl
from launcher.runtime.environment import WorkerEnvError

SERVERS = "10.0.0.1:6170,10.0.0.2:6170"


def server_vars(i=1):
    return {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_ID": str(i), "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
            "PADDLE_PORT": "6170", "POD_IP": f"10.0.0.{i + 1}", "PADDLE_TRAINERS_NUM": "3"}


def trainer_vars(j=2):
    return {"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(j), "PADDLE_TRAINERS_NUM": "3",
            "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINER_ENDPOINTS": "10.0.0.3:1,10.0.0.3:2,10.0.0.4:1"}


def test_a_server_and_a_trainer_read_their_places_and_rpc_ranks():
    s, t = read_ps_env(server_vars(1)), read_ps_env(trainer_vars(2))
    assert (s.is_server, s.index, s.rpc_rank, s.rpc_world_size, s.name) == (True, 1, 1, 5, "server1")
    assert (t.is_server, t.index, t.rpc_rank, t.name, t.store_endpoint) == (False, 2, 4, "trainer2", ("10.0.0.1", 6170))
    assert t.describe("trainer1") == "trainer 1 (10.0.0.3:2)" and t.describe("server0") == "server 0 (10.0.0.1:6170)"
    assert is_ps_environment(trainer_vars()) and not is_ps_environment({})


def test_a_server_without_an_id_is_found_by_its_address():
    variables = server_vars(1)
    del variables["PADDLE_PSERVER_ID"]
    assert read_ps_env(variables).index == 1


@pytest.mark.parametrize("change, match", [
    ({"TRAINING_ROLE": "WORKER"}, "TRAINING_ROLE='WORKER' must be PSERVER or TRAINER"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": ""}, "PADDLE_PSERVERS_IP_PORT_LIST is not set"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1"}, "'10.0.0.1' where ip:port belongs"),
    ({"PADDLE_TRAINER_ID": "3"}, "PADDLE_TRAINER_ID=3 is outside PADDLE_TRAINERS_NUM=3"),
    ({"PADDLE_TRAINERS_NUM": "x"}, "'x' is not a whole number"),
    ({"PADDLE_TRAINER_ENDPOINTS": "10.0.0.3:1"}, "lists 1 endpoints for PADDLE_TRAINERS_NUM=3"),
])
def test_bad_variables_are_named(change, match):
    with pytest.raises(WorkerEnvError, match=match):
        read_ps_env({**trainer_vars(), **change})


def test_rpc_flags_have_paddles_defaults_and_are_read():
    assert fl.read_rpc_flags({}) == fl.RpcFlags(180000, 12, 12, 12)
    flags = fl.read_rpc_flags({"FLAGS_rpc_deadline": "5000", "FLAGS_rpc_send_thread_num": "3",
                               "FLAGS_rpc_get_thread_num": "4", "FLAGS_rpc_prefetch_thread_num": "2"})
    assert (flags.deadline_s, flags.send_threads, flags.get_threads, flags.prefetch_threads) == (5.0, 3, 4, 2)
    with pytest.raises(ValueError, match="FLAGS_rpc_deadline='soon' is not a whole number"):
        fl.read_rpc_flags({"FLAGS_rpc_deadline": "soon"})


# Paddle 1.8, python/paddle/fluid/transpiler/distribute_transpiler.py, class DistributeTranspilerConfig: its
# class attributes and defaults; DistributeTranspiler.__init__: split_method None -> RoundRobin, and
# assert config.min_block_size >= 8192, assert split_method.__bases__[0] == PSDispatcher.
PADDLE_CONFIG = {"slice_var_up": True, "split_method": None, "min_block_size": 8192, "enable_dc_asgd": False,
                 "mode": "pserver", "print_log": False, "wait_port": True, "runtime_split_send_recv": False,
                 "sync_mode": True, "half_async": False, "completely_not_async": False, "geo_sgd_mode": False,
                 "geo_sgd_need_push_nums": 100, "nccl_comm_num": 1, "use_hierarchical_allreduce": False,
                 "hierarchical_allreduce_inter_nranks": 0, "collective_mode": None}


def test_transpiler_config_has_every_paddle_attribute_with_its_default_and_refuses_typos():
    c = DistributeTranspilerConfig()
    assert {name: getattr(c, name) for name in PADDLE_CONFIG} == PADDLE_CONFIG
    for name, value in PADDLE_CONFIG.items():
        setattr(c, name, value)  # each one accepted
    c.nccl_comm_num, c.use_hierarchical_allreduce, c.hierarchical_allreduce_inter_nranks, c.wait_port = 2, True, 2, False
    with pytest.raises(AttributeError, match="Did you mean 'slice_var_up'"):
        c.slice_var_upp = False
    with pytest.raises(ValueError, match="needs config.sync_mode = False first"):
        c.runtime_split_send_recv = True


def test_split_method_takes_paddles_classes_and_min_block_size_is_at_least_8192():
    from launcher.transpiler import DistributeTranspiler, HashName, RoundRobin

    config = DistributeTranspilerConfig()
    assert DistributeTranspiler(config).config.split_method is RoundRobin  # None becomes RoundRobin, as in Paddle
    for given, name in ((HashName, "HashName"), (RoundRobin, "RoundRobin"), ("HashName", "HashName")):
        config.split_method = given
        assert DistributeTranspiler(config)._options("sync").split_method == name
    paddles = type("HashName", (), {})  # paddle.fluid.transpiler.HashName, as a script that imports Paddle's passes it
    config.split_method = paddles
    assert DistributeTranspiler(config)._options("sync").split_method == "HashName"
    config.min_block_size = 8191
    with pytest.raises(ValueError, match="min_block_size=8191 must be a whole number of at least 8192"):
        DistributeTranspiler(config)
    strategy = StrategyFactory.create_sync_strategy()
    strategy.get_program_config().min_block_size = 64
    with pytest.raises(ValueError, match="min_block_size=64"):
        strategy.options(fl.RpcFlags())


def test_strategies_become_options_and_bad_ones_are_refused():
    geo = StrategyFactory.create_geo_strategy(7)
    assert geo.options(fl.RpcFlags()).update_frequency == 7 and geo.options(fl.RpcFlags()).mode == "geo"
    sync = StrategyFactory.create_sync_strategy()
    sync.get_program_config().enable_dc_asgd = True
    with pytest.raises(ValueError, match="enable_dc_asgd=True works in async mode only"):
        sync.options(fl.RpcFlags())
    with pytest.raises(ValueError, match="update_frequency=0"):
        StrategyFactory.create_geo_strategy(0).options(fl.RpcFlags())


# ---------------------------------------------------------------------- the server's arithmetic


def make_server(mode, trainers=2, dc=False, lam=1.0, lr=0.5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    spec, _ = describe(opt, model)
    options = PsOptions(mode=mode, enable_dc_asgd=dc, dc_asgd_lambda=lam, min_block_size=4)
    slices = place([(p.name, p.shape) for p in spec.dense], 1, min_block_size=4)
    env = read_ps_env({**server_vars(0), "PADDLE_TRAINERS_NUM": str(trainers), "PADDLE_PSERVERS_IP_PORT_LIST": "h:1",
                       "PADDLE_PSERVER_ID": "0"})
    return Server(env, options, spec, slices, [p for p in model.parameters()])


def grads(server, seed):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(h.value.shape, generator=g) for name, h in server.dense.items()}


def test_dc_asgd_compensates_with_the_distance_from_the_trainers_last_pull_exactly():
    lam, lr = 0.3, 0.5
    server = make_server("async", dc=True, lam=lam, lr=lr)
    backup0 = server.values(0)  # trainer 0 pulls
    server.push(1, grads(server, 1), {}).wait()  # trainer 1 moves the parameters meanwhile
    before = {n: h.value.detach().clone() for n, h in server.dense.items()}
    g = grads(server, 2)
    answer = server.push(0, g, {}).wait()
    for name in g:
        compensated = g[name] + lam * g[name] * g[name] * (before[name] - backup0[name])
        assert torch.equal(answer[name], before[name] - lr * compensated)
        assert not torch.equal(before[name], backup0[name])  # the compensation is not zero
    assert all(torch.equal(server.backups[0][n], answer[n]) for n in g)  # the answer is trainer 0's new backup
    assert torch.equal(dc_asgd(torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([0.5]), 0.1), torch.tensor([2.2]))


def test_sync_waits_for_every_trainer_then_steps_on_the_average():
    server = make_server("sync")
    before = {n: h.value.detach().clone() for n, h in server.dense.items()}
    g0, g1 = grads(server, 1), grads(server, 2)
    first = server.push(0, g0, {})
    assert not first.done()  # trainer 1 has not sent its gradient yet
    second = server.push(1, g1, {})
    assert first.done() and second.done()
    for name in g0:
        assert torch.allclose(first.wait()[name], before[name] - 0.5 * (g0[name] + g1[name]) / 2)
    with pytest.raises(RuntimeError, match="pushed twice"):
        server.push(0, g0, {})
        server.push(0, g0, {})


def test_a_stopped_trainer_no_longer_holds_a_sync_step_back():
    server = make_server("sync")
    pending = server.push(0, grads(server, 1), {})
    server.stop(1)
    assert pending.done() and not server.finished.is_set()
    server.stop(0)
    assert server.finished.is_set()


def test_a_failure_fails_every_waiting_trainer():
    server = make_server("sync")
    pending = server.push(0, grads(server, 1), {})
    server.fail("trainer 1 is gone")
    with pytest.raises(RuntimeError, match="trainer 1 is gone"):
        pending.wait()


# ---------------------------------------------------------------------- the trainer's bookkeeping


def test_a_tables_row_gradients_go_to_the_server_of_each_id_as_local_rows():
    from launcher.ps.trainer import Table

    table = Table("emb", torch.nn.Embedding(10, 2, sparse=True), servers=3, window=2)
    rows = torch.ones(4, 2, requires_grad=True)
    (rows * torch.arange(1.0, 5.0).unsqueeze(1)).sum().backward()
    table.used.append((torch.tensor([0, 4, 5, 9]), rows))
    grads = table.take_gradients()
    assert sorted(grads) == [0, 1, 2]  # ids 0, 9 -> server 0; 4 -> 1; 5 -> 2
    assert grads[0][0].tolist() == [0, 3] and grads[0][1][:, 0].tolist() == [1.0, 4.0]  # rows 0//3, 9//3
    assert grads[1][0].tolist() == [1] and grads[2][0].tolist() == [1]
    assert table.used == [] and table.take_gradients() == {}


def test_half_async_merges_queued_steps_into_their_average():
    from launcher.ps.trainer import merge

    steps = [({"w": torch.tensor([1.0, 2.0]), "b": None}, {"emb": {0: (torch.tensor([1]), torch.tensor([[2.0]]))}}),
             ({"w": torch.tensor([3.0, 4.0]), "b": None}, {"emb": {0: (torch.tensor([2]), torch.tensor([[4.0]]))}})]
    dense, sparse = merge(steps)
    assert dense["w"].tolist() == [2.0, 3.0] and dense["b"] is None
    ids, rows = sparse["emb"][0]
    assert ids.tolist() == [1, 2] and rows.view(-1).tolist() == [1.0, 2.0]


def test_rendezvous_messages_name_servers_and_trainers():
    from launcher.ps.transport import rpc_names

    env = read_ps_env(trainer_vars(2))
    text = "rank 4 waited 180 s for all 5 ranks at 10.0.0.1:6170; missing: rank 1 (10.0.0.2:6170), rank 3 (10.0.0.3:2)."
    assert rpc_names(text, env) == ("trainer 2 waited 180 s for all 5 ranks at 10.0.0.1:6170; missing: "
                                    "server 1 (10.0.0.2:6170), trainer 1 (10.0.0.3:2).")


def test_a_trainer_whose_servers_never_come_names_them_after_the_deadline():
    import socket

    from launcher.ps import transport

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = read_ps_env({**trainer_vars(0), "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{port}",
                       "PADDLE_TRAINERS_NUM": "1", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:1"})
    with pytest.raises(transport.PsError, match=rf"trainer 0 waited 1 s .*server 0 \(127.0.0.1:{port}\)"):
        transport.connect(env, fl.RpcFlags(deadline_ms=1000))


# ---------------------------------------------------------------------- geo: Paddle's GeoCommunicator rule
# paddle/fluid/operators/distributed/communicator.cc (release/1.8), GeoCommunicator::SendDense:
#   delta = (latest - old) / trainers; old += delta; the server adds delta.
# GeoCommunicator::RecvDense: latest += pserver - old; old = pserver.  SendSparse / RecvSparse: the same per row.


def test_geo_keeps_a_trainers_own_change_as_paddles_communicator_does():
    from launcher.ps.trainer import geo_delta, geo_take

    server = torch.tensor([1.0])
    x = [torch.tensor([1.0]), torch.tensor([1.0])]  # two trainers; trainer 1 stays idle
    old = [torch.tensor([1.0]), torch.tensor([1.0])]

    def exchange(t):
        server.add_(geo_delta(x[t], old[t], 2))
        geo_take(x[t], old[t], server.clone())

    x[0] -= 0.6  # trainer 0's local steps: 1.0 -> 0.4
    exchange(0)  # sends (0.4 - 1.0) / 2 = -0.3: server 0.7; old 0.7; x += 0.7 - 0.7 keeps 0.4
    assert (server.item(), x[0].item(), old[0].item()) == pytest.approx((0.7, 0.4, 0.7))
    exchange(1)  # sends 0; x1 += 0.7 - 1.0
    assert (server.item(), x[1].item(), old[1].item()) == pytest.approx((0.7, 0.7, 0.7))
    x[0] -= 0.2  # 0.4 -> 0.2
    exchange(0)  # sends (0.2 - 0.7) / 2 = -0.25: server 0.45, x stays 0.2
    exchange(1)
    assert (server.item(), x[0].item(), x[1].item()) == pytest.approx((0.45, 0.2, 0.45))


def test_geo_tables_exchange_the_rows_used_by_the_same_rule_on_their_servers():
    from launcher.ps.trainer import LocalTable

    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 2, sparse=True)
    table = LocalTable(emb)
    start = torch.arange(12.0).view(6, 2)
    table.start([start[0::2], start[1::2]])  # 2 servers: rows 0, 2, 4 and 1, 3, 5
    assert torch.equal(emb.weight.detach(), start)
    emb(torch.tensor([[1, 4], [4, 4]]))  # rows 1 and 4 used
    with torch.no_grad():
        emb.weight[1] -= 1.0
        emb.weight[4] -= 2.0
        emb.weight[5] -= 9.0  # changed but not used: not sent, as Paddle sends only the ids the batches held
    sent = table.deltas(trainers=2, servers=2)
    assert sorted(sent) == [0, 1]
    assert sent[0][0].tolist() == [2] and sent[0][1].tolist() == [[-1.0, -1.0]]  # row 4 = server 0's local row 2
    assert sent[1][0].tolist() == [0] and sent[1][1].tolist() == [[-0.5, -0.5]]  # row 1 = server 1's local row 0
    server_rows = {0: start[0::2][[2]] + sent[0][1] + 10.0, 1: start[1::2][[0]] + sent[1][1]}  # another trainer moved row 4 by +10
    table.take(server_rows, sent, servers=2)
    # row 4: x = [6, 7], old = [8, 9] - 1 = [7, 8], server [17, 18]: x += server - old keeps its own -2 and takes the +10
    assert emb.weight[4].tolist() == [16.0, 17.0] and emb.weight[1].tolist() == [1.0, 2.0]
    assert table.old[4].tolist() == server_rows[0][0].tolist() and table.used == []
    assert table.deltas(trainers=2, servers=2) == {}


def test_a_geo_server_adds_dense_and_row_deltas_and_answers_the_rows_sent():
    server = make_server("geo")
    before = {n: h.value.detach().clone() for n, h in server.dense.items()}
    name = next(iter(before))
    dense, rows = server.add_deltas(0, {name: torch.ones_like(before[name])}, {})
    assert torch.equal(dense[name], before[name] + 1) and rows == {}
