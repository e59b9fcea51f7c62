"""The ready config files of configs/ load and give the plan they promise."""

from pathlib import Path

import pytest

from launcher.cli import _options, _with_config, launch
from launcher.plan import HostFacts, Interface, make_plan

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
GPU_HOST = HostFacts(gpu_count=8, cpu_count=32, interfaces=(Interface("eth0", "192.168.1.3", "255.255.255.0"),))
CPU_HOST = HostFacts(gpu_count=None, cpu_count=4)


def plan_from(args, host, env=None):
    ctx = launch.make_context("launcher", list(args))
    opts = _options(_with_config(ctx, ctx.params))
    return make_plan(opts, env or {}, host, lambda ip, n: tuple(range(30000, 30000 + n)))


def test_every_shipped_config_is_covered():
    assert {p.name for p in CONFIGS.glob("*.yaml")} == {
        "single_node.yaml", "two_nodes.yaml", "cpu_only.yaml", "paddlecloud.yaml"}


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


@pytest.mark.parametrize("name", ["single_node.yaml", "cpu_only.yaml"])
def test_command_line_wins_over_the_file(name):
    p = plan_from(["--config", str(CONFIGS / name), "--log_dir", "elsewhere", "--nproc_per_node", "1", "t.py"],
                  GPU_HOST if name == "single_node.yaml" else CPU_HOST)
    assert p.log_dir == "elsewhere" and len(p.workers) == 1
