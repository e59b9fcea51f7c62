"""torchrun's command line, mapped onto the launcher's options (launcher.cli.torchrun) and planned."""

import os

import click
import pytest
from click.testing import CliRunner

from conftest import assert_refused_in_one_line
from launcher.cli import main as cli
from launcher.plan.clusters import registry
from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan.model import HostFacts, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.cli import table
from launcher.cli.torchrun import own_names, to_ours
from launcher.plan.parsing import node_range
from launcher.plan.streams import StreamChoice

HOST = HostFacts(gpu_count=None, cpu_count=6, python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")
DEFAULTS = {name: table.ROW[name].default for name in own_names()}


def ours(given=(), env=None, **values):
    if values.get("nnodes") is not None:
        values["nnodes"] = node_range(values["nnodes"])  # as the command line reads it
    return to_ours({**DEFAULTS, "training_script": "train.py", **values}, lambda name: name in given, env)


def test_every_torchrun_option_is_accepted_by_the_command_line():
    torchrun_options = {"--standalone", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-backend",
                        "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--nproc-per-node", "--max-restarts", "--redirects",
                        "--tee", "--local-ranks-filter", "--role", "--run-path", "--monitor-interval", "--start-method",
                        "--log-dir", "--no-python", "--module", "-m", "--local-addr", "-r", "-t"}
    spelled = {s for p in cli.launch.params for s in getattr(p, "opts", ())}
    assert torchrun_options <= spelled
    help_text = CliRunner().invoke(cli.launch, ["--help"]).output
    assert "--rdzv-endpoint" in help_text and "--local-ranks-filter" in help_text


def test_one_node_options_map_onto_ours():
    assert ours()["role"] == "default" and "nnodes" not in ours()
    values = ours(standalone=True, rdzv_id="job7", role="trainer")
    assert (values["nnodes"], values["job_id"], values["role"]) == (1, "job7", "trainer")
    assert cli.request_of(["--standalone", "--local-addr", "127.0.0.3", "train.py"], {}).options.node_ip == "127.0.0.3"
    assert "started_port" not in values  # --standalone: a free port
    assert ours(nnodes="1", master_port=29517)["started_port"] == 29517
    fields = {"role", "node_rank", "master_addr", "nnodes", "virtual_local_rank", "duplicate_stdout_filters",
              "duplicate_stderr_filters", "numa_binding"}  # torchrun's names that are fields of the options too
    assert not set(own_names()) - fields & set(ours(standalone=True))


def test_several_nodes_map_onto_a_gathered_cluster():
    values = ours(nnodes="2:2", node_rank=1, master_addr="10.0.0.1")
    assert (values["nnodes"], values["node_rank"], values["master_addr"], values["started_port"]) == (2, 1, "10.0.0.1", 29500)
    values = ours(nnodes="2", node_rank=0, rdzv_backend="c10d", rdzv_endpoint="node0:1234", master_addr="x")
    assert (values["master_addr"], values["started_port"]) == ("node0", 1234)
    assert ours(nnodes="2", node_rank=0, rdzv_endpoint="node0")["started_port"] == 29400
    assert ours(nnodes="2", node_rank=0, master_port=7000, started_port=6000, given=("started_port",))["started_port"] == 6000


def test_an_elastic_range_with_c10d_maps_onto_an_elastic_spec_whose_round_gives_the_nodes():
    values = ours(nnodes="2:3", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29650", rdzv_conf="last_call_timeout=2")
    spec = values["elastic"]
    assert (spec.min_nodes, spec.max_nodes, spec.host, spec.port) == (2, 3, "127.0.0.1", 29650)
    assert spec.rendezvous.last_call_timeout == 2
    assert (values["nnodes"], values["master_addr"], values["started_port"]) == (None, "127.0.0.1", 29651)  # the endpoint is node 0's membership
    assert "elastic" not in ours(nnodes="2:2", node_rank=1, master_addr="10.0.0.1")


@pytest.mark.parametrize("nnodes", ["2:3", "2", "3:3", None])
@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_etcd_at_any_count_maps_onto_an_elastic_spec_in_etcd(nnodes, backend):
    values = ours(nnodes=nnodes, rdzv_backend=backend, rdzv_endpoint="10.0.0.5:2379,10.0.0.6", rdzv_id="job1",
                  rdzv_conf="cacert=ca.pem,join_timeout=60", env={})
    spec = values["elastic"]
    assert (spec.backend, spec.host, spec.port, spec.job_id) == ("etcd", "10.0.0.5", 2379, "job1") and spec.elastic
    assert (spec.etcd.endpoints, spec.etcd.protocol, spec.etcd.cacert) == (
        (("10.0.0.5", 2379), ("10.0.0.6", 2379)), "https", "ca.pem")
    assert spec.rendezvous.join_timeout == 60
    assert values["nnodes"] is None and "master_addr" not in values and "started_port" not in values  # no node 0
    assert values["job_id"] == "job1"


def test_standalone_is_one_node_whatever_the_backend():
    assert "elastic" not in ours(standalone=True, rdzv_backend="etcd")


def test_the_etcd_password_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("LAUNCHER_ETCD_PASSWORD", "pw")
    spec = ours(nnodes="2", rdzv_backend="etcd", rdzv_endpoint="h1", rdzv_conf="user=root")["elastic"]
    assert (spec.etcd.user, spec.etcd.password) == ("root", "pw")
    monkeypatch.delenv("LAUNCHER_ETCD_PASSWORD")
    with pytest.raises(LaunchError, match="^the etcd user root has no password; give it in LAUNCHER_ETCD_PASSWORD"):
        ours(nnodes="2", rdzv_backend="etcd", rdzv_endpoint="h1", rdzv_conf="user=root")


@pytest.mark.parametrize("values, sentence", [
    ({"nnodes": "2:3"}, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd (2379 is etcd's client port), the "
                        "same on every node."),
    ({"nnodes": "2"}, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd (2379 is etcd's client port), the "
                      "same on every node."),
    ({}, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd (2379 is etcd's client port), the same on every "
         "node."),
    ({"nnodes": "2", "node_rank": 1, "rdzv_endpoint": "h1"}, "--node-rank 1 fixes this node's rank, but the ranks of an "
     "elastic job (--nnodes 2) come from the order the nodes join; drop --node-rank."),
    ({"nnodes": "2:3", "rdzv_endpoint": "h1:x"}, "--rdzv-endpoint h1:x has the endpoint 'h1:x', which is not HOST:PORT; "
     "give etcd's address and client port, such as 10.0.0.1:2379."),
    ({"nnodes": "2:3", "rdzv_endpoint": "h1", "rdzv_conf": "cert=c.pem"}, "--rdzv-conf gives cert without key (or key "
     "without cert); a client certificate needs both: cert=CLIENT.pem,key=CLIENT-key.pem."),
])
def test_a_bad_etcd_line_of_torchrun_is_refused_in_one_sentence(values, sentence):
    with pytest.raises(LaunchError) as e:
        ours(rdzv_backend="etcd", env={}, **values)
    assert str(e.value) == sentence


def test_etcd_keys_in_rdzv_conf_of_a_c10d_job_are_refused():
    with pytest.raises(LaunchError) as e:
        ours(nnodes="2:3", rdzv_backend="c10d", rdzv_conf="protocol=https")
    assert str(e.value) == "--rdzv-conf protocol= is for an etcd rendezvous; give --rdzv-backend etcd, or drop it."


@pytest.mark.parametrize("args, sentence", [
    (("--nnodes", "2:3", "--rdzv-backend", "etcd"), "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd"),
    (("--nnodes", "2", "--rdzv-backend", "etcd-v2"), "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd"),
    (("--nnodes", "2:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", "ftp://127.0.0.1:2379"),
     "--rdzv-endpoint ftp://127.0.0.1:2379 names the scheme 'ftp'"),
    (("--nnodes", "2:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1", "--rdzv-conf", "user=root"),
     "the etcd user root has no password"),
])
def test_a_bad_etcd_command_line_exits_2_with_one_line(tmp_path, args, sentence):
    assert_refused_in_one_line(tmp_path, args, sentence)


@pytest.mark.parametrize("values, fragment", [
    ({"nnodes": "1:4"}, "--nnodes 1:4 with --rdzv-backend static: a static rendezvous has a fixed number of nodes"),
    ({"nnodes": "2:4", "rdzv_backend": "c10d", "node_rank": 1}, "--node-rank"),
    ({"nnodes": "2:4", "rdzv_backend": "c10d", "rdzv_conf": "joint_timeout=5"}, "unknown key 'joint_timeout'"),
    ({"standalone": True, "nnodes": "2"}, "--standalone runs one node, but --nnodes is 2"),
    ({"nnodes": "2", "node_rank": 0, "rdzv_endpoint": "host:http"}, "--rdzv-endpoint host:http is not HOST:PORT"),
])
def test_bad_torchrun_values_are_refused_with_the_fix(values, fragment):
    with pytest.raises(LaunchError, match=fragment):
        ours(**values)


@pytest.mark.parametrize("nnodes", ["2", "2:2", "4"])
@pytest.mark.parametrize("env", [{}, {"SLURM_NODEID": ""}])
def test_torchruns_own_recipe_a_count_at_c10d_with_no_node_rank_is_an_elastic_job_of_n_to_n(nnodes, env):
    """``--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` on every node: ranks in the order of arrival."""
    request = cli.request_of(["--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-id", "job9", "--rdzv-backend", "c10d",
                              "--rdzv-endpoint", "10.0.0.1:29500", "train.py"], env)
    spec, count = request.elastic, int(nnodes.split(":")[0])
    assert (spec.min_nodes, spec.max_nodes, spec.backend, spec.host, spec.port) == (count, count, "c10d", "10.0.0.1", 29500)
    assert (spec.job_id, request.options.started_port, request.nodes_expected) == ("job9", 29501, None)


@pytest.mark.parametrize("args, env", [
    (("--node-rank", "1"), {}),  # a node rank given: a fixed job, as before
    ((), {"SLURM_NODEID": "1"}),  # srun's node index
    (("--rdzv-backend", "static"), {}),  # torchrun's default rendezvous: node rank 0
])
def test_a_count_with_a_node_rank_or_on_the_static_rendezvous_stays_a_fixed_job(args, env):
    line = ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29500", *(() if "--rdzv-backend" in args else
                                                                     ("--rdzv-backend", "c10d")), *args, "train.py"]
    request = cli.request_of(line, env)
    assert request.elastic is None and request.options.nnodes == 2
    assert request.options.node_rank == (0 if "static" in args else 1)


@pytest.mark.parametrize("endpoint, host, port", [
    ("10.0.0.1:29500", "10.0.0.1", 29500), ("[::1]:29500", "::1", 29500), ("[fe80::1%eth0]:2", "fe80::1%eth0", 2),
    ("node0", "node0", 29400), ("fe80::1", "fe80::1", 29400), ("[::1]", "::1", 29400), ("node0:1", "node0", 1),
    ("node0:65535", "node0", 65535),
])
def test_a_fixed_jobs_rdzv_endpoint_is_node_0_and_its_store_port(endpoint, host, port):
    options = cli.request_of(["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint, "train.py"], {}).options
    assert (options.master_addr, options.started_port) == (host, port)
    elastic = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--started_port", "6070"]
    spec = cli.request_of([*elastic, "train.py"], {}).elastic  # node 0 keeps the membership on PORT
    assert (spec.host, spec.port) == (host, port)


def test_an_elastic_jobs_node_0_leaves_a_port_above_its_own_for_the_workers():
    line = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    assert cli.request_of([*line, "node0:65534", "train.py"], {}).options.started_port == 65535
    with pytest.raises(LaunchError) as refusal:
        cli.request_of([*line, "node0:65535", "train.py"], {})
    assert str(refusal.value) == ("node 0's port 65535 leaves no port above it for the workers, whose ports start one "
                                  "above node 0's; give node 0 a lower port, or --started_port.")
    with pytest.raises(LaunchError, match="^node 0's port 65535 leaves no port above it"):
        cli.request_of(["--nnodes", "1:2", "--master", "node0:65535", "train.py"], {})


@pytest.mark.parametrize("nodes", [("--nnodes", "2", "--node-rank", "1"), ("--nnodes", "1:2", "--rdzv-backend", "c10d")])
@pytest.mark.parametrize("endpoint", ["node0:0", "node0:65536", "[::1", "::1:29500", "[node0]:29500", "h/x:1"])
def test_a_bad_rdzv_endpoint_exits_2_naming_it(tmp_path, nodes, endpoint):
    assert_refused_in_one_line(tmp_path, (*nodes, "--rdzv-endpoint", endpoint), f"--rdzv-endpoint {endpoint} is not "
                               "HOST:PORT; give node 0's address and a port such as 10.0.0.1:29400.")


def test_the_master_port_takes_the_ports_every_address_takes():
    line = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port"]
    assert cli.request_of([*line, "1", "train.py"], {}).options.started_port == 1
    assert cli.request_of([*line, "65535", "train.py"], {}).options.started_port == 65535
    with pytest.raises(click.BadParameter, match="'0' is not a port from 1 to 65535; give a whole number in that range"):
        cli.request_of([*line, "0", "train.py"], {})
    with pytest.raises(LaunchError, match="^PET_MASTER_PORT=0: '0' is not a port from 1 to 65535"):
        cli.request_of(["train.py"], {"PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h",
                                      "PET_MASTER_PORT": "0"})


@pytest.mark.parametrize("args, sentence", [
    (("--nnodes", "3:2", "--rdzv-backend", "c10d"), "'3:2' has its minimum above its maximum; give MIN:MAX with MIN at "
                                                    "most MAX, such as 2:3."),
    (("--nnodes", "two"), "'two' is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4."),
    (("--nnodes", "0"), "'0' is not a number of nodes; give 1 or more."),
])
def test_a_bad_number_of_nodes_is_refused_by_the_one_parser_of_n_or_min_max(args, sentence):
    with pytest.raises(click.BadParameter) as e:
        cli.request_of([*args, "train.py"], {})
    assert e.value.format_message() == f"Invalid value for '--nnodes' / '--np': {sentence}"
    with pytest.raises(LaunchError) as e:
        cli.request_of(["train.py"], {"PET_NNODES": args[1], "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:1"})
    assert str(e.value).startswith(f"PET_NNODES={args[1]}: {sentence[:-1]}; fix the variable")


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_a_monitor_interval_that_is_not_a_positive_number_is_refused(seconds):
    with pytest.raises(LaunchError, match=f"^--monitor-interval {seconds:g} is not a positive number of seconds"):
        ours(monitor_interval=seconds)


def test_accepted_with_no_effect():
    """--run-path (a fresh interpreter runs the script by its path either way), --monitor-interval (exits are
    seen as they happen), --start-method (every worker is a fresh process): nothing of theirs reaches the plan."""
    plain = ours()
    assert ours(run_path=True, monitor_interval=0.5, start_method="fork") == plain
    assert ours(rdzv_conf="timeout=5") == {**plain, "join_timeout": 5}  # the static rendezvous's join timeout
    result = CliRunner().invoke(cli.launch, ["--start-method", "thread", "train.py"])
    assert result.exit_code == 2 and "'thread' is not one of 'spawn', 'fork', 'forkserver'" in result.output


def test_streams_map_onto_the_plans_choice_and_a_log_dir():
    assert "stream_choice" not in ours(log_dir="logs")
    values = ours(redirects="0:3", tee="1", local_ranks_filter="0", log_dir="logs")
    assert values["stream_choice"] == StreamChoice({0: 3}, 1, frozenset({0})) and values["log_dir"] == "logs"
    assert ours(local_ranks_filter="1")["stream_choice"] == StreamChoice(shown=frozenset({1}))
    assert ours(local_ranks_filter="1").get("log_dir") is None  # the filter alone writes no file
    made = ours(tee="3")["log_dir"]  # no --log_dir: a fresh folder of torchrun's kind
    assert os.path.basename(made).startswith("torchelastic_") and os.path.isdir(made)
    os.rmdir(made)
    with pytest.raises(LaunchError, match="^--redirects 9 is not a choice of streams"):
        ours(redirects="9")


def test_torchrun_nodes_and_cluster_node_ips_exclude_each_other():
    with pytest.raises(LaunchError, match="both name the nodes"):
        ours(nnodes="2", node_rank=0, given=("cluster_node_ips",))


def test_plan_of_torchrun_nodes():
    opts = LaunchOptions("train.py", nnodes=2, node_rank=1, master_addr="127.0.0.1", started_port=29500, node_ip="127.0.0.2")
    with_nodes = HostFacts(**{**HOST.__dict__, "gathered_nodes": ("127.0.0.1", "127.0.0.2")})
    p = make_plan(opts, {}, with_nodes)
    assert p.node_rank == 1 and p.world_size == 4 and p.ports == (29500, 29501)
    assert p.workers[0].env[ev.MASTER_ADDR] == "127.0.0.1" and p.workers[0].env[ev.RANK] == "2"
    assert p.control.port == 29499
    spec = registry.gathering(opts, {})
    assert (spec.rank, spec.size, spec.master, spec.port) == (1, 2, "127.0.0.1", 29499)
    with pytest.raises(LaunchError, match="--node-rank 2 is not a rank of --nnodes 2"):
        make_plan(LaunchOptions("t.py", nnodes=2, node_rank=2, master_addr="h", started_port=29500), {}, HOST)


@pytest.mark.parametrize("word, gpus, workers", [("auto", None, 6), ("cpu", None, 6), ("auto", 4, 4), ("gpu", 4, 4)])
def test_nproc_per_node_words(word, gpus, workers):
    host = HostFacts(**{**HOST.__dict__, "gpu_count": gpus})
    assert len(make_plan(LaunchOptions("t.py", nproc_per_node=word), {}, host, lambda ip, n: range(9000, 9000 + n)).workers) == workers


def test_nproc_per_node_gpu_without_a_gpu_is_refused():
    with pytest.raises(LaunchError, match="--nproc_per_node gpu, but this machine has no GPU"):
        make_plan(LaunchOptions("t.py", nproc_per_node="gpu"), {}, HOST)


def test_pytorch_examples_recipes():
    """The torchrun lines of pytorch/examples' run_example.sh scripts and slurm/sbatch_run.sh, as given there."""
    args = ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", "--rdzv_endpoint=localhost:5972", "example.py"]
    ctx = cli.launch.make_context("launcher", args)
    values = to_ours(ctx.params, lambda name: False)
    assert (values["nnodes"], values["nproc_per_node"], values["job_id"], values["started_port"]) == (1, 2, "101", 5972)
    ctx = cli.launch.make_context("launcher", ["--standalone", "--nproc_per_node=16", "main.py"])  # minGPT-ddp
    assert to_ours(ctx.params, lambda name: False)["nproc_per_node"] == 16
    srun = ["--nnodes", "4", "--nproc_per_node", "1", "--rdzv_id", "2024", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", "10.0.0.1:29500", "multinode_torchrun.py", "50", "10"]
    ctx = cli.launch.make_context("launcher", srun)
    values = to_ours(ctx.params, lambda name: False, {"SLURM_NODEID": "3"})
    assert (values["nnodes"], values["node_rank"], values["master_addr"], values["started_port"]) == (4, 3, "10.0.0.1", 29500)


def test_nnodes_is_paddles_check_when_paddles_options_name_the_nodes():
    """One --nnodes for both command lines: with --ips (or --master, --rank, --host, --cluster_node_ips) it is
    Paddle 3's count of the nodes, checked later; torchrun's node options beside them are refused."""
    values = ours(nnodes="2", given=("ips",))
    assert str(values["nnodes"]) == "2" and "node_rank" not in values and "master_addr" not in values
    with pytest.raises(LaunchError, match="--master-addr \\(torchrun's\\) and Paddle's node options both name the nodes"):
        ours(nnodes="2", master_addr="127.0.0.1", given=("ips",))
    assert ours(nnodes="2", node_rank=1)["nnodes"] == 2  # no Paddle option: torchrun's


def test_every_variable_torchrun_reads_is_one_of_ours():
    """The real torchrun's parser (torch.distributed.run): each option it reads from PET_* is one we read too."""
    torch_run = pytest.importorskip("torch.distributed.run")
    from torch.distributed.argparse_util import check_env, env

    from launcher.cli import pet

    read = {a.dest for a in torch_run.get_args_parser()._actions if isinstance(a, (env, check_env))}
    assert read == {row.name for row in pet.read_rows()}
    flags = {a.dest for a in torch_run.get_args_parser()._actions if isinstance(a, check_env)}
    assert flags == {row.name for row in pet.read_rows() if row.click.get("is_flag")}
