"""The pure plan: options, environment values and host facts in, worker specs out."""

import json
import os
import threading
import time

import pytest

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.output.reports import format_plan
from launcher.plan.common import MAX_ENV_STRING
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import make_plan

CPU_HOST = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                     python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")
GPU_HOST = HostFacts(gpu_count=8, cpu_count=64, interfaces=(Interface("eth0", "10.0.0.1", "255.255.255.0"),),
                     python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")


def plan(host=CPU_HOST, env=None, free=tuple(range(40000, 40016)), **opts):
    opts.setdefault("training_script", "train.py")
    return make_plan(LaunchOptions(**opts), env or {}, host, lambda ip, n: free[:n])


def test_one_cpu_node_defaults_to_two_workers_on_free_ports():
    p = plan()
    assert p.device == "cpu" and len(p.workers) == 2 and p.world_size == 2
    assert p.ports == (40000, 40001)
    assert p.cpu_default and not plan(nproc_per_node=2).cpu_default
    w0, w1 = p.workers
    assert w0.env[ev.MASTER_ADDR] == "127.0.0.1" and w0.env[ev.MASTER_PORT] == "40000"
    assert w1.env[ev.CURRENT_ENDPOINT] == "127.0.0.1:40001"
    assert w1.env[ev.TRAINER_ENDPOINTS] == "127.0.0.1:40000,127.0.0.1:40001"
    assert ev.SELECTED_GPUS not in w0.env
    assert w0.env[ev.OMP_NUM_THREADS] == "4"
    assert w0.env[ev.GLOO_SOCKET_IFNAME] == "lo"
    assert w0.cmd == ("/usr/bin/python3", "-u", "train.py")


def test_cpu_workers_get_what_paddle_3s_launcher_gives_them():
    """paddle.distributed.launch (controllers/collective.py): without PADDLE_DISTRI_BACKEND=gloo a CPU build of
    Paddle creates no group ('The global group is not initialized'); fleet.local_rank() is PADDLE_RANK_IN_NODE."""
    p = plan(cluster_node_ips="127.0.0.1,127.0.0.2", node_ip="127.0.0.2", started_port=6170, log_dir="mylog")
    env = p.workers[1].env
    assert env[ev.DISTRI_BACKEND] == "gloo" and env[ev.PADDLE_MASTER] == "127.0.0.1:6170"
    assert (env[ev.GLOBAL_SIZE], env[ev.LOCAL_SIZE], env[ev.NNODES]) == ("4", "2", "2")
    assert (env[ev.GLOBAL_RANK], env[ev.PADDLE_LOCAL_RANK], env[ev.RANK_IN_NODE]) == ("3", "1", "1")
    assert env[ev.LOG_DIR] == os.path.join(CPU_HOST.cwd, "mylog")
    assert ev.SELECTED_ACCELERATORS not in env and ev.WORLD_DEVICE_IDS not in env
    assert ev.DISTRI_BACKEND not in plan(env={ev.DISTRI_BACKEND: "mpi"}).workers[0].env  # the user's stays


def test_gpu_workers_get_paddles_device_variables_and_no_backend():
    p = plan(host=HostFacts(gpu_count=4, cpu_count=8), cluster_node_ips="127.0.0.1,127.0.0.2", started_port=6170,
             selected_gpus="2,3")
    env = p.workers[1].env
    assert ev.DISTRI_BACKEND not in env  # Paddle picks NCCL itself
    assert env[ev.SELECTED_GPUS] == env[ev.SELECTED_ACCELERATORS] == env[ev.LOCAL_DEVICE_IDS] == "3"
    assert env[ev.WORLD_DEVICE_IDS] == "2:3,2:3"


def test_cpu_worker_does_not_inherit_selected_gpus():
    p = plan(env={ev.SELECTED_GPUS: "3", "HOME": "/root"})
    assert ev.SELECTED_GPUS not in p.base_env and p.base_env["HOME"] == "/root"


def test_two_nodes_rank_and_endpoints_follow_node_order():
    host = HostFacts(gpu_count=4, cpu_count=16, interfaces=(Interface("eth0", "192.168.1.3", "255.255.255.0"),))
    p = plan(host, cluster_node_ips="192.168.1.2,192.168.1.3", node_ip="192.168.1.3")
    assert p.ports == (6070, 6071, 6072, 6073)  # Paddle's default for several nodes
    assert [w.rank for w in p.workers] == [4, 5, 6, 7]
    assert [w.gpu for w in p.workers] == ["0", "1", "2", "3"]
    env = p.workers[1].env
    assert env[ev.TRAINER_ID] == env[ev.RANK] == "5" and env[ev.LOCAL_RANK] == "1"
    assert env[ev.WORLD_SIZE] == env[ev.TRAINERS_NUM] == "8"
    assert env[ev.GROUP_RANK] == "1" and env[ev.GROUP_WORLD_SIZE] == "2"
    assert env[ev.LOCAL_WORLD_SIZE] == "4"
    assert env[ev.MASTER_ADDR] == "192.168.1.2" and env[ev.MASTER_PORT] == "6070"
    assert env[ev.CURRENT_ENDPOINT] == "192.168.1.3:6071"
    assert env[ev.TRAINER_ENDPOINTS].split(",")[4] == "192.168.1.3:6070"
    assert env[ev.SELECTED_GPUS] == "1"
    assert env[ev.GLOO_SOCKET_IFNAME] == "eth0"


def test_started_port_gives_consecutive_ports():
    p = plan(started_port=51340, nproc_per_node=3)
    assert p.ports == (51340, 51341, 51342)


def test_all_gpus_by_default_and_nproc_as_a_count():
    assert [w.gpu for w in plan(GPU_HOST).workers] == [str(i) for i in range(8)]
    assert [w.gpu for w in plan(GPU_HOST, nproc_per_node=2).workers] == ["0", "1"]
    assert plan(GPU_HOST).workers[0].env[ev.OMP_NUM_THREADS] == "8"


def test_selected_gpus_relative_to_cuda_visible_devices():
    p = plan(GPU_HOST, env={ev.CUDA_VISIBLE_DEVICES: "4,5,6"}, selected_gpus="6,4")
    assert [w.gpu for w in p.workers] == ["2", "0"]
    p = plan(GPU_HOST, env={ev.CUDA_VISIBLE_DEVICES: "4,5,6"})
    assert [w.gpu for w in p.workers] == ["0", "1", "2"]


def test_no_gpu_detected_passes_selected_gpus_on_with_a_warning():
    p = plan(selected_gpus="0,1")
    assert p.device == "gpu" and [w.gpu for w in p.workers] == ["0", "1"]
    assert p.workers[1].env[ev.SELECTED_GPUS] == "1"
    assert any("no GPU detected" in n for n in p.notes)
    assert p.gpus_not_found and not plan(GPU_HOST, selected_gpus="0,1").gpus_not_found


def test_plan_table_says_when_the_gpus_were_not_found():
    header, *rest = format_plan(plan(selected_gpus="0,1")).splitlines()
    assert "GPU worker(s)" not in header  # they may well run on the CPU
    assert "2 worker(s) here, GPU ids passed on as given (no GPU detected on this machine; FLAGS_selected_gpus is set" in header
    assert "world size 2" in header
    assert any("gpu 1 (not found)" in line for line in rest)
    found = format_plan(plan(GPU_HOST, selected_gpus="0,1"))
    assert "2 GPU worker(s) here, world size 2" in found and "not found" not in found


def test_gpu_ids_are_compared_as_numbers():
    with pytest.raises(LaunchError, match=r"names GPU 0 twice \(0 and 00\)"):
        plan(GPU_HOST, selected_gpus="0,00")
    with pytest.raises(LaunchError, match=r"names GPU 0 twice \(0 and 00\)"):
        plan(selected_gpus="0,00")  # no GPU detected: still one GPU, not two
    assert [w.gpu for w in plan(GPU_HOST, selected_gpus="01,2").workers] == ["1", "2"]
    p = plan(GPU_HOST, env={ev.CUDA_VISIBLE_DEVICES: "4,5"}, selected_gpus="05")
    assert [w.gpu for w in p.workers] == ["1"]


@pytest.mark.parametrize("host", [CPU_HOST, GPU_HOST])
@pytest.mark.parametrize("gpus", ["²", "0,١", "1 2", "+1", "-1", " "])
def test_gpu_ids_are_ascii_digits_only(host, gpus):
    with pytest.raises(LaunchError, match="has a malformed GPU id"):
        plan(host, selected_gpus=gpus)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -float("inf"), 1e300, -1.0, 86400.5, "10", True])
def test_shutdown_timeout_is_a_finite_grace_of_at_most_a_day(seconds):
    with pytest.raises(LaunchError, match=r"give a number of seconds from 0 to 86400 \(one day\)"):
        plan(shutdown_timeout=seconds)


def test_shutdown_timeout_bounds_are_accepted():
    assert plan(shutdown_timeout=0).shutdown_timeout == 0
    assert plan(shutdown_timeout=86400.0).shutdown_timeout == 86400.0


@pytest.mark.parametrize("n,fragment", [
    (2.5, "--nproc_per_node 2.5 is not a whole number"),
    (True, "--nproc_per_node True is not a whole number"),
    (10 ** 20, f"--nproc_per_node {10 ** 20} is more workers than a node has ports; give at most 65535"),
])
def test_nproc_per_node_is_a_sane_whole_count(n, fragment):
    # refused before anything is made for that many workers: in a thread, joined for at most 120 s (a hang guard)
    refused = {}

    def run():
        try:
            plan(nproc_per_node=n)
        except LaunchError as e:
            refused["error"] = e

    planner = threading.Thread(target=run, daemon=True)
    planner.start()
    planner.join(120)
    assert not planner.is_alive(), f"the plan for --nproc_per_node {n} never ended"
    assert fragment in str(refused.get("error")), "no LaunchError"


@pytest.mark.parametrize("gpus,env,fragment", [
    ("0,a", {}, "malformed GPU id 'a'"),
    ("0,,1", {}, "malformed GPU id ''"),
    ("1,1", {}, "names GPU 1 twice"),
    ("8", {}, "this machine has 8 GPU(s)"),
    ("1", {ev.CUDA_VISIBLE_DEVICES: "2,3"}, "not in CUDA_VISIBLE_DEVICES=2,3"),
])
def test_bad_gpu_ids_are_refused(gpus, env, fragment):
    with pytest.raises(LaunchError, match=None) as e:
        plan(GPU_HOST, env=env, selected_gpus=gpus)
    assert fragment in str(e.value)


def test_user_omp_and_gloo_settings_are_kept():
    p = plan(env={ev.OMP_NUM_THREADS: "3", ev.GLOO_SOCKET_IFNAME: "eth9"})
    assert ev.OMP_NUM_THREADS not in p.workers[0].env and p.base_env[ev.OMP_NUM_THREADS] == "3"
    assert ev.GLOO_SOCKET_IFNAME not in p.workers[0].env


def test_config_env_is_added_for_every_worker():
    p = plan(env={"A": "1"}, extra_env=(("NCCL_IB_DISABLE", "1"), ("A", "2")))
    assert p.base_env["NCCL_IB_DISABLE"] == "1" and p.base_env["A"] == "2"


def test_module_and_no_python_commands():
    assert plan(module=True, training_script="pkg.train", training_script_args=("--lr", "0.1")).workers[0].cmd == \
        ("/usr/bin/python3", "-u", "-m", "pkg.train", "--lr", "0.1")
    assert plan(no_python=True, training_script="./run.sh").workers[0].cmd == ("./run.sh",)
    with pytest.raises(LaunchError, match="exclude each other"):
        plan(module=True, no_python=True)


def test_log_files_are_named_by_global_rank():
    p = plan(cluster_node_ips="127.0.0.1,127.0.0.2", node_ip="127.0.0.2", log_dir="mylog")
    assert [w.log_file for w in p.workers] == ["mylog/workerlog.2", "mylog/workerlog.3"]


@pytest.mark.parametrize("opts,fragment", [
    (dict(cluster_node_ips="10.0.0.1,10.0.0.300"), "malformed address '10.0.0.300'"),
    (dict(cluster_node_ips="10.0.0.1,,10.0.0.2"), "malformed address ''"),
    (dict(cluster_node_ips="127.0.0.1,127.0.0.1"), "lists 127.0.0.1 twice"),
    (dict(cluster_node_ips="10.0.0.1,10.0.0.2"), "--node_ip 127.0.0.1 is not in --cluster_node_ips"),
    (dict(nproc_per_node=0), "--nproc_per_node 0 is below 1"),
    (dict(started_port=65535, nproc_per_node=2), "outside 1-65535"),
    (dict(selected_gpus="0,1", nproc_per_node=3), "disagrees with --selected_gpus"),
])
def test_bad_options_are_refused_with_the_value_named(opts, fragment):
    with pytest.raises(LaunchError) as e:
        plan(**opts)
    assert fragment in str(e.value)


def test_host_names_are_accepted():
    p = plan(cluster_node_ips="node-a.example,node-b.example", node_ip="node-b.example", started_port=7000)
    assert p.workers[0].endpoint == "node-b.example:7000" and p.workers[0].rank == 2


def test_ipv6_endpoints_are_bracketed():
    p = plan(cluster_node_ips="::1", node_ip="::1", started_port=7000, nproc_per_node=1)
    assert p.workers[0].endpoint == "[::1]:7000"


PADDLECLOUD = {"PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "POD_IP": "127.0.0.1", "PADDLE_TRAINER_ID": "0",
               "PADDLE_PORT": "35019", "TRAINER_PORTS_NUM": "2", "PADDLE_TRAINERS_NUM": "2"}


def test_paddlecloud_two_nodes_of_two_gpus():
    p = plan(env=PADDLECLOUD, use_paddlecloud=True, selected_gpus="0,1")
    assert p.world_size == 4 and [w.rank for w in p.workers] == [0, 1]
    assert p.workers[0].env[ev.TRAINER_ENDPOINTS] == \
        "127.0.0.1:35019,127.0.0.1:35020,127.0.0.2:35019,127.0.0.2:35020"


def test_paddlecloud_values_replace_the_command_line_with_a_warning():
    env = {**PADDLECLOUD, "POD_IP": "127.0.0.2", "PADDLE_TRAINER_ID": "1"}
    p = plan(env=env, use_paddlecloud=True, selected_gpus="0,1", node_ip="127.0.0.9", cluster_node_ips="127.0.0.9")
    assert [w.rank for w in p.workers] == [2, 3]
    assert any("instead of --node_ip 127.0.0.9" in n for n in p.notes)


def test_paddlecloud_port_rules():
    one_port = {**PADDLECLOUD, "TRAINER_PORTS_NUM": "1"}  # fewer cloud ports than workers
    assert plan(env=one_port, use_paddlecloud=True, selected_gpus="0,1").ports == (6170, 6171)
    assert plan(env=one_port, use_paddlecloud=True, selected_gpus="0,1", started_port=9000).ports == (9000, 9001)
    explicit = {**PADDLECLOUD, "DISTRIBUTED_TRAINER_ENDPOINTS": "127.0.0.1:1000,127.0.0.1:1005,127.0.0.2:1000,127.0.0.2:1005"}
    assert plan(env=explicit, use_paddlecloud=True, selected_gpus="0,1").ports == (1000, 1005)


def test_paddlecloud_port_variables_are_optional_as_in_paddle():
    # Paddle 1.8's own launcher test unsets both and expects 6170
    bare = {k: v for k, v in PADDLECLOUD.items() if k not in ("PADDLE_PORT", "TRAINER_PORTS_NUM")}
    p = plan(env=bare, use_paddlecloud=True, selected_gpus="0,1")
    assert p.ports == (6170, 6171)
    assert p.workers[0].env[ev.TRAINER_ENDPOINTS] == "127.0.0.1:6170,127.0.0.1:6171,127.0.0.2:6170,127.0.0.2:6171"
    assert plan(env=bare, use_paddlecloud=True, selected_gpus="0,1", started_port=9000).ports == (9000, 9001)
    only_port = {**bare, "PADDLE_PORT": "35019"}
    only_num = {**bare, "TRAINER_PORTS_NUM": "2"}
    assert plan(env=only_port, use_paddlecloud=True, selected_gpus="0,1").ports == (6170, 6171)
    assert plan(env=only_num, use_paddlecloud=True, selected_gpus="0,1").ports == (6170, 6171)
    empty = {**bare, "PADDLE_PORT": "", "TRAINER_PORTS_NUM": " "}
    assert plan(env=empty, use_paddlecloud=True, selected_gpus="0,1").ports == (6170, 6171)


@pytest.mark.parametrize("bad,fragment", [
    ({"PADDLE_PORT": "0"}, "PADDLE_PORT=0 with 2 workers needs ports 0 to 1, outside 1-65535"),
    ({"PADDLE_PORT": "65535"}, "PADDLE_PORT=65535 with 2 workers needs ports 65535 to 65536, outside 1-65535"),
    ({"PADDLE_PORT": "35O19"}, "PADDLE_PORT=35O19 is not a whole number"),
    ({"PADDLE_PORT": "３５０１９"}, "is not a whole number"),
    ({"TRAINER_PORTS_NUM": "2.0"}, "TRAINER_PORTS_NUM=2.0 is not a whole number"),
])
def test_paddlecloud_bad_port_variables_are_refused_not_replaced(bad, fragment):
    with pytest.raises(LaunchError) as e:
        plan(env={**PADDLECLOUD, **bad}, use_paddlecloud=True, selected_gpus="0,1")
    assert fragment in str(e.value)


@pytest.mark.parametrize("endpoints,fragment", [
    ("127.0.0.1:1000,127.0.0.1:99999,127.0.0.2:1000,127.0.0.2:1001", "endpoint '127.0.0.1:99999', which has the port '99999', not a whole number from 1 to 65535"),
    ("127.0.0.1:0,127.0.0.1:1001,127.0.0.2:1000,127.0.0.2:1001", "endpoint '127.0.0.1:0', which has the port '0', not a whole number from 1 to 65535"),
    ("127.0.0.1:1000,127.0.0.1:1001,127.0.0.2:1000,127.0.0.2:99999", "endpoint '127.0.0.2:99999', which has the port '99999'"),
    ("127.0.0.1:1000,127.0.0.1:1000,127.0.0.2:1000,127.0.0.2:1001", "lists the endpoint 127.0.0.1:1000 twice"),
    ("127.0.0.1:1000,127.0.0.1:1001,127.0.0.2:1000,127.0.0.2:1000", "lists the endpoint 127.0.0.2:1000 twice"),
    ("127.0.0.1:1000,127.0.0.1:1001,127.0.0.2:1000,127.0.0.2", "endpoint '127.0.0.2', which has no port"),
    ("127.0.0.1:1000,127.0.0.1:²,127.0.0.2:1000,127.0.0.2:1001", "endpoint '127.0.0.1:²', which has the port '²'"),
    ("127.0.0.1:1000,127.0.0.3:1001,127.0.0.2:1000,127.0.0.2:1001", "'127.0.0.3:1001' where an endpoint of 127.0.0.1"),
])
def test_paddlecloud_explicit_endpoints_are_checked_whole(endpoints, fragment):
    env = {**PADDLECLOUD, "DISTRIBUTED_TRAINER_ENDPOINTS": endpoints}
    with pytest.raises(LaunchError) as e:
        plan(env=env, use_paddlecloud=True, selected_gpus="0,1")
    assert "DISTRIBUTED_TRAINER_ENDPOINTS" in str(e.value) and fragment in str(e.value)


def test_paddlecloud_ignored_for_a_single_trainer():
    p = plan(env={**PADDLECLOUD, "PADDLE_TRAINERS_NUM": "1"}, use_paddlecloud=True)
    assert p.node_ips == ("127.0.0.1",)


@pytest.mark.parametrize("drop,bad,fragment", [
    ("POD_IP", {}, "needs the variable POD_IP"),
    (None, {"TRAINER_PORTS_NUM": "two"}, "TRAINER_PORTS_NUM=two is not a whole number"),
    (None, {"PADDLE_TRAINER_ID": "1"}, "PADDLE_TRAINER_ID=1 does not point at POD_IP=127.0.0.1"),
    (None, {"PADDLE_TRAINERS": "127.0.0.1,300.1.1.1"}, "PADDLE_TRAINERS=127.0.0.1,300.1.1.1 has a malformed address"),
])
def test_paddlecloud_missing_or_malformed_variables_are_named(drop, bad, fragment):
    env = {k: v for k, v in {**PADDLECLOUD, **bad}.items() if k != drop}
    with pytest.raises(LaunchError) as e:
        plan(env=env, use_paddlecloud=True, selected_gpus="0,1")
    assert fragment in str(e.value)


def test_ten_thousand_workers_plan_fast_with_endpoints_in_a_file():
    ips = ",".join(["127.0.0.1"] + [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(1, 1250)])
    started = time.perf_counter()
    p = plan(GPU_HOST, cluster_node_ips=ips, started_port=6070)
    elapsed = time.perf_counter() - started
    assert p.world_size == 10_000 and len(p.endpoints) == 10_000
    env = p.workers[0].env
    assert ev.TRAINER_ENDPOINTS not in env
    path = env[ev.TRAINER_ENDPOINTS_FILE]
    assert p.files[path].split(",") == list(p.endpoints)
    assert len(p.files[path]) > MAX_ENV_STRING
    assert all(len(k) + len(v) + 2 < MAX_ENV_STRING for k, v in env.items())
    backup = json.loads(p.files[env[ev.BACKUP_ENV_PATH]])  # Paddle's own way: getenv_or_backup reads it
    assert backup == {ev.TRAINER_ENDPOINTS: ",".join(p.endpoints)}
    print(f"plan for 10,000 workers: {elapsed * 1000:.1f} ms")


def test_endpoints_in_a_file_leave_no_stale_value_of_the_launchers_environment():
    ips = ",".join(["127.0.0.1"] + [f"10.0.{i // 256}.{i % 256}" for i in range(1, 1250)])
    p = plan(GPU_HOST, env={ev.TRAINER_ENDPOINTS: "10.9.9.9:1"}, cluster_node_ips=ips, started_port=6070)
    assert ev.TRAINER_ENDPOINTS not in {**p.base_env, **p.workers[0].env}


def test_log_dir_gets_the_nccl_flight_recorder_dumps_unless_the_user_chose_a_place():
    host = HostFacts(gpu_count=2, cpu_count=8, python="/usr/bin/python3", cwd="/work/job")
    for log_dir, expected in (("mylog", "/work/job/mylog/nccl_trace_rank_"), ("/data/logs/", "/data/logs/nccl_trace_rank_")):
        p = plan(host, log_dir=log_dir)
        assert [w.env[ev.FR_DUMP_TEMP_FILE] for w in p.workers] == [expected] * 2  # torch appends the rank
    assert ev.FR_DUMP_TEMP_FILE not in plan(host).workers[0].env  # no --log_dir: torch's default
    for env in ({ev.FR_DUMP_TEMP_FILE: "/scratch/fr_"}, {}):
        extra = () if env else ((ev.FR_DUMP_TEMP_FILE, "/scratch/fr_"),)  # from the environment or the config's env
        p = plan(host, env=env, extra_env=extra, log_dir="mylog")
        assert ev.FR_DUMP_TEMP_FILE not in p.workers[0].env and p.base_env[ev.FR_DUMP_TEMP_FILE] == "/scratch/fr_"


def test_a_stop_that_takes_stacks_switches_the_flight_recorder_on_with_a_pipe_next_to_the_logs():
    host = HostFacts(gpu_count=1, cpu_count=8, python="/usr/bin/python3", cwd="/work/job")
    stem = "/work/job/mylog/nccl_trace_rank_"
    plain = plan(host, log_dir="mylog").workers[0].env
    assert ev.FR_PIPE_FILE not in plain and ev.FR_BUFFER_SIZE not in plain  # off unless a stop takes stacks
    assert plain[ev.FR_DUMP_TEMP_FILE] == plain[ev.FR_DUMP_TEMP_FILE_OLD] == stem  # both of torch's names
    for opts in ({"hang_timeout": 30.0}, {"dump_stacks": True}):
        env = plan(host, log_dir="mylog", **opts).workers[0].env
        assert env[ev.FR_PIPE_FILE] == stem
        assert env[ev.FR_BUFFER_SIZE] == env[ev.FR_BUFFER_SIZE_OLD] == "2000"
    for name in (ev.FR_BUFFER_SIZE, ev.FR_BUFFER_SIZE_OLD):  # the user's size (0 = off) is kept, under either name
        env = plan(host, env={name: "0"}, log_dir="mylog", hang_timeout=30.0).workers[0].env
        assert ev.FR_BUFFER_SIZE not in env and ev.FR_BUFFER_SIZE_OLD not in env
    env = plan(host, env={ev.FR_DUMP_TEMP_FILE: "/scratch/fr_"}, log_dir="mylog").workers[0].env
    assert env[ev.FR_DUMP_TEMP_FILE_OLD] == "/scratch/fr_"  # the old name follows the user's choice
    assert not {ev.FR_PIPE_FILE, ev.FR_BUFFER_SIZE} & set(plan(host, hang_timeout=30.0).workers[0].env)  # no log dir


def test_every_variable_torchrun_gives_a_worker():
    p = plan(nproc_per_node=2, max_restarts=3, cluster_node_ips="127.0.0.1,127.0.0.2", started_port=7000)
    w0, w1 = p.workers
    assert (w1.env[ev.ROLE_RANK], w1.env[ev.ROLE_WORLD_SIZE], w1.env[ev.ROLE_NAME]) == ("1", "4", "default")
    assert w0.env[ev.ELASTIC_MAX_RESTARTS] == "3" and w0.env[ev.ELASTIC_USE_AGENT_STORE] == "False"
    assert w0.env[ev.NCCL_ASYNC_ERROR_HANDLING] == "1"
    assert w0.env[ev.ELASTIC_RUN_ID] == p.control.job_id  # the same on every node
    assert w0.env[ev.ERROR_FILE] == "/tmp/launcher-abc/error.0.json" != w1.env[ev.ERROR_FILE]
    assert plan().workers[0].env[ev.ELASTIC_RUN_ID] == "abc"  # one node: the launch's own id
    assert plan(role="trainer").workers[0].env[ev.ROLE_NAME] == "trainer"
    assert plan(env={ev.NCCL_ASYNC_ERROR_HANDLING: "0"}).workers[0].env[ev.NCCL_ASYNC_ERROR_HANDLING] == "0"


def test_the_launchers_own_error_file_is_its_and_not_a_workers():
    p = plan(env={ev.ERROR_FILE: "/sched/error.json"})
    assert p.error_file == "/sched/error.json"
    assert {w.env[ev.ERROR_FILE] for w in p.workers} == {"/tmp/launcher-abc/error.0.json", "/tmp/launcher-abc/error.1.json"}
    assert plan().error_file is None


def test_python_exec_is_the_workers_interpreter():
    assert plan(env={ev.PYTHON_EXEC: "/opt/py/bin/python"}).workers[0].cmd == ("/opt/py/bin/python", "-u", "train.py")
    assert plan(server_num=1, worker_num=1, env={ev.PYTHON_EXEC: "/opt/py"}).workers[0].cmd[0] == "/opt/py"
    assert plan(no_python=True, training_script="./run.sh", env={ev.PYTHON_EXEC: "/opt/py"}).workers[0].cmd == ("./run.sh",)
