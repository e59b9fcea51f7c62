"""tests/soak.sh: runs pytest modules N times beside K busy processes, sums up, exits 0 only when all passed.
The sample modules it runs are written in tmp_path, out of pytest's normal collection."""
import os
import re
import subprocess
import sys

from conftest import REPO, alive

SOAK = REPO / "tests" / "soak.sh"

# Each run writes the pids of its script's other children (the busy processes) to a file of its own.
PASSING = '''
import os, pathlib, psutil

def test_sees_the_busy_processes():
    me = os.getpid()
    others = [p.pid for p in psutil.Process(os.getppid()).children() if p.pid != me]
    folder = pathlib.Path(__file__).parent
    n = len(list(folder.glob("seen.*")))
    (folder / f"seen.{n}").write_text(" ".join(map(str, others)))

def test_also_passes():
    pass
'''

FAILING = '''
def test_passes():
    pass

def test_breaks():
    assert 1 == 2

def test_never_run_after_x():
    pass
'''


def soak(*args):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SOAK), *map(str, args)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)  # a hang guard: two runs of a tiny module take seconds


def test_all_runs_pass(tmp_path):
    (tmp_path / "test_ok_sample.py").write_text(PASSING)
    done = soak(tmp_path / "test_ok_sample.py", "--runs", 2, "--load", 1)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "soak: 2 passed, 0 failed of 2 runs (load 1)", done.stdout
    assert [line.split(":")[0] for line in lines if line.startswith("run ")] == ["run 1/2", "run 2/2"]
    assert "FAILED" not in done.stdout
    seen = [(tmp_path / f"seen.{i}").read_text().split() for i in range(2)]
    assert not (tmp_path / "seen.2").exists()
    # one busy process beside each run, the same one for both, gone once the script has ended
    assert len(seen[0]) == 1 and seen[0] == seen[1], seen
    assert not alive(int(seen[0][0]))
    folder = re.search(r"failing runs' output in (\S+)", done.stdout).group(1)
    assert not os.path.exists(folder)  # nothing failed: nothing kept


def test_a_failing_run_fails_the_soak(tmp_path):
    (tmp_path / "test_bad_sample.py").write_text(FAILING)
    # no busy process (test_all_runs_pass has its one): it would burn a core of the suite's for nothing proved here
    done = soak(tmp_path / "test_bad_sample.py", "--runs", 2, "--load", 0)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    summary = lines.index("soak: 0 passed, 2 failed of 2 runs (load 0)")
    failing = lines[summary + 2:]
    assert len(failing) == 2, done.stdout
    for run, line in zip((1, 2), failing):
        assert re.fullmatch(rf"  run {run}: \S*test_bad_sample\.py::test_breaks \(output: (\S+)\)", line), line
        log = re.search(r"\(output: (\S+)\)", line).group(1)
        text = open(log).read()
        assert "assert 1 == 2" in text and "1 failed, 1 passed" in text  # -x: the third test never ran
    assert lines[summary + 1].startswith("failing runs (output in ")


def test_usage_errors_exit_2():
    assert soak().returncode == 2
    assert soak("tests/test_soak_script.py", "--runs", 0).returncode == 2
    assert soak("tests/test_soak_script.py", "--load", "x").returncode == 2
    assert soak("tests/test_soak_script.py", "--bogus").returncode == 2
