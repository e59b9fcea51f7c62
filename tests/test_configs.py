"""The ready config files of configs/ load and give the plan they promise."""

from pathlib import Path

import pytest

from launcher.cli.main import launch, request_of
from launcher.errors import LaunchError
from launcher.plan.model import HostFacts, Interface
from launcher.plan.planner import make_plan

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
GPU_HOST = HostFacts(gpu_count=8, cpu_count=32, interfaces=(Interface("eth0", "192.168.1.3", "255.255.255.0"),))
CPU_HOST = HostFacts(gpu_count=None, cpu_count=4)


def plan_from(args, host, env=None):
    opts = request_of(list(args), env or {}).options
    return make_plan(opts, env or {}, host, lambda ip, n: tuple(range(30000, 30000 + n)))


def test_every_shipped_config_is_covered():
    assert {p.name for p in CONFIGS.glob("*.yaml")} == {
        "single_node.yaml", "two_nodes.yaml", "cpu_only.yaml", "paddlecloud.yaml", "parameter_server.yaml",
        "slurm.yaml", "kubeflow.yaml", "volcano.yaml", "mpi.yaml", "lsf.yaml"}


def test_single_node():
    p = plan_from(["--config", str(CONFIGS / "single_node.yaml"), "train.py"], GPU_HOST)
    assert p.device == "gpu" and [w.gpu for w in p.workers] == [str(i) for i in range(8)]
    assert p.workers[3].log_file == "mylog/workerlog.3"


def test_two_nodes_with_this_node_given_on_the_command_line():
    p = plan_from(["--config", str(CONFIGS / "two_nodes.yaml"), "--node_ip", "192.168.1.3", "train.py"], GPU_HOST)
    assert p.world_size == 8 and [w.rank for w in p.workers] == [4, 5, 6, 7]
    assert p.ports == (6170, 6171, 6172, 6173)
    assert p.base_env["NCCL_DEBUG"] == "WARN"


def test_cpu_only():
    p = plan_from(["--config", str(CONFIGS / "cpu_only.yaml"), "train.py"], CPU_HOST)
    assert p.device == "cpu" and len(p.workers) == 2
    assert p.base_env["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in p.workers[0].env


def test_paddlecloud():
    env = {"PADDLE_TRAINERS": "192.168.1.2,192.168.1.3", "POD_IP": "192.168.1.3", "PADDLE_TRAINER_ID": "1",
           "PADDLE_PORT": "35019", "TRAINER_PORTS_NUM": "8", "PADDLE_TRAINERS_NUM": "2"}
    p = plan_from(["--config", str(CONFIGS / "paddlecloud.yaml"), "train.py"], GPU_HOST, env)
    assert p.world_size == 16 and p.workers[0].rank == 8 and p.ports[0] == 35019


# recorded environments of one node of each scheduler's job
SCHEDULER_ENVS = {
    "slurm.yaml": {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[01-02]",
                   "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1"},
    "kubeflow.yaml": {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8",
                      "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"},
    "volcano.yaml": {"VC_TASK_INDEX": "1", "VC_WORKER_HOSTS": "job-worker-0.job,job-worker-1.job", "VC_WORKER_NUM": "2"},
    "lsf.yaml": {"LSB_JOBID": "5", "LSB_MCPU_HOSTS": "batch1 1 h1 8 h2 8"},
}


@pytest.mark.parametrize("name,source", [("slurm.yaml", "slurm"), ("kubeflow.yaml", "kubeflow"),
                                         ("volcano.yaml", "volcano"), ("lsf.yaml", "lsf")])
def test_scheduler_configs_take_the_nodes_from_the_scheduler(name, source):
    host = HostFacts(gpu_count=8, cpu_count=32, interfaces=GPU_HOST.interfaces, hostname="h2")
    p = plan_from(["--config", str(CONFIGS / name), "train.py"], host, SCHEDULER_ENVS[name])
    assert p.cluster.startswith(f"{source} (") and len(p.node_ips) == 2 and p.node_rank == 1
    assert p.world_size == 16 and [w.rank for w in p.workers] == list(range(8, 16))


def test_mpi_config_one_rank():
    p = plan_from(["--config", str(CONFIGS / "mpi.yaml"), "train.py"], CPU_HOST,
                  {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"})
    assert p.cluster.startswith("mpi (") and p.node_ips == ("127.0.0.1",) and p.log_dir == "mylog"


def test_cluster_env_key_is_checked(tmp_path):
    assert load(tmp_path, "cluster_env: slurm\n") == {"cluster_env": "slurm"}
    assert "cluster_env: 'pbs' is not one of" in refused(tmp_path, "cluster_env: pbs\n")


@pytest.mark.parametrize("name", ["single_node.yaml", "cpu_only.yaml"])
def test_command_line_wins_over_the_file(name):
    p = plan_from(["--config", str(CONFIGS / name), "--log_dir", "elsewhere", "--nproc_per_node", "1", "t.py"],
                  GPU_HOST if name == "single_node.yaml" else CPU_HOST)
    assert p.log_dir == "elsewhere" and len(p.workers) == 1


# ---------------------------------------------------------------- bad files: one sentence each, never a traceback


def load(tmp_path, text):
    from launcher.cli import config_file as config

    path = tmp_path / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    options = {p.name: p for p in launch.params if p.name not in ("config", "training_script", "training_script_args")}
    return config.load(str(path), options)


def refused(tmp_path, text) -> str:
    with pytest.raises(LaunchError) as e:
        load(tmp_path, text)
    message = str(e.value)
    assert "\n" not in message and len(message) < 300, message
    return message


@pytest.mark.parametrize("text,fragment", [
    (b"log_dir: \xff\xfe\n", "is not UTF-8 text (byte 0xff at offset 9); save it as UTF-8"),
    ("log_dir: x\x00y\n".encode(), "holds a character YAML does not allow (U+0000 at offset 10)"),
    ("nproc_per_node: " + "[" * 600 + "]" * 600 + "\n", "nests its values too deeply"),
], ids=["latin1", "nul", "nested"])
def test_unreadable_files(tmp_path, text, fragment):
    assert fragment in refused(tmp_path, text)


def test_utf8_with_a_byte_order_mark_is_read(tmp_path):
    assert load(tmp_path, "\ufefflog_dir: mylog\n") == {"log_dir": "mylog"}


@pytest.mark.parametrize("text,fragment", [
    ("log_dir: 2020-01-01\n", "log_dir is a date (datetime.date(2020, 1, 1)), not text, a number or true/false; put it in quotes"),
    ("nproc_per_node: 2020-01-01\n", "nproc_per_node is a date"),
    ("shutdown_timeout: 2020-01-01\n", "shutdown_timeout is a date"),
    ("started_port: 2020-01-01 10:00:00\n", "started_port is a timestamp"),
    ("node_ip: !!binary aGVsbG8=\n", "node_ip is binary data"),
    ("training_script_args: [--day, 2020-01-01]\n", "training_script_args: item 2 is a date"),
    ("selected_gpus: [0, 2020-01-01]\n", "selected_gpus: item 2 is a date"),
    ("env: {DAY: 2020-01-01}\n", "env: DAY is a date"),
])
def test_yaml_dates_and_binary_are_refused_with_the_quote_hint(tmp_path, text, fragment):
    assert fragment in refused(tmp_path, text)


def test_quoted_dates_are_text(tmp_path):
    assert load(tmp_path, "log_dir: '2020-01-01'\nenv: {DAY: '2020-01-01'}\n") == \
        {"log_dir": "2020-01-01", "env": (("DAY", "2020-01-01"),)}


@pytest.mark.parametrize("text,fragment", [
    ("nproc_per_node: 2.5\n", "nproc_per_node expects a whole number, not 2.5"),
    ("nproc_per_node: .inf\n", "nproc_per_node expects a whole number, not inf"),
    ("started_port: .inf\n", "started_port expects a whole number, not inf"),
    ("started_port: 6170.0\n", "started_port expects a whole number, not 6170.0"),
    ("shutdown_timeout: .inf\n", "shutdown_timeout: inf is not a number of seconds from 0 to 86400 (one day)"),
    ("shutdown_timeout: .nan\n", "shutdown_timeout: nan is not a number of seconds from 0 to 86400"),
    ("shutdown_timeout: 1.0e+300\n", "is not a number of seconds from 0 to 86400"),
    ("shutdown_timeout: -1\n", "is not a number of seconds from 0 to 86400"),
])
def test_numbers_must_be_whole_and_finite(tmp_path, text, fragment):
    assert fragment in refused(tmp_path, text)


def test_whole_and_fractional_numbers_that_fit_are_kept(tmp_path):
    assert load(tmp_path, "nproc_per_node: 3\nshutdown_timeout: 2.5\nstarted_port: '6170'\n") == \
        {"nproc_per_node": 3, "shutdown_timeout": 2.5, "started_port": 6170}


@pytest.mark.parametrize("text,fragment", [
    ('env: {"A=B": 1}\n', "the variable name 'A=B' contains '=', which no variable name can hold; rename it"),
    ('env: {"A\\0B": 1}\n', "the variable name 'A\\x00B' contains a NUL character"),
    ('env: {"": 1}\n', "env has an empty variable name"),
    ("env: {1: x}\n", "env: an int (1) is not a variable name; put the name in quotes"),
    ("env: {~: x}\n", "env: null (nothing) is not a variable name"),
    ('env: {A: "x\\0y"}\n', "env: A has a NUL character in its value"),
    ('training_script_args: ["x\\0y"]\n', "training_script_args: item 1 has a NUL character in its value"),
    ('log_dir: "x\\0y"\n', "log_dir has a NUL character in its value"),
])
def test_env_names_and_values_the_kernel_cannot_pass_are_refused(tmp_path, text, fragment):
    assert fragment in refused(tmp_path, text)


def test_long_values_are_shortened_in_messages(tmp_path):
    message = refused(tmp_path, "env: {A: " + "[" * 200 + "]" * 200 + "}\n")
    assert "env: A must be a single value, not a list" in message


def test_parameter_server_on_two_nodes():
    host = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("eth0", "192.168.1.3", "255.255.255.0"),))
    p = plan_from(["--config", str(CONFIGS / "parameter_server.yaml"), "train.py"], host)
    assert p.parameter_server and p.node_rank == 1
    assert [w.label for w in p.workers] == ["trainer 2", "trainer 3", "server 1"]
    assert p.workers[2].log_file == "mylog/serverlog.1" and p.base_env["FLAGS_rpc_deadline"] == "60000"
    assert p.control.port == 6169
