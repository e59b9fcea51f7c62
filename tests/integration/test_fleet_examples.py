"""The examples: train_with_fleet.py is train_single.py plus the four marked changes, and it runs as a job."""

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.training  # CI runs them after the quick loop (README's development lines)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def code_lines(path):
    """The file's lines from the first import on, and the numbers of those inside '# Change N' blocks."""
    lines = path.read_text().splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("import ")):]
    marked, inside = set(), False
    for i, line in enumerate(lines):
        inside = line.strip().startswith("# Change") or (inside and line.strip() != "")
        if inside:
            marked.add(i)
    return lines, marked


def test_fleet_example_differs_from_the_single_one_only_by_the_four_changes():
    single, single_marked = code_lines(EXAMPLES / "train_single.py")
    fleet, fleet_marked = code_lines(EXAMPLES / "train_with_fleet.py")
    changes = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=single, b=fleet, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        assert {i for i in range(i1, i2) if single[i].strip()} <= single_marked, single[i1:i2]
        assert {j for j in range(j1, j2) if fleet[j].strip()} <= fleet_marked, fleet[j1:j2]
        changes.update(re.findall(r"# Change (\d)", "\n".join(fleet[j1:j2])))
    assert changes == {"1", "2", "3", "4"}


def test_fleet_example_trains_and_saves_under_the_launcher(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "launcher", "--nproc_per_node", "2", "--log_dir", "logs", str(EXAMPLES / "train_with_fleet.py")]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        costs = re.findall(r"^step(\d+) cost=(\d+\.\d+)$", (tmp_path / "logs" / f"workerlog.{rank}").read_text(), re.M)
        assert [int(step) for step, _ in costs] == list(range(100))
    saved = torch.load(tmp_path / "persistables.pt", weights_only=True)  # model_path = "./", as in Paddle's listing
    assert [tuple(t.shape) for t in saved["model"].values()] == [(1280, 32), (1280,), (1280, 1280), (1280,), (2, 1280), (2,)]
    assert saved["optimizer"]["param_groups"][0]["lr"] == 0.01
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "persistables.pt"]  # only the first worker wrote


def run_example(tmp_path, *launch_args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "MASTER_ADDR", "MASTER_PORT",
                 "TRAINING_ROLE"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "launcher", "--log_dir", "logs", *launch_args]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_seed_002s_nccl2_listing_trains_data_parallel_with_a_plain_optimizer(tmp_path):
    run_example(tmp_path, "--nproc_per_node", "2", str(EXAMPLES / "dist_transpiler_nccl2.py"))
    logs = [(tmp_path / "logs" / f"workerlog.{rank}").read_text() for rank in (0, 1)]
    sums = [re.search(r"^parameters checksum (\S+)$", log, re.M).group(1) for log in logs]
    assert sums[0] == sums[1], logs  # different batches, the same parameters: the gradients were averaged
    assert all("step19 cost=" in log for log in logs)


def test_seed_002s_pserver_listing_runs_with_whole_parameters_shuffled_over_two_servers(tmp_path):
    run_example(tmp_path, "--server_num", "2", "--worker_num", "1", str(EXAMPLES / "dist_transpiler_pserver.py"))
    log = (tmp_path / "logs" / "workerlog.0").read_text()
    assert "step19 cost=" in log
    table = [line.split() for line in log.splitlines() if line.startswith(("0.", "2.", "4."))]
    # Paddle's shuffle (np.random.seed(0)) of the 6 parameters, then RoundRobin (tests/test_ps_placement.py)
    assert {row[0]: row[-2] for row in table} == {"0.weight": "0", "0.bias": "0", "2.weight": "1", "2.bias": "1",
                                                 "4.weight": "1", "4.bias": "0"}, log
    saved = torch.load(tmp_path / "output" / "model.pt", weights_only=True)
    assert [tuple(t.shape) for t in saved.values()] == [(1280, 32), (1280,), (1280, 1280), (1280,), (2, 1280), (2,)]


SEED_000 = next(Path("/work/shared/seeds").glob("000_*.txt"), None) if Path("/work/shared/seeds").is_dir() else None


def seed_code(lines):
    """Code lines without comments, blank lines and indentation: what a user edits."""
    return [re.sub(r"\s+#.*$", "", line.strip()) for line in lines if line.strip() and not line.strip().startswith("#")]


def test_the_fleet_page_says_how_many_of_seed_000s_lines_a_user_changes():
    if SEED_000 is None:
        import pytest

        pytest.skip("the seeds are not on this machine")
    text = SEED_000.read_text().splitlines()
    start = text.index("将单机单卡训练改成多机多卡训练的代码train_with_fleet.py示例如下。")
    listing = text[start + 1:text.index("运行结果会在mylog文件夹中得到8个log日志，分别对应8张卡的运行结果。")]
    seed = seed_code(listing)
    ours = seed_code((EXAMPLES / "train_with_fleet.py").read_text().split('"""', 2)[2].splitlines())
    kept = sum(b.size for b in difflib.SequenceMatcher(a=seed, b=ours, autojunk=False).get_matching_blocks())
    readme = (REPO / "docs" / "fleet.md").read_text()
    assert f"{len(seed) - kept} of its {len(seed)} code lines" in readme, (len(seed) - kept, len(seed))


def test_tuned_example_trains_under_the_launcher(tmp_path):
    """docs/fleet.md's `python -m launcher --nproc_per_node 2 examples/train_tuned.py`."""
    run_example(tmp_path, "--nproc_per_node", "2", str(EXAMPLES / "train_tuned.py"))
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"workerlog.{rank}").read_text()
        steps = [int(s) for s in re.findall(r"^step(\d+) cost=\d+\.\d+$", log, re.M)]
        assert steps == list(range(0, 100, 2)), log  # fetch_frequency = 2
    assert (tmp_path / "output" / "persistables.pt").is_file()
