"""torchrun's own command line given to `python -m launcher`: one node and two (loopback) nodes."""

import re
import shutil
from pathlib import Path

import pytest

from conftest import WORKERS, finish_all, free_ports, read_dumps, run_launcher, start_launcher

ENV_DUMP = WORKERS / "torchrun_env.py"


def test_standalone_with_torchruns_options(tmp_path):
    r = run_launcher("--standalone", "--nnodes", 1, "--nproc-per-node", 2, "--max-restarts", 0, "--rdzv-id", "job7",
                     "--monitor-interval", 1, "--start-method", "spawn", "--redirects", 3, "--tee", 3,
                     "--local-ranks-filter", 0, "--role", "trainer", "--run-path", ENV_DUMP, tmp_path, timeout=120,
                     env={"TMPDIR": str(tmp_path)})  # --redirects without --log-dir: a torchelastic_* folder there
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(tmp_path, 2)
    assert {d["ROLE_NAME"] for d in dumps.values()} == {"trainer"}
    assert {d["TORCHELASTIC_RUN_ID"] for d in dumps.values()} == {"job7"}


def test_an_elastic_range_on_the_static_rendezvous_is_refused_naming_the_reason():
    r = run_launcher("--nnodes", "1:4", "--nproc-per-node", 2, ENV_DUMP, "/nonexistent")
    assert r.returncode == 2 and r.stderr.strip() == (
        "launcher: error: --nnodes 1:4 with --rdzv-backend static: a static rendezvous has a fixed number of "
        "nodes; give --rdzv-backend c10d for an elastic job, or --nnodes 4.")


def test_two_nodes_from_torchruns_command_line(tmp_path):
    port = free_ports(3) + 1  # the store's port, and the one below it where node 0 gathers the nodes
    common = ["--nnodes", 2, "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", 1]
    nodes = [start_launcher(*common, "--node-rank", 1, "--local-addr", "127.0.0.2", ENV_DUMP, tmp_path),
             start_launcher(*common, "--node-rank", 0, ENV_DUMP, tmp_path)]
    results = finish_all(nodes)
    assert [code for code, _, _ in results] == [0, 0], results
    dumps = read_dumps(tmp_path, 2)
    assert [dumps[r]["GROUP_RANK"] for r in (0, 1)] == ["0", "1"]
    assert {dumps[r]["MASTER_PORT"] for r in (0, 1)} == {str(port)} and dumps[1]["WORLD_SIZE"] == "2"
    assert dumps[0]["TORCHELASTIC_RUN_ID"] == dumps[1]["TORCHELASTIC_RUN_ID"]


TWO_STREAMS = WORKERS / "two_streams.py"


def shown(text):
    """The worker lines on one console stream, without their [rank N] prefix."""
    return sorted(line.split("] ", 1)[1] for line in text.splitlines() if line.startswith("[rank "))


def in_file(folder, rank):
    path = folder / f"workerlog.{rank}"
    return sorted(line for line in path.read_text().splitlines() if not line.startswith("===== ")) if path.exists() else None


# What torchrun 2.13 shows and writes for each choice (DefaultLogsSpecs.reify), in our layout:
# (console stdout, console stderr, workerlog.0, workerlog.1)
@pytest.mark.parametrize("args, out, err, log0, log1", [
    (["--redirects", "3"], [], [], ["stderr of 0", "stdout of 0"], ["stderr of 1", "stdout of 1"]),
    (["--redirects", "1"], [], ["stderr of 0", "stderr of 1"], ["stdout of 0"], ["stdout of 1"]),
    (["--tee", "3", "--local-ranks-filter", "1"], ["stderr of 1", "stdout of 1"], [],
     ["stderr of 0", "stdout of 0"], ["stderr of 1", "stdout of 1"]),
    (["-r", "0:3"], ["stdout of 1"], ["stderr of 1"], ["stderr of 0", "stdout of 0"], None),
    # the filter alone keeps our layout (every line in its file, the console echoing it), limited to rank 1
    (["--local-ranks-filter", "1"], ["stderr of 1", "stdout of 1"], [], ["stderr of 0", "stdout of 0"],
     ["stderr of 1", "stdout of 1"]),
])
def test_redirects_tee_and_filter_route_the_streams_as_torchrun(tmp_path, args, out, err, log0, log1):
    r = run_launcher("--print_config", "false", "--nproc-per-node", 2, "--log-dir", tmp_path, *args, TWO_STREAMS)
    assert r.returncode == 0, r.stderr
    assert (shown(r.stdout), shown(r.stderr)) == (out, err)
    assert (in_file(tmp_path, 0), in_file(tmp_path, 1)) == (log0, log1)


def test_a_restart_keeps_each_stream_where_it_goes(tmp_path):
    """A split route (-r 1: stdout to the file, stderr on the console) in both attempts (no spare
    interpreter takes it over: it is started afresh)."""
    r = run_launcher("--print_config", "false", "--nproc-per-node", 2, "--max-restarts", 1, "--log-dir", tmp_path / "log",
                     "-r", 1, TWO_STREAMS, env={"FAIL_FIRST_ATTEMPT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert shown(r.stderr) == ["stderr of 0", "stderr of 0", "stderr of 1", "stderr of 1"] and shown(r.stdout) == []
    assert in_file(tmp_path / "log", 1) == ["stdout of 1", "stdout of 1"]


def test_the_filter_without_a_log_dir_limits_the_console():
    r = run_launcher("--print_config", "false", "--nproc-per-node", 2, "--local-ranks-filter", 1, TWO_STREAMS)
    assert r.returncode == 0 and (shown(r.stdout), shown(r.stderr)) == (["stdout of 1"], ["stderr of 1"]), r


def test_tee_without_a_log_dir_writes_a_fresh_folder_as_torchrun():
    r = run_launcher("--nproc-per-node", 2, "--tee", "3", TWO_STREAMS)
    assert r.returncode == 0, r.stderr
    assert shown(r.stdout) == ["stderr of 0", "stderr of 1", "stdout of 0", "stdout of 1"]
    folder = Path(re.search(r"(/\S*torchelastic_\w+)/workerlog\.0", r.stdout + r.stderr).group(1))
    assert in_file(folder, 1) == ["stderr of 1", "stdout of 1"]
    shutil.rmtree(folder)


@pytest.mark.parametrize("args, message", [
    (["--redirects", "4"], "--redirects 4 is not a choice of streams; give 0 none, 1 stdout, 2 stderr, 3 both"),
    (["--tee", "0:3,x"], "--tee 0:3,x is not a choice of streams"),
    (["--local-ranks-filter", "0,a"], "--local-ranks-filter 0,a is not a list of local ranks"),
    (["--monitor-interval", "-1"], "--monitor-interval -1 is not a positive number of seconds"),
    (["--start-method", "thread"], "'thread' is not one of 'spawn', 'fork', 'forkserver'"),
])
def test_bad_stream_and_agent_values_exit_2_with_one_sentence(tmp_path, args, message):
    r = run_launcher("--nproc-per-node", 2, *args, TWO_STREAMS)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------- torchrun's PET_* variables


def kubeflow_elastic_env(port) -> dict:
    """What Kubeflow's Training Operator (v1.9, an elastic PyTorchJob: elasticPolicy) sets in each pod: no
    PET_NODE_RANK without a Master replica; c10d by default."""
    return {"PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}", "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ID": "pytorchjob-1", "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "3",
            "PET_RDZV_CONF": "last_call_timeout=60"}  # the two start together: one round of two


def test_an_elastic_pytorchjob_runs_from_kubeflow_s_variables_alone(tmp_path):
    port = free_ports(3)
    env = kubeflow_elastic_env(port)
    nodes = [start_launcher(ENV_DUMP, tmp_path, env=env), start_launcher(ENV_DUMP, tmp_path, env=env)]
    results = finish_all(nodes)
    assert [code for code, _, _ in results] == [0, 0], results
    dumps = read_dumps(tmp_path, 2)
    assert {dumps[r]["WORLD_SIZE"] for r in (0, 1)} == {"2"}
    assert {dumps[r]["TORCHELASTIC_RUN_ID"] for r in (0, 1)} == {"pytorchjob-1"}
    assert {dumps[r]["TORCHELASTIC_MAX_RESTARTS"] for r in (0, 1)} == {"3"}


def test_the_command_line_wins_over_a_pet_variable(tmp_path):
    r = run_launcher("--nproc-per-node", 1, "--max-restarts", 0, ENV_DUMP, tmp_path,
                     env={"PET_MAX_RESTARTS": "many", "PET_NPROC_PER_NODE": "lots", "PET_ROLE": "reader"})
    assert r.returncode == 0, r.stderr
    assert read_dumps(tmp_path, 1)[0]["ROLE_NAME"] == "reader"


@pytest.mark.parametrize("env, message", [
    ({"PET_MAX_RESTARTS": "many"}, "PET_MAX_RESTARTS=many: "),
    ({"PET_STANDALONE": "yes"}, "PET_STANDALONE=yes is not a flag's value; torchrun reads 1 (on) or 0 (off)."),
    ({"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGKILL"}, "PET_SIGNALS_TO_HANDLE SIGTERM,SIGKILL: SIGKILL cannot be caught"),
    ({"PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": "127.0.0.1:29400", "PET_RDZV_BACKEND": "zookeeper"},
     "PET_RDZV_BACKEND=zookeeper: "),
])
def test_a_bad_pet_variable_exits_2_naming_it(env, message):
    r = run_launcher("--nproc-per-node", 1, ENV_DUMP, "/nonexistent", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
