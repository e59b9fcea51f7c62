"""Parameter-server mode's plan: servers and trainers, their variables, ports, nodes and refusals."""

import pytest

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.output.reports import format_plan
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.plan.ps import held_by

HOST = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                 python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")
NODE_B = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),
                                                            Interface("eth0", "10.0.0.2", "255.255.255.0")),
                   python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")
SERVERS = "10.0.0.1:6170,10.0.0.2:6170"
WORKERS = "10.0.0.1:6171,10.0.0.2:6171,10.0.0.2:6172"


def plan(host=HOST, env=None, free=tuple(range(40000, 40016)), **opts):
    opts.setdefault("training_script", "train.py")
    return make_plan(LaunchOptions(**opts), env or {}, host, lambda ip, n: free[:n])


def refused(**opts) -> str:
    with pytest.raises(LaunchError) as e:
        plan(**opts)
    return str(e.value)


def by_label(p):
    return {w.label: w for w in p.workers}


def test_counts_start_servers_then_trainers_on_consecutive_ports():
    p = plan(server_num=2, worker_num=3, started_port=6170, log_dir="mylog")
    assert p.parameter_server and p.device == "cpu" and p.world_size == 5
    assert p.servers == ("127.0.0.1:6170", "127.0.0.1:6171")
    assert p.trainers == ("127.0.0.1:6172", "127.0.0.1:6173", "127.0.0.1:6174")
    # trainers first locally (the console shows trainer 0); keys: servers 0-1, trainers 2-4
    assert [w.label for w in p.workers] == ["trainer 0", "trainer 1", "trainer 2", "server 0", "server 1"]
    assert [w.rank for w in p.workers] == [2, 3, 4, 0, 1]
    assert [w.local_rank for w in p.workers] == [0, 1, 2, 3, 4]
    w = by_label(p)
    assert w["server 1"].log_file == "mylog/serverlog.1" and w["trainer 2"].log_file == "mylog/workerlog.2"
    assert p.store_port == 6170 and p.ports == (6172, 6173, 6174, 6170, 6171)
    assert p.job_ports == (6170, 6171, 6172, 6173, 6174)
    assert p.control is None  # one node: no channel


def test_each_role_gets_paddles_variables_and_nothing_collective():
    p = plan(server_num=2, worker_num=2, started_port=6170)
    w = by_label(p)
    server = w["server 1"].env
    assert server[ev.TRAINING_ROLE] == "PSERVER" and server[ev.PSERVER_ID] == "1"
    assert server[ev.PSERVERS_IP_PORT_LIST] == "127.0.0.1:6170,127.0.0.1:6171"
    assert server[ev.PORT] == "6171" and server[ev.POD_IP] == "127.0.0.1"
    assert server[ev.TRAINERS_NUM] == "2" and server[ev.CURRENT_ENDPOINT] == "127.0.0.1:6171"
    trainer = w["trainer 1"].env
    assert trainer[ev.TRAINING_ROLE] == "TRAINER" and trainer[ev.TRAINER_ID] == "1"
    assert trainer[ev.TRAINERS_NUM] == "2" and trainer[ev.PSERVERS_IP_PORT_LIST] == server[ev.PSERVERS_IP_PORT_LIST]
    assert trainer[ev.TRAINER_ENDPOINTS] == "127.0.0.1:6172,127.0.0.1:6173"
    for env in (server, trainer):
        assert env[ev.OMP_NUM_THREADS] == "2"  # 8 cores, 4 processes
        assert env[ev.TP_SOCKET_IFNAME] == env[ev.GLOO_SOCKET_IFNAME] == "lo"
        for name in (ev.RANK, ev.WORLD_SIZE, ev.MASTER_ADDR, ev.MASTER_PORT, ev.LOCAL_RANK):
            assert name not in env


def test_each_role_gets_what_paddle_3s_launcher_gives_it():
    """paddle.distributed.launch (controllers/ps.py): both roles get the trainers' endpoints, their own port and
    address (fleet's role maker: 'Can not find PADDLE_PORT' without them), PADDLE_ROLE, and the gloo rendezvous
    of fleet.util (HTTP, served by server 0's role maker) without which fleet.util.all_reduce is local."""
    p = plan(server_num=1, worker_num=2, started_port=6170)
    w = by_label(p)
    server, trainer = w["server 0"].env, w["trainer 1"].env
    assert trainer[ev.PORT] == "6172" and trainer[ev.POD_IP] == "127.0.0.1" and trainer[ev.PADDLE_ROLE] == "TRAINER"
    assert server[ev.PADDLE_ROLE] == "PSERVER" and server[ev.TRAINER_ENDPOINTS] == "127.0.0.1:6171,127.0.0.1:6172"
    for env in (server, trainer):
        assert (env[ev.WITH_GLOO], env[ev.GLOO_RENDEZVOUS]) == ("1", "3")
        assert env[ev.GLOO_HTTP_ENDPOINT] == "127.0.0.1:6173"  # the port after the trainers'
    listed = plan(servers="127.0.0.1:6170", workers="127.0.0.1:6171")
    assert listed.workers[0].env[ev.GLOO_HTTP_ENDPOINT] == "127.0.0.1:6767"  # Paddle's --gloo_port default
    chosen = plan(server_num=1, worker_num=1, started_port=6170, gloo_port=7000, with_gloo="2")
    assert (chosen.workers[0].env[ev.GLOO_HTTP_ENDPOINT], chosen.workers[0].env[ev.WITH_GLOO]) == ("127.0.0.1:7000", "2")
    assert chosen.ports == (6171, 6170)  # no port taken for the rendezvous
    assert "--gloo_port 6171 is also the port" in refused(server_num=1, worker_num=1, started_port=6170, gloo_port=6171)
    assert "--with_gloo 'yes' is not 0, 1 or 2" in refused(server_num=1, with_gloo="yes")


def test_collective_variables_of_the_launchers_environment_are_not_passed_on():
    p = plan(env={ev.RANK: "3", ev.MASTER_ADDR: "10.9.9.9", ev.TRAINING_ROLE: "PSERVER", "HOME": "/root"}, worker_num=1)
    assert p.base_env == {"HOME": "/root"}
    assert [w.label for w in p.workers] == ["trainer 0", "server 0", "server 1"]  # a missing count is 2


def test_free_ports_when_no_start_port():
    p = plan(server_num=1, worker_num=1, free=(41000, 42000, 43000))
    assert p.servers == ("127.0.0.1:41000",) and p.trainers == ("127.0.0.1:42000",)
    assert p.workers[0].env[ev.GLOO_HTTP_ENDPOINT] == "127.0.0.1:43000"  # and one for fleet's gloo rendezvous
    assert "give --started_port" in refused(server_num=3, worker_num=3, free=(1, 2))


@pytest.mark.parametrize("opts, words", [
    (dict(server_num=0), "--server_num 0 is not a positive whole number"),
    (dict(worker_num=-1), "--worker_num -1 is not a positive whole number"),
    (dict(server_num=True), "--server_num True"),
    (dict(worker_num=70000), "more processes than a node has ports"),
    (dict(server_num=2, started_port=65534), "needs ports 65534 to 65538"),
    (dict(server_num=1, selected_gpus="0"), "--selected_gpus belongs to collective training"),
    (dict(server_num=1, nproc_per_node=2), "--nproc_per_node belongs to collective training"),
    (dict(worker_num=1, cluster_node_ips="10.0.0.1,10.0.0.2"), "--cluster_node_ips belongs to collective training"),
    (dict(servers="127.0.0.1:6170"), "--workers is missing"),
    (dict(workers="127.0.0.1:6170"), "--servers is missing"),
    (dict(servers="127.0.0.1:6170", workers="127.0.0.1:6171", started_port=7000), "--started_port has no meaning"),
    (dict(servers="127.0.0.1:6170", workers="127.0.0.1:6170"), "the endpoint 127.0.0.1:6170 twice"),
    (dict(servers="127.0.0.1:6170,", workers="127.0.0.1:6171"), "has an empty endpoint"),
    (dict(servers="127.0.0.1", workers="127.0.0.1:6171"), "endpoint '127.0.0.1', which has no port"),
    (dict(servers="127.0.0.1:0", workers="127.0.0.1:6171"), "has the port '0', not a whole number from 1 to 65535"),
    (dict(servers="127.0.0.1:99999", workers="127.0.0.1:6171"), "has the port '99999', not a whole number from 1 to 65535"),
    (dict(servers="bad_host!:1", workers="127.0.0.1:6171"), "endpoint 'bad_host!:1', which is not HOST:PORT"),
    (dict(servers="bad_host:1", workers="127.0.0.1:6171"), "address 'bad_host' is malformed"),
    (dict(servers="127.0.0.1:6170", workers="127.0.0.1:6171", server_num=2), "--server_num 2 disagrees with --servers"),
    (dict(servers="127.0.0.1:6170", workers="127.0.0.1:6171", worker_num=3), "--worker_num 3 disagrees with --workers"),
    (dict(servers=SERVERS, workers=WORKERS), "none of them is an address of this machine; give --node_ip"),
    (dict(servers=SERVERS, workers=WORKERS, node_ip="10.0.0.9"), "--node_ip 10.0.0.9 hosts none of the"),
    (dict(server_num=1, shutdown_timeout=float("nan")), "--shutdown_timeout nan"),
    (dict(server_num=1, max_restarts=-1), "--max_restarts -1"),
    (dict(server_num=1, module=True, no_python=True), "exclude each other"),
])
def test_bad_input_is_refused_with_the_value_and_the_fix(opts, words):
    assert words in refused(**opts)


def test_each_node_starts_its_own_endpoints_and_node_zero_hosts_the_store():
    a = plan(servers=SERVERS, workers=WORKERS, node_ip="10.0.0.1")
    b = plan(NODE_B, servers=SERVERS, workers=WORKERS)  # found among this machine's addresses
    assert a.node_ips == b.node_ips == ("10.0.0.1", "10.0.0.2")
    assert (a.node_rank, b.node_rank) == (0, 1)
    assert [w.label for w in a.workers] == ["trainer 0", "server 0"]
    assert [w.label for w in b.workers] == ["trainer 1", "trainer 2", "server 1"]
    assert a.store_port == 6170 and b.store_port is None
    assert by_label(b)["trainer 2"].env[ev.CURRENT_ENDPOINT] == "10.0.0.2:6172"
    assert a.job_ports == b.job_ports == (6170, 6170, 6171, 6171, 6172)
    # one job across nodes: the same control channel on both, next to server 0's port by default
    assert a.control == b.control and a.control.port == 6169
    assert plan(servers=SERVERS, workers=WORKERS, node_ip="10.0.0.1", control_port=7000).control.port == 7000
    assert "is also the port of a process on node 0" in refused(servers=SERVERS, workers=WORKERS, node_ip="10.0.0.1",
                                                               control_port=6171)


def test_a_default_node_ip_with_several_local_hosts_is_ambiguous():
    host = HostFacts(gpu_count=None, cpu_count=2, interfaces=(Interface("a", "10.0.0.1", "255.0.0.0"),
                                                              Interface("b", "10.0.0.2", "255.0.0.0")))
    with pytest.raises(LaunchError, match="several of them are addresses of this machine"):
        plan(host, servers=SERVERS, workers=WORKERS)


def test_the_plan_table_shows_both_roles():
    text = format_plan(plan(server_num=1, worker_num=2, started_port=6170, log_dir="L"))
    assert "parameter-server job, node 0 of 1 (127.0.0.1): 1 server(s) and 2 trainer(s) here" in text
    assert "servers: 127.0.0.1:6170" in text and "trainers: 127.0.0.1:6171,127.0.0.1:6172" in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("  server ", "  trainer "))]
    assert rows == [["trainer", "0", "127.0.0.1:6171", "L/workerlog.0"], ["trainer", "1", "127.0.0.1:6172", "L/workerlog.1"],
                    ["server", "0", "127.0.0.1:6170", "L/serverlog.0"]]


def test_collective_mode_stays_the_default():
    p = plan()
    assert not p.parameter_server and p.servers == () and p.workers[0].label == "rank 0"


def test_each_node_holds_the_servers_and_trainers_at_its_address():
    a = plan(servers=SERVERS, workers=WORKERS, node_ip="10.0.0.1", host=NODE_B)
    b = plan(servers=SERVERS, workers=WORKERS, node_ip="10.0.0.2", host=NODE_B)
    assert held_by(a) == held_by(b) == (((0,), (0,)), ((1,), (1, 2)))
    trainers_only = plan(servers="10.0.0.1:6170", workers="10.0.0.2:6171,[::1]:6172", node_ip="10.0.0.2", host=NODE_B)
    assert trainers_only.node_ips == ("10.0.0.1", "10.0.0.2", "::1")
    assert held_by(trainers_only) == (((0,), ()), ((), (0,)), ((), (1,)))
