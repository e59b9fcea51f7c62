"""Paddle 2.6/3.x's and fleetrun's command lines, mapped onto this launcher's options: every option, one test
each, through the real click command and the plan."""


import click
import pytest
from click.testing import CliRunner

from conftest import assert_refused_in_one_line
from launcher import envvars as ev
from launcher.cli import paddle as paddle_cli
from launcher.cli import table
from launcher.cli.main import launch, request_of
from launcher.cli.request import given_in
from launcher.errors import LaunchError
from launcher.plan.model import HostFacts, Interface
from launcher.plan.planner import make_plan

HOST = HostFacts(gpu_count=4, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),))


def plan_of(*args, env=None):
    request = request_of([*args, "train.py"], env or {})
    plan = make_plan(request.options, env or {}, HOST, lambda ip, n: tuple(range(30000, 30000 + n)))
    if request.nodes_expected not in (None, len(plan.node_ips)):
        raise LaunchError(f"--nnodes {request.nodes_expected} disagrees with the {len(plan.node_ips)} node(s)")
    return plan


def refused(*args) -> str:
    with pytest.raises(LaunchError) as e:
        plan_of(*args)
    return str(e.value)


@pytest.mark.parametrize("spelling", ["--devices", "--gpus"])
def test_devices_and_gpus_are_selected_gpus(spelling):
    assert [w.gpu for w in plan_of(spelling, "1,3").workers] == ["1", "3"]
    assert "disagrees with --selected_gpus" in refused(spelling, "1", "--selected_gpus", "2")


def test_ips_host_rank_and_master_place_this_node():
    p = plan_of("--ips", "127.0.0.1,127.0.0.2", "--rank", "1", "--start_port", "6170", "--nproc_per_node", "1",
                "--master", "127.0.0.1:8090", "--devices", "0")
    assert p.node_ips == ("127.0.0.1", "127.0.0.2") and p.node_rank == 1 and p.control.port == 8090
    assert plan_of("--ips", "127.0.0.1,127.0.0.2", "--host", "127.0.0.2", "--devices", "0").node_rank == 1
    assert "--rank 1 is node 127.0.0.2 of --ips, but --host/--node_ip is 127.0.0.1" in refused(
        "--ips", "127.0.0.1,127.0.0.2", "--rank", "1", "--host", "127.0.0.1")
    assert "--rank 2 is not a node rank" in refused("--ips", "127.0.0.1,127.0.0.2", "--rank", "2")
    assert "is not on node 0 (127.0.0.1" in refused("--ips", "127.0.0.1,127.0.0.2", "--master", "127.0.0.2:8090")
    assert "is not IP:PORT" in refused("--master", "127.0.0.1")


@pytest.mark.parametrize("master, sentence", [
    ("etcd://127.0.0.1:2379", "--master etcd://127.0.0.1:2379 keeps the job's membership in etcd, which needs the "
                              "number of nodes; give --nnodes N or MIN:MAX too, the same on every node."),
    ("etcd://root:secret@127.0.0.1:2379", "--master etcd://...@127.0.0.1:2379 keeps the job's membership in etcd, which "
                                          "needs the number of nodes; give --nnodes N or MIN:MAX too, the same on every node."),
    ("http://127.0.0.1:8090", "--master http://127.0.0.1:8090 is not IP:PORT; give node 0's address and a free port, "
                              "such as 10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with --nnodes)."),
])
def test_master_with_a_scheme_but_no_nnodes_is_refused_naming_the_fix(master, sentence):
    assert refused("--master", master) == sentence


@pytest.mark.parametrize("master, ips, host, port", [
    ("[::1]:8090", "::1,::2", "::1", 8090), ("[fe80::1%eth0]:8090", "fe80::1%eth0,fe80::2%eth0", "fe80::1%eth0", 8090),
    ("127.0.0.1:1", "127.0.0.1,127.0.0.2", "127.0.0.1", 1), ("node0:65535", "node0,node1", "node0", 65535),
])
def test_master_is_node_0s_address_and_port_an_ipv6_one_in_brackets(master, ips, host, port):
    assert request_of(["--ips", ips, "--master", master, "train.py"], {}).options.control_port == port
    spec = request_of(["--nnodes", "2:3", "--master", master, "--started_port", "6070", "train.py"], {}).elastic
    assert (spec.host, spec.port) == (host, port)


@pytest.mark.parametrize("args, sentence", [
    (("--master", "fe80::1:8090"), "--master fe80::1:8090 is not IP:PORT; give node 0's address and a free port, such "
                                   "as [fe80::1]:8090."),
    (("--nnodes", "2:3", "--master", "fe80::1:8090"), "--master fe80::1:8090 is not IP:PORT; give node 0's address "
                                                      "and a free port, such as [fe80::1]:8090."),
    (("--master", "10.0.0.1:0"), "--master 10.0.0.1:0 is not IP:PORT; give node 0's address and a free port, such as "
                                 "10.0.0.1:8090."),
    (("--master", "[::1"), "--master [::1 is not IP:PORT; give node 0's address and a free port, such as "
                           "[fe80::1]:8090."),
    (("--ips", "::1,::2", "--master", "[::2]:8090"), "--master [::2]:8090 is not on node 0 (::1, the first of --ips): "
                                                     "the rendezvous is node 0's; give --master [::1]:8090."),
    (("--master", "ftp://u:secret@h:1"), "--master ftp://...@h:1 is not IP:PORT; give node 0's address and a free "
                                         "port, such as 10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with --nnodes)."),
    (("--nnodes", "2", "--master", "ftp://h:1"), "--master ftp://h:1 is not IP:PORT; give node 0's address and a free "
                                                 "port, such as 10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with "
                                                 "--nnodes)."),
    (("--master", "127.0.0.1:8090", "--control_port", "8091"), "--master 127.0.0.1:8090 disagrees with --control_port "
                                                               "8091; give one of them."),
])
def test_a_bad_master_exits_2_naming_it(tmp_path, args, sentence):
    assert_refused_in_one_line(tmp_path, args, sentence)


def test_sort_ip_ranks_the_nodes_by_address():
    p = plan_of("--ips", "127.0.0.10,127.0.0.2", "--sort_ip", "true", "--host", "127.0.0.2", "--devices", "0")
    assert p.node_ips == ("127.0.0.2", "127.0.0.10") and p.node_rank == 0


@pytest.mark.parametrize("spelling", ["--nnodes", "--np"])
def test_nnodes_is_checked_against_the_nodes_found(spelling):
    assert plan_of(spelling, "2", "--ips", "127.0.0.1,127.0.0.2", "--devices", "0").node_ips[1] == "127.0.0.2"
    assert "--nnodes 2 disagrees with the 1 node(s)" in refused(spelling, "2", "--ips", "127.0.0.1")
    assert "but --nnodes 1:4 lets 4 join; give all 4 addresses" in refused(spelling, "1:4", "--ips", "127.0.0.1")
    assert len(plan_of(spelling, "2:2", "--ips", "127.0.0.1,127.0.0.2", "--devices", "0").node_ips) == 2


def test_parameter_server_options_of_paddle_3():
    p = plan_of("--trainer_num", "2", "--gloo_port", "7000", "--with_gloo", "2")
    assert [w.label for w in p.workers] == ["trainer 0", "trainer 1", "server 0"]  # Paddle 3: 1 server by default
    assert p.workers[0].env[ev.GLOO_HTTP_ENDPOINT] == "127.0.0.1:7000" and p.workers[0].env[ev.WITH_GLOO] == "2"
    listed = plan_of("--servers", "127.0.0.1:6170", "--trainers", "127.0.0.1:6171,127.0.0.1:6172", "--http_port", "7100")
    assert listed.trainers == ("127.0.0.1:6171", "127.0.0.1:6172")
    assert listed.workers[0].env[ev.GLOO_HTTP_ENDPOINT] == "127.0.0.1:7100"
    assert [w.label for w in plan_of("--run_mode", "ps").workers] == ["trainer 0", "server 0"]
    assert "--run_mode collective disagrees with --server_num" in refused("--run_mode", "collective", "--server_num", "1")
    assert "--run_mode ps-heter is not supported" in refused("--run_mode", "ps-heter")
    for name in ("--gloo_port", "--http_port", "--with_gloo"):
        assert f"{name} sets fleet's gloo rendezvous of a parameter-server job" in refused(name, "2")


def test_restarts_timeouts_backend_and_the_flags_that_change_nothing():
    assert plan_of("--max_restart", "3").max_restarts == 3
    p = plan_of("--ips", "127.0.0.1,127.0.0.2", "--elastic_timeout", "42", "--devices", "0")
    assert p.control.join_timeout == 42
    cpu = plan_of("--backend", "gloo")
    assert cpu.base_env[ev.DISTRI_BACKEND] == "gloo"
    assert "--backend bkcl is not supported" in refused("--backend", "bkcl")
    for args in (("--backend", "nccl"), ("--backend", "auto"), ("--legacy", "true"), ("--elastic_level", "-1"),
                 ("--log_overwrite", "false"), ("--job_id", "j1"), ("--log_level", "DEBUG")):
        assert plan_of(*args).workers
    assert "--log_overwrite true cannot be honoured" in refused("--log_overwrite", "true")
    assert "--elastic_level 1 sets an elastic job's answer to a failure, and this job has a fixed number" in refused(
        "--elastic_level", "1")
    assert "--legacy maybe is not true or false" in refused("--legacy", "maybe")


@pytest.mark.parametrize("name", table.names(dialect=table.PADDLE3, status=table.REFUSED))
def test_an_option_that_cannot_be_honoured_is_refused_naming_why(name):
    r = CliRunner().invoke(launch, [f"--{name}", "1", "train.py"], standalone_mode=False)
    assert isinstance(r.exception, LaunchError)
    assert str(r.exception).startswith(f"--{name} 1 cannot be honoured: ") and f"drop --{name}" in str(r.exception)


def test_every_paddle_option_is_in_the_help():
    r = CliRunner().invoke(launch, ["--help"], terminal_width=200)
    for name in table.names(dialect=table.PADDLE3) + table.names(dialect=table.FLEETRUN):
        assert f"--{name}" in r.output
    for name in ("--with_gloo", "--gloo_port", "--start_port", "--trainers", "--trainer_num"):
        assert name in r.output
    for name in table.names(dialect=table.PADDLE3, status=table.REFUSED):
        assert f"--{name}" in r.output  # named among the refused ones


def test_the_config_file_takes_paddle_names(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("devices: [0, 2]\nmax_restart: 2\nips: 127.0.0.1\n")
    p = plan_of("--config", str(cfg))
    assert [w.gpu for w in p.workers] == ["0", "2"] and p.max_restarts == 2


def elastic_of(*args, env=None):
    ctx = launch.make_context("launcher", [*args, "train.py"])
    return paddle_cli.elastic(ctx.params, given_in(ctx), env)


def test_a_range_with_master_is_an_elastic_job_whose_membership_is_on_the_masters_port():
    values = elastic_of("--nnodes", "2:3", "--master", "127.0.0.1:8090", "--elastic_timeout", "2", "--max_restart", "1")
    spec = values["elastic"]
    assert (spec.min_nodes, spec.max_nodes, spec.host, spec.port, spec.max_restarts) == (2, 3, "127.0.0.1", 8090, 1)
    assert spec.rendezvous.last_call_timeout == 2
    assert (values["master_addr"], values["started_port"], values["nnodes"]) == ("127.0.0.1", 8091, None)
    assert elastic_of("--nnodes", "2:3", "--master", "127.0.0.1:8090", "--elastic_level", "0")["elastic"].failed_node_leaves
    assert elastic_of("--np", "2:3", "--master", "127.0.0.1:8090")["elastic"].max_nodes == 3  # fleetrun's name


@pytest.mark.parametrize("nnodes", ["2", "2:2", "3"])
def test_paddles_own_recipe_master_and_a_count_with_no_rank_is_an_elastic_job_of_n_to_n(nnodes):
    """``--master IP:PORT --nnodes N`` on every node: the nodes take their ranks in the order they arrive."""
    values = elastic_of("--nnodes", nnodes, "--master", "127.0.0.1:8090")
    spec, count = values["elastic"], int(nnodes.split(":")[0])
    assert (spec.min_nodes, spec.max_nodes, spec.backend, spec.host, spec.port) == (count, count, "c10d", "127.0.0.1", 8090)
    assert (values["master_addr"], values["started_port"], values["master"]) == ("127.0.0.1", 8091, None)


@pytest.mark.parametrize("args, env", [
    (("--nnodes", "1"), {}),  # one node: nothing to form
    (("--nnodes", "2", "--rank", "1", "--ips", "127.0.0.1,127.0.0.2"), {}),  # a rank: a fixed job, as before
    (("--nnodes", "2", "--ips", "127.0.0.1,127.0.0.2"), {}),  # the nodes listed
    (("--nnodes", "2", "--cluster_env", "slurm"), {}),  # a scheduler says which node this is
    (("--nnodes", "2",), {"SLURM_STEP_ID": "0", "SLURM_NODEID": "1"}),
])
def test_master_with_a_rank_a_node_list_or_a_scheduler_stays_a_fixed_job(args, env):
    assert elastic_of(*args, "--master", "127.0.0.1:8090", env=env) is None


@pytest.mark.parametrize("args, fragment", [
    (("--nnodes", "1:4"), "needs node 0's address: give --master IP:PORT"),
    (("--nnodes", "3:2", "--master", "127.0.0.1:8090"), "'3:2' has its minimum above its maximum"),
    (("--nnodes", "2:3", "--master", "127.0.0.1:8090", "--rank", "1"), "drop --rank"),
    (("--nnodes", "2:3", "--master", "127.0.0.1:8090", "--elastic_level", "5"), "--elastic_level 5 is not one of"),
    (("--nnodes", "2:3", "--ips", "127.0.0.1,127.0.0.1,127.0.0.1"), "give --master .the same on every node. and no --ips"),
])
def test_a_bad_elastic_line_of_paddle_3_is_refused_naming_the_fix(args, fragment):
    with pytest.raises((LaunchError, click.BadParameter), match=fragment):
        elastic_of(*args)



# ---------------------------------------------------------------- the membership in etcd


def test_elastic_server_is_mapped_not_refused():
    assert table.ROW["elastic_server"].status == table.HONOURED


@pytest.mark.parametrize("nnodes", ["2:3", "2"])
def test_master_etcd_with_nnodes_is_an_elastic_job_in_etcd(nnodes):
    values = elastic_of("--nnodes", nnodes, "--master", "etcd://root:pw@10.0.0.5:2379,10.0.0.6", "--job_id", "j",
                        "--max_restart", "2")
    spec = values["elastic"]
    assert (spec.backend, spec.job_id, spec.max_restarts, spec.host, spec.port) == ("etcd", "j", 2, "10.0.0.5", 2379)
    assert spec.elastic and spec.etcd.endpoints == (("10.0.0.5", 2379), ("10.0.0.6", 2379))
    assert (spec.etcd.user, spec.etcd.password) == ("root", "pw")
    assert values == {"elastic": spec, "nnodes": None, "master": None, "elastic_level": "-1"}  # no node 0's port


@pytest.mark.parametrize("args", [("--np", "2:3"), ("--nnodes", "2"), ()])
def test_elastic_server_with_job_id_is_an_elastic_job_in_etcd(args):
    values = elastic_of("--elastic_server", "10.0.0.5:2379", "--job_id", "job1", *args)
    spec = values["elastic"]
    assert (spec.backend, spec.job_id, spec.etcd.endpoints) == ("etcd", "job1", (("10.0.0.5", 2379),))
    assert values == {"elastic": spec, "nnodes": None, "elastic_server": None}


def test_paddle_elastic_server_variable_is_read():
    values = elastic_of("--np", "2:3", env={"PADDLE_ELASTIC_SERVER": "10.0.0.5:2379", "PADDLE_ELASTIC_JOB_ID": "j"})
    assert (values["elastic"].backend, values["elastic"].job_id, values["elastic"].max_nodes) == ("etcd", "j", 3)


@pytest.mark.parametrize("args, sentence", [
    (("--nnodes", "2:3", "--master", "etcd://"), "--master 'etcd://' names no etcd endpoint; give HOST:PORT of etcd, "
                                                 "such as 10.0.0.1:2379."),
    (("--nnodes", "2", "--master", "etcd://root@10.0.0.5"), "the etcd user root has no password; give it in "
     "LAUNCHER_ETCD_PASSWORD (or etcd://NAME:PASSWORD@HOST:PORT)."),
    (("--nnodes", "2:3", "--master", "etcd://10.0.0.5", "--rank", "1"), "--rank 1 fixes this node's rank, but the ranks "
     "of an elastic job (--nnodes 2:3) come from the order the nodes join; drop --rank."),
    (("--elastic_server", "127.0.0.1:2379", "--np", "2"), "--elastic_server 127.0.0.1:2379 keeps the membership of many "
     "jobs in etcd: give --job_id ID (or PADDLE_ELASTIC_JOB_ID), the same on every node of this job."),
    (("--elastic_server", "127.0.0.1:x", "--job_id", "j"), "--elastic_server 127.0.0.1:x has the endpoint "
     "'127.0.0.1:x', which is not HOST:PORT; give etcd's address and client port, such as 10.0.0.1:2379."),
])
def test_a_bad_etcd_line_of_paddle_is_refused_in_one_sentence(args, sentence):
    with pytest.raises(LaunchError) as e:
        elastic_of(*args)
    assert str(e.value) == sentence


@pytest.mark.parametrize("args, sentence", [
    (("--nnodes", "2:3", "--master", "etcd://"), "--master 'etcd://' names no etcd endpoint"),
    (("--master", "etcd://"), "--master etcd:// keeps the job's membership in etcd, which needs the number of nodes"),
    (("--elastic_server", "127.0.0.1:2379", "--np", "2"), "--elastic_server 127.0.0.1:2379 keeps the membership of "
                                                          "many jobs in etcd: give --job_id ID"),
])
def test_a_bad_etcd_command_line_exits_2_with_one_line(tmp_path, args, sentence):
    assert_refused_in_one_line(tmp_path, args, sentence)
