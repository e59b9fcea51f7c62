"""bench/elastic.py still works: one run of its start-up scenario, both launchers (3 launchers each on
127.0.0.1, real gloo workers), and the table's cells. No timing is asserted, only what holds however
loaded the machine: a figure on both sides, every node's exit 0 (a job of a step count), nothing left
running; a bad option exits 2 before anything starts."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import elastic  # noqa: E402
from elastic import Figure  # noqa: E402


def test_one_start_up_run_of_each_launcher_has_its_figures_and_leaves_nothing(tmp_path):
    out = tmp_path / "elastic.json"
    done = subprocess.run([sys.executable, "bench/elastic.py", "--only", "startup", "--json", str(out)],
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


def test_a_cell_shows_the_median_and_range_then_each_verdict_once_with_its_detail():
    runs = [Figure(2.0), Figure(verdict="lost", detail="node0 exit 1"), Figure(4.0), Figure(verdict="lost")]
    assert elastic.cell(runs) == "3 s (2-4) in 2 of 4; lost x2 (node0 exit 1)"
    assert elastic.cell([Figure(verdict="hung 90 s", detail="a | b")]) == "hung 90 s (a / b)"


def test_a_bad_option_exits_2_naming_it_before_anything_starts():
    done = subprocess.run([sys.executable, "bench/elastic.py", "--only", "startup,reboot"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--only startup,reboot" in done.stderr and "Traceback" not in done.stderr
