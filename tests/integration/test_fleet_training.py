"""Data-parallel training through fleet on real CPU workers (gloo) started by ``python -m launcher``.

Each launch runs several set-ups one after the other (tests/integration/workers/fleet_train.py); every
rank compares itself with a one-process run on the whole batch and with the other ranks.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.training  # CI runs them after the quick loop (README's development lines)

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
TOLERANCE = 1e-5

SYNCHRONOUS_2 = ["opt", "opt_unfused", "opt_fused", "opt_comm3", "opt_sync", "minimize", "model", "model_unfused",
                 "model_fused", "model_comm2"]
SYNCHRONOUS_4 = ["opt", "hier", "hier_comm2_fused", "model_hier"]
LOCAL_SGD_AVERAGED_AT = {0, 1, 2, 5}  # 2 warm-up steps, then every 3rd step from step 2 (8 steps)


def worker_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def launch(tmp_path, nproc, script, *args, timeout=120):
    cmd = [sys.executable, "-m", "launcher", "--nproc_per_node", str(nproc), "--log_dir", str(tmp_path / "logs"),
           str(WORKERS / script), *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=timeout)


def results(out, count):
    return [json.loads((out / f"result.{rank}.json").read_text()) for rank in range(count)]


def train(tmp_path_factory, nproc, scenarios):
    out = tmp_path_factory.mktemp(f"fleet{nproc}")
    r = launch(out, nproc, "fleet_train.py", out, *scenarios)
    assert r.returncode == 0, r.stdout + r.stderr
    return results(out, nproc)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return train(tmp_path_factory, 2, SYNCHRONOUS_2 + ["local_sgd", "model_local_sgd", "local_sgd_adam", "save_load"])


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return train(tmp_path_factory, 4, SYNCHRONOUS_4 + ["local_sgd"])


def assert_like_one_process(ranks, scenario):
    for result in ranks:
        assert result[scenario]["reference_diff"] <= TOLERANCE, (scenario, result["rank"])
        assert result[scenario]["spread"] == [0.0] * len(result[scenario]["spread"]), (scenario, result["rank"])


def test_workers_see_the_launch(two):
    assert [r["rank"] for r in two] == [0, 1]
    assert [r["first"] for r in two] == [True, False]
    assert {(r["world_size"], r["backend"], r["device"]) for r in two} == {(2, "gloo", "cpu")}
    assert two[0]["endpoints"] == two[1]["endpoints"] and len(two[0]["endpoints"]) == 2


@pytest.mark.parametrize("scenario", SYNCHRONOUS_2)
def test_two_workers_train_like_one_process(two, scenario):
    assert_like_one_process(two, scenario)


@pytest.mark.parametrize("scenario", SYNCHRONOUS_4)
def test_four_workers_train_like_one_process(four, scenario):
    assert_like_one_process(four, scenario)


def test_fusion_and_communicators_shape_the_all_reduces(two, four):
    rank0 = two[0]
    assert (rank0["opt"]["buckets"], rank0["opt"]["channels"]) == (1, 1)  # DDP's default: 1 MB first bucket
    assert rank0["opt_unfused"]["buckets"] == 6  # one all-reduce per gradient
    assert rank0["opt_fused"]["buckets"] == 3  # FLAGS_fuse_parameter_groups_size=2
    assert (rank0["opt_comm3"]["buckets"], rank0["opt_comm3"]["channels"]) == (3, 3)  # 0.0001 MB buckets, 3 communicators
    assert (four[0]["hier_comm2_fused"]["buckets"], four[0]["hier_comm2_fused"]["channels"]) == (2, 2)
    assert [rank0[s]["ddp_buckets"] for s in ("model", "model_unfused", "model_fused")] == [1, 6, 3]


def test_distributed_model_does_not_all_reduce_twice(two):
    assert [r[s]["optimizer_allreduces"] for r in two for s in ("model", "model_unfused", "model_fused", "model_comm2")] == [0] * 8
    assert [r["opt"]["optimizer_allreduces"] for r in two] == [8, 8]


@pytest.mark.parametrize("scenario", ["local_sgd", "model_local_sgd"])
def test_local_sgd_ranks_part_between_averaging_steps(two, four, scenario):
    for ranks in (two, four) if scenario == "local_sgd" else (two,):
        for result in ranks:
            spread = result[scenario]["spread"]
            assert {i for i, s in enumerate(spread) if s == 0.0} == LOCAL_SGD_AVERAGED_AT, (scenario, result["rank"], spread)
    assert [r["local_sgd"]["optimizer_allreduces"] for r in two] == [0, 0]  # parameters averaged, never gradients


def test_local_sgd_warm_up_averages_parameters_as_paddles_program_does(two):
    # with Adam, averaging gradients during the warm-up would be 3.7e-2 away from Paddle's rule
    assert [r["local_sgd_adam"]["reference_diff"] <= TOLERANCE for r in two] == [True, True], two


def test_save_has_one_writer_and_every_rank_loads_it(two):
    for result in two:
        assert result["save_load"] == {"files": ["persistables.pt"], "loaded": [1.0], "lr": 0.5}


def test_alone_the_worker_is_a_world_of_one(tmp_path):
    r = subprocess.run([sys.executable, str(WORKERS / "fleet_train.py"), str(tmp_path), "opt", "model", "save_load"],
                       cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (alone,) = results(tmp_path, 1)
    assert (alone["world_size"], alone["endpoints"], alone["first"]) == (1, [], True)
    assert_like_one_process([alone], "opt")
    assert_like_one_process([alone], "model")
    assert alone["save_load"]["files"] == ["persistables.pt"]


def test_missing_rank_is_named_with_its_endpoint(tmp_path):
    r = launch(tmp_path, 3, "fleet_missing.py", 2, 2)  # rank 2 never arrives; 2 s timeout
    assert r.returncode == 1, r.stdout + r.stderr
    log = "".join((tmp_path / "logs" / f"workerlog.{rank}").read_text() for rank in (0, 1))  # whichever gave up first
    endpoints = re.search(r"^endpoints: (\S+)$", log, re.M).group(1).split(",")
    found = re.search(r"RendezvousError: rank [01] waited 2 s for all 3 ranks at (\S+); missing: (.*)$", log, re.M)
    assert found, log
    assert found.group(1) == endpoints[0]
    assert found.group(2) == f"rank 2 ({endpoints[2]})."
    assert "joined" not in log
