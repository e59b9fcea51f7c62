"""bench/elastic.py still works: one run of its start-up scenario, both launchers (3 launchers each on
127.0.0.1, real gloo workers), and the table's cells. No timing is asserted, only what holds however
loaded the machine: a figure on both sides, every node's exit 0 (a job of a step count), nothing left
running; a bad option exits 2 before anything starts. The spare scenario's runs are marked ``bench``, out of the quick
loop (CI runs them: ``pytest -m bench``)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import elastic  # noqa: E402
from elastic import Figure  # noqa: E402


@pytest.mark.bench  # CI runs it after the quick loop
def test_one_start_up_run_of_each_launcher_has_its_figures_and_leaves_nothing(tmp_path):
    out = tmp_path / "elastic.json"
    done = subprocess.run([sys.executable, "bench/elastic.py", "--only", "startup", "--sides", "ours,torchrun",
                           "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    for side in ("ours", "torchrun"):
        (run,) = result["results"]["startup"][side]
        assert run["exits"] == "node0 exit 0, node1 exit 0, node2 exit 0", run
        assert run["leftovers"] == []
        first_any, first_all = run["figures"]["startup-any"]["seconds"], run["figures"]["startup-all"]["seconds"]
        assert 0 < first_any <= first_all, run
    assert "| 1. start-up: first launcher start -> first step of all 3 ranks |" in done.stdout
    assert "Left running after a run: nothing." in done.stdout


@pytest.mark.bench
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_one_spare_run_promotes_the_warm_standby_and_keeps_every_process(tmp_path, backend):
    """The spare scenario, small: ours with workers kept in place and a warm standby (torchrun's side is left out
    here: it takes the 60 s of its store's timeout on this machine); a figure, the survivor's and the standby's
    workers the ones they had, nothing left running. With etcd, a one-member etcd of the run's own."""
    if backend == "etcd" and shutil.which("etcd") is None:
        pytest.skip("etcd is not installed")
    out = tmp_path / "spare.json"
    done = subprocess.run([sys.executable, "bench/elastic.py", "--only", "spare", "--sides", "inprocess", "--json",
                           str(out), *(["--etcd", "local"] if backend == "etcd" else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["results"]["spare"]["inprocess"]
    figure = run["figures"]["spare"]
    assert figure["seconds"] is not None and figure["seconds"] > 0, run
    assert figure["detail"].endswith("; the survivors' processes kept"), run  # the standby's warm worker among them
    assert run["leftovers"] == []
    assert "| 6. spare: --nnodes 1:2 + a standby, power-off -> next step of both ranks at world 2 |" in done.stdout


def test_a_cell_shows_the_median_and_range_then_each_verdict_once_with_its_detail():
    runs = [Figure(2.0), Figure(verdict="lost", detail="node0 exit 1"), Figure(4.0), Figure(verdict="lost")]
    assert elastic.cell(runs) == "3 s (2-4) in 2 of 4; lost x2 (node0 exit 1)"
    assert elastic.cell([Figure(verdict="hung 90 s", detail="a | b")]) == "hung 90 s (a / b)"


def test_a_bad_option_exits_2_naming_it_before_anything_starts():
    done = subprocess.run([sys.executable, "bench/elastic.py", "--only", "startup,reboot"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--only startup,reboot" in done.stderr and "Traceback" not in done.stderr


def test_the_example_side_runs_the_projects_example_as_the_docs_show_and_reads_its_step_lines(tmp_path):
    """``--sides example``: every node runs examples/elastic_inprocess.py with only the step to stop at, in a log folder
    of its own, and its steps are read from the ``time=... step=... world=...`` lines of that node's worker logs."""
    from types import SimpleNamespace

    import elastic_job
    import harness

    (side,) = [s for s in elastic_job.sides(REPO) if s.name == "example"]
    with harness.PortReservations() as ports:
        job = elastic_job.Job(side, tmp_path, ports, 3, None, ["--steps", 10, "--until", "1234"])
    script = str(REPO / "examples" / "elastic_inprocess.py")
    argv = job.node_argv(1)
    assert argv[argv.index(script) - 1:] == [f"--log_dir={tmp_path / 'node1-log'}", script, "--steps", "10"]
    assert "--rdzv-backend=c10d" in argv and "--nnodes=2:3" in argv

    job.nodes = [SimpleNamespace(proc=SimpleNamespace(pid=4242)), SimpleNamespace(proc=SimpleNamespace(pid=4343))]
    (tmp_path / "node0-log").mkdir()
    (tmp_path / "node1-log").mkdir()
    (tmp_path / "node0-log" / "workerlog.0").write_text(
        "===== launcher: rank 0 starts\ntime=100.500 step=7 world=2 rank=0 pid=11 loss=0.1 round=0 source=0\n")
    (tmp_path / "node1-log" / "workerlog.2").write_text(
        "a warning\ntime=101.250 step=8 world=3 rank=2 pid=12 loss=0.1 round=0 source=0\ntime=101.3 step=9 wor")
    assert job.refresh() == [{"t": 100.5, "step": 7, "world": 2, "rank": 0, "pid": 11, "host_pid": 4242},
                             {"t": 101.25, "step": 8, "world": 3, "rank": 2, "pid": 12, "host_pid": 4343}]
    assert elastic_job.first_step(3, host=4343)(job.records) == 101.25
    with open(tmp_path / "node1-log" / "workerlog.2", "a") as f:
        f.write("ld=3 rank=2 pid=12 loss=0.1 round=0 source=0\n")
    assert [r["step"] for r in job.refresh()] == [7, 8, 9]
