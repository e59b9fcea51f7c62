"""What PyTorch's own tests of torchrun check (test/distributed/launcher/test_run.py with its bin/
programs, in pytorch/pytorch), and pytorch/examples' torchrun recipes (distributed/ddp/run_example.sh,
distributed/minGPT-ddp/run_example.sh), run with `python -m launcher` in place of `torchrun`. The
programs are our own (workers/agent_vars.py, touch_rank.sh, init_method.py, ddp_toy.py, torchrun_env.py):
those repositories' code is not copied here; each test names the fact it stands in for.
"""

import json
import os

import pytest

from conftest import WORKERS, free_ports, read_dumps, run_launcher

AGENT_VARS = WORKERS / "agent_vars.py"
TOUCH_RANK = WORKERS / "touch_rank.sh"
AGENT = ["--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1", "--start-method=spawn"]


def ranks_in(folder):
    return set(os.listdir(folder))


@pytest.mark.parametrize("extra", [
    ["--rdzv-id=4242"],                                              # test_launch_user_script_python
    ["--master-addr=localhost", "--master-port={port}", "--node-rank=0"],  # ..._caffe2_bc
    ["--standalone"],                                                # test_launch_standalone
    ["--run-path"],                                                  # test_launch_run_path
])
def test_every_rank_runs_with_every_agent_variable_and_the_parents_environment(tmp_path, extra):
    """Each of 4 workers reads every variable torchrun's agent sets, and the launcher's own environment
    (TEST_SENTINEL_PARENT), and leaves a file named by its global rank."""
    port = free_ports(1)
    args = [a.format(port=port) for a in extra]
    r = run_launcher(*args, *AGENT, AGENT_VARS, tmp_path, env={"TEST_SENTINEL_PARENT": "FOOBAR",
                                                               "EXPECT_VARS": "TEST_SENTINEL_PARENT"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ranks_in(tmp_path) == {"0", "1", "2", "3"}
    assert "[rank 3] TEST_SENTINEL_PARENT = FOOBAR" in r.stdout


def test_a_failing_worker_fails_the_launch(tmp_path):
    """test_launch_elastic_worker_raise_exception: the worker raises, the launch fails (torchrun raises
    ChildFailedError and exits 1; here the worker's own exit code, 1 for an uncaught exception)."""
    r = run_launcher(*AGENT, "--max-restarts=0", AGENT_VARS, tmp_path, "--fail", timeout=120)
    assert r.returncode == 1 and "RuntimeError: asked to fail" in r.stderr
    assert ranks_in(tmp_path) == set()


def test_a_program_that_is_not_python_runs_with_no_python_and_module_is_refused(tmp_path):
    """test_launch_user_script_bash: --no-python runs the executable on every rank; --no-python with
    --module is an error (torchrun: ValueError; here exit 2, nothing started)."""
    refused = run_launcher(*AGENT, "--no-python", "--module", TOUCH_RANK, tmp_path)
    assert refused.returncode == 2 and "--module and --no_python exclude each other" in refused.stderr
    assert ranks_in(tmp_path) == set()
    r = run_launcher(*AGENT, "--no-python", TOUCH_RANK, tmp_path)
    assert r.returncode == 0 and ranks_in(tmp_path) == {"0", "1", "2", "3"}, r.stderr


def test_nproc_per_node_auto_without_a_gpu_is_a_worker_per_cpu_and_an_unknown_word_is_refused(tmp_path):
    """test_nproc_launch_auto_configurations / _unknown_configurations."""
    r = run_launcher("--nnodes=1", "--nproc-per-node=auto", "--no-python", TOUCH_RANK, tmp_path,
                     env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0 and ranks_in(tmp_path) == {str(i) for i in range(len(os.sched_getaffinity(0)))}, r.stderr
    assert run_launcher("--nnodes=1", "--nproc-per-node=unknown", "--no-python", TOUCH_RANK, tmp_path).returncode == 2


def test_is_torchelastic_launched(tmp_path):
    """test_is_torchelastic_launched: --run-path, one worker, torch.distributed.is_torchelastic_launched() is True."""
    r = run_launcher("--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                     WORKERS / "torchrun_env.py", tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert read_dumps(tmp_path, 1)[0]["is_torchelastic_launched"] is True


@pytest.mark.parametrize("init_method", ["env://", "tcp://localhost:{port}"])
def test_init_method_with_the_master_port(init_method):
    """test_init_method_env_with_torchelastic / _tcp_: --master-addr=localhost --master-port=P, and
    init_process_group with env:// or tcp://localhost:P; an all_reduce derives the world size."""
    port = free_ports(1)
    r = run_launcher("--run-path", "--nnodes=1", "--nproc-per-node=2", "--master-addr=localhost",
                     f"--master-port={port}", "--monitor-interval=1", WORKERS / "init_method.py",
                     init_method.format(port=port), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "[rank 1] rank 1 of 2: done" in r.stdout


def test_redirect_and_tee_show_each_ranks_lines_with_its_prefix(tmp_path):
    """test_capture_logs_using_default_logs_specs: --redirect=3 --tee=3, each rank's line on the console
    with the rank's prefix (torchrun's there: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE; here [rank N])."""
    logs = tmp_path / "logs"
    r = run_launcher(*AGENT, "--redirect=3", "--tee=3", "--log-dir", logs, "--no-python", TOUCH_RANK, tmp_path)
    assert r.returncode == 0, r.stderr
    for rank in range(4):
        assert f"[rank {rank}] creating {tmp_path}/{rank}" in r.stdout
        assert f"creating {tmp_path}/{rank}" in (logs / f"workerlog.{rank}").read_text()


@pytest.mark.parametrize("recipe", [
    ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", "--rdzv_endpoint=localhost:{port}"],  # ddp, ddp-tutorial-series
    ["--standalone", "--nproc_per_node=2"],                                                     # minGPT-ddp
])
def test_pytorch_examples_ddp_recipes(tmp_path, recipe):
    """pytorch/examples' run_example.sh lines, `torchrun` replaced: a DDP step, the same weights on every rank."""
    port = free_ports(1)
    r = run_launcher(*[a.format(port=port) for a in recipe], WORKERS / "ddp_toy.py", tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr
    results = [json.loads((tmp_path / f"ddp.{rank}.json").read_text()) for rank in (0, 1)]
    assert [(x["rank"], x["local_rank"], x["world_size"]) for x in results] == [(0, 0, 2), (1, 1, 2)]
    assert results[0]["weights"] == results[1]["weights"]
