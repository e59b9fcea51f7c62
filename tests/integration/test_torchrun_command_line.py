"""torchrun's own command line given to `python -m launcher`: one node and two (loopback) nodes."""

from conftest import WORKERS, finish_all, free_ports, read_dumps, run_launcher, start_launcher

ENV_DUMP = WORKERS / "torchrun_env.py"


def test_standalone_with_torchruns_options(tmp_path):
    r = run_launcher("--standalone", "--nnodes", 1, "--nproc-per-node", 2, "--max-restarts", 0, "--rdzv-id", "job7",
                     "--monitor-interval", 1, "--start-method", "spawn", "--redirects", 3, "--tee", 3,
                     "--local-ranks-filter", 0, "--role", "trainer", "--run-path", ENV_DUMP, tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(tmp_path, 2)
    assert {d["ROLE_NAME"] for d in dumps.values()} == {"trainer"}
    assert {d["TORCHELASTIC_RUN_ID"] for d in dumps.values()} == {"job7"}


def test_an_elastic_range_is_refused_naming_the_reason():
    r = run_launcher("--nnodes", "1:4", "--nproc-per-node", 2, ENV_DUMP, "/nonexistent")
    assert r.returncode == 2 and r.stderr.strip() == (
        "launcher: error: --nnodes 1:4 is an elastic range; this launcher runs a fixed number of nodes "
        "(there is no elastic membership yet): give --nnodes 4.")


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
