"""What each worker really gets: variables, arguments, command."""

import os
import re
import stat

import yaml

from conftest import dumps_of_one_node, PROBE, free_ports, read_dumps, run_launcher


def test_worker_environment_on_one_node(tmp_path):
    port = free_ports(3)
    r = run_launcher("--nproc-per-node", 3, "--started-port", port, "--print_config", "false",
                     PROBE, "--dump", tmp_path, "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert "master (rank 0 store)" not in r.stderr
    dumps = read_dumps(tmp_path, 3)
    endpoints = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    cpus = len(os.sched_getaffinity(0))
    for rank, d in dumps.items():
        env = d["env"]
        assert env["RANK"] == env["PADDLE_TRAINER_ID"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["PADDLE_TRAINERS_NUM"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
        assert env["PADDLE_CURRENT_ENDPOINT"] == f"127.0.0.1:{port + rank}"
        assert env["PADDLE_TRAINER_ENDPOINTS"] == endpoints
        assert "FLAGS_selected_gpus" not in env
        if "OMP_NUM_THREADS" not in os.environ:
            assert env["OMP_NUM_THREADS"] == str(max(1, cpus // 3))
        assert d["extra"] == ["--lr", "0.1"]  # the script's own arguments, untouched


def test_print_config_shows_the_plan(tmp_path):
    r = run_launcher("--nproc_per_node", 2, "--log_dir", tmp_path / "log", PROBE)
    assert r.returncode == 0
    assert "node 0 of 1 (127.0.0.1), 2 CPU worker(s) here, world size 2" in r.stderr
    assert f"{tmp_path / 'log' / 'workerlog.1'}" in r.stderr
    assert "the default; --nproc_per_node sets it" not in r.stderr  # --nproc_per_node was given
    r = run_launcher(PROBE)
    assert "2 CPU worker(s) here (no GPU found: the default; --nproc_per_node sets it)" in r.stderr


def test_selected_gpus_are_passed_on_relative_to_cuda_visible_devices(tmp_path):
    r = run_launcher("--selected_gpus", "5,7", PROBE, "--dump", tmp_path, env={"CUDA_VISIBLE_DEVICES": "7,6,5"})
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(tmp_path, 2)
    assert [dumps[r]["env"]["FLAGS_selected_gpus"] for r in (0, 1)] == ["2", "0"]
    assert "no GPU detected on this machine" in r.stderr


def test_module_and_executable_workers(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import os, sys\nprint('module rank', os.environ['RANK'], sys.argv[1:])\n")
    r = run_launcher("--nproc_per_node", 2, "-m", "mypkg.train", "--x", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[rank 1] module rank 1 ['--x', '1']" in r.stdout
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho shell rank $RANK of $WORLD_SIZE \"$@\"\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    r = run_launcher("--nproc_per_node", 2, "--no_python", script, "a b")
    assert r.returncode == 3
    # the first rank to exit 3 stops the other, which may not have echoed yet (on a busy machine); its own line is
    # never lost
    first = re.search(r"rank (\d) failed \(exit code 3\)", r.stderr).group(1)
    assert f"[rank {first}] shell rank {first} of 2 a b" in r.stdout, (r.stdout, r.stderr)


def test_paddlecloud_environment_gives_the_cluster(tmp_path):
    port = free_ports(3) + 1  # and the one below it, node 0's control port
    env = {"PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "POD_IP": "127.0.0.1", "PADDLE_TRAINER_ID": "0",
           "PADDLE_PORT": str(port), "TRAINER_PORTS_NUM": "2", "PADDLE_TRAINERS_NUM": "2"}
    dumps = dumps_of_one_node(tmp_path, 2, "--use_paddlecloud", "--selected_gpus=0,1", PROBE, "--dump", tmp_path, env=env)
    for rank in (0, 1):
        e = dumps[rank]["env"]
        assert e["PADDLE_TRAINER_ENDPOINTS"] == f"127.0.0.1:{port},127.0.0.1:{port + 1},127.0.0.2:{port},127.0.0.2:{port + 1}"
        assert e["PADDLE_TRAINERS_NUM"] == "4" and e["PADDLE_TRAINER_ID"] == str(rank)
        assert e["FLAGS_selected_gpus"] == str(rank)


def test_config_file_with_env_and_script_args_command_line_wins(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "nproc_per_node": 3, "log-dir": str(tmp_path / "log"), "print_config": False,
        "training_script": PROBE, "training_script_args": ["--dump", str(tmp_path)],
        "env": {"EXTRA_FLAG": 1, "EXTRA_NAME": "x"},
    }))
    r = run_launcher("--config", config, "--nproc_per_node", 2)
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(tmp_path, 2)
    assert sorted(dumps) == [0, 1]
    assert dumps[0]["env"]["EXTRA_FLAG"] == "1" and dumps[1]["env"]["EXTRA_NAME"] == "x"
    assert (tmp_path / "log" / "workerlog.1").exists()


def test_huge_cluster_endpoints_reach_the_worker_through_a_file(tmp_path):
    """1,250 nodes x 8 workers: PADDLE_TRAINER_ENDPOINTS would pass the kernel's 128 KiB limit."""
    nodes = ["127.0.0.1"] + [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(1, 1250)]
    config = tmp_path / "big.yaml"
    config.write_text(yaml.safe_dump({"cluster_node_ips": nodes, "started_port": 24000,
                                      "selected_gpus": list(range(8)), "print_config": False}))
    reader = tmp_path / "read_endpoints.py"
    reader.write_text(
        "import json, os, sys, time\n"
        "path = os.environ['PADDLE_TRAINER_ENDPOINTS_FILE']\n"
        "eps = open(path).read().split(',')\n"
        "rank = os.environ['RANK']\n"
        "found = [len(eps), eps[int(rank)], 'inline' if 'PADDLE_TRAINER_ENDPOINTS' in os.environ else 'file']\n"
        "json.dump({'env': {}, 'found': found, 'pid': os.getpid(), 'children': []}, open(os.path.join(sys.argv[1], f'env.{rank}.json'), 'w'))\n"
        "time.sleep(60)\n")
    dumps = dumps_of_one_node(tmp_path, 8, "--config", config, reader, tmp_path)
    assert dumps[3]["found"] == [10000, "127.0.0.1:24003", "file"]
