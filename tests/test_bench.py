"""bench/run.py still runs: one --tiny pass, both launchers, every workload (issue 4).

No timing is asserted here, only that the table comes out and that the correctness checks the
benchmark makes on the way hold: exit codes, no log line lost or cut, ranks in sync.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TITLES = ("1. start-up", "2. 2-worker job", "3. teardown", "4. idle", "5. log volume",
          "6. scale", "7. planning", "8a. training", "8b. training")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    done = subprocess.run([sys.executable, "bench/run.py", "--tiny", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def row(result, workload, metric):
    (found,) = [r for r in result["rows"] if r["workload"].startswith(workload) and r["metric"].startswith(metric)]
    return found


def test_the_table_has_every_workload_and_both_launchers(tiny):
    stdout, result = tiny
    assert "ours" in stdout and "torchrun" in stdout and "ratio" in stdout
    for title in TITLES:
        assert title in stdout
    assert {r["workload"].split(".")[0] for r in result["rows"]} == {t.split(".")[0] for t in TITLES}


def test_torchrun_side_runs_every_workload(tiny):
    _, result = tiny
    assert not [e for e in result["errors"] if e.startswith("torchrun")]
    assert all(r["torchrun"] is not None for r in result["rows"])


def test_torchrun_side_checks_hold(tiny):
    _, result = tiny
    assert row(result, "5.", "lines lost")["torchrun"] == 0
    assert row(result, "3.", "launcher exit code")["torchrun"] != 0


def test_our_side_runs_every_workload_and_its_checks_hold(tiny):
    _, result = tiny
    assert not result["errors"]
    assert not result["notes"]  # e.g. a process that outlived the launcher
    assert row(result, "3.", "launcher exit code")["ours"] == 7
    assert row(result, "5.", "lines lost")["ours"] == 0
    assert row(result, "6.", "launcher exit code")["ours"] == 143


def test_plot_without_matplotlib_is_a_clear_error(tmp_path):
    code = ("import sys, builtins; real = builtins.__import__\n"
            "def fake(name, *a, **k):\n"
            "    if name.startswith('matplotlib'): raise ImportError(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = fake\n"
            "sys.argv = ['bench/run.py', '--plot', sys.argv[1]]\n"
            "import runpy; runpy.run_path('bench/run.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.png")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "matplotlib" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.png").exists()
