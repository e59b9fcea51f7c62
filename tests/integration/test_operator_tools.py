"""``launcher status`` and ``launcher logs`` on real jobs: while they run, after, and when they are gone."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, WORKERS, alive, launcher_cmd, run_launcher, start_launcher, wait_for

TICKER = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello {rank}", flush=True)
i = 0
while not (rank == 1 and os.path.exists(sys.argv[1])):
    print(f"tick {rank} {i}", flush=True)
    i += 1
    time.sleep(0.1)
print(f"bye {rank}", flush=True)
sys.exit(3)
"""


def tool(*args, cwd=REPO, timeout=30):
    """``python -m launcher ARGS`` run to the end from ``cwd``, which need not be the repository."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(launcher_cmd(*args), capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": path})


def state_of(log_dir):
    path = log_dir / "launcher.node0.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One job of two ticking workers, watched while it runs; rank 1 exits 3 when told."""
    tmp = tmp_path_factory.mktemp("job")
    script, stop, log_dir = tmp / "ticker.py", tmp / "stop", tmp / "logs"
    script.write_text(TICKER)
    launcher = start_launcher("--nproc_per_node", 2, "--log_dir", log_dir, script, stop)
    seen = {}
    try:
        wait_for(lambda: state_of(log_dir) and all(
            "tick" in (log_dir / f"workerlog.{r}").read_text() for r in (0, 1)), what="both workers ticking")
        seen["pids"] = [p["pid"] for p in state_of(log_dir)["processes"]]
        seen["alive"] = [alive(p) for p in seen["pids"]]
        seen["status"] = tool("status", log_dir)
        follower = subprocess.Popen(launcher_cmd("logs", log_dir, "-f", "--grep", "bye|hello"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        events = subprocess.Popen(launcher_cmd("logs", log_dir, "-f", "--events"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        time.sleep(0.5)
        stop.touch()
        seen["follow"] = follower.communicate(timeout=20) + (follower.returncode,)
        seen["events"] = events.communicate(timeout=20) + (events.returncode,)
        launcher.communicate(timeout=30)
    finally:
        stop.touch()
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    seen["code"] = launcher.returncode
    seen["after"] = tool("status", log_dir)
    return log_dir, seen


def test_status_while_the_job_runs(job):
    log_dir, seen = job
    r = seen["status"]
    assert r.returncode == 0, r.stderr
    assert all(seen["alive"])
    assert "running, launcher pid" in r.stdout, r.stdout
    rows = [line.split() for line in r.stdout.splitlines()[2:]]
    assert [row[1:5] for row in rows] == [["rank", "0", str(seen["pids"][0]), "running"],
                                          ["rank", "1", str(seen["pids"][1]), "running"]], r.stdout
    assert all("tick" in line or "hello" in line for line in r.stdout.splitlines()[2:]), r.stdout


def test_status_after_the_job_ended(job):
    log_dir, seen = job
    assert seen["code"] == 3
    r = seen["after"]
    assert r.returncode == 0, r.stderr
    assert "ended with exit code 3" in r.stdout
    lines = r.stdout.splitlines()
    assert "killed by SIGTERM" in lines[2] and "exited 3" in lines[3] and "bye 1" in lines[3]


def test_logs_follow_shows_new_lines_and_ends_with_the_job(job):
    log_dir, seen = job
    out, err, code = seen["follow"]
    assert code == 0, err
    assert out.splitlines() == ["[rank 0] hello 0", "[rank 1] hello 1", "[rank 1] bye 1"]


def test_the_event_log_tells_the_job_in_order(job):
    """events.jsonl: the start, each worker's start and exit, the stop and its cause, the end; each line whole."""
    log_dir, seen = job
    events = [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]
    kinds = [(e["event"], e.get("rank")) for e in events]
    assert kinds[:3] == [("job_started", None), ("worker_started", 0), ("worker_started", 1)], kinds
    assert kinds[3:] == [("worker_exited", 1), ("stop", 1), ("worker_exited", 0), ("job_ended", None)], kinds
    started, _, _, exited, stop, killed, ended = events
    assert (started["workers"], started["world_size"], started["nodes"]) == (2, 2, 1)
    assert [e["pid"] for e in events[1:3]] == seen["pids"] and exited["pid"] == seen["pids"][1]
    assert (exited["code"], exited["exit"], killed["code"]) == (3, "exit code 3", -15)
    assert (stop["kind"], stop["code"], ended["code"]) == ("worker", 3, 3) and "rank 1" in stop["cause"]
    assert all(e["node"] == 0 for e in events)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)


def test_logs_events_shows_an_event_a_line_and_follows_to_the_end(job):
    log_dir, seen = job
    r = tool("logs", log_dir, "--events")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 7
    assert lines[0].endswith("node 0: job started: 2 worker(s) here, world size 2, 1 node(s)")
    assert lines[3].endswith(f"node 0 rank 1: pid {seen['pids'][1]} exited: exit code 3")
    assert lines[-1].endswith("node 0: job ended: exit code 3")
    out, err, code = seen["events"]
    assert code == 0, err
    assert out.splitlines() == lines
    r = tool("logs", log_dir, "--events", "--grep", "rank 1")
    assert [line.split(": ", 1)[1] for line in r.stdout.splitlines()] == [
        f"started pid {seen['pids'][1]}", f"pid {seen['pids'][1]} exited: exit code 3",
        "stopping the job (worker): rank 1 failed (exit code 3)"]


def test_logs_merge_with_ranks_and_grep(job):
    log_dir, _ = job
    r = tool("logs", log_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[rank 0] ===== ") and "launcher: rank 0 starts" in lines[0]
    assert "[rank 1] bye 1" in lines and "[rank 0] tick 0 0" in lines
    r = tool("logs", log_dir, "--ranks", "1", "--grep", r"tick 1 [0-2]$")
    assert r.stdout.splitlines() == ["[rank 1] tick 1 0", "[rank 1] tick 1 1", "[rank 1] tick 1 2"]


@pytest.mark.parametrize("attempt", range(5))  # the Ctrl-C can come as a write returns: 1 run in 5 showed a line twice
def test_logs_follow_stops_on_ctrl_c(tmp_path, attempt):
    """A job that runs as far as the state file says (its launcher: this test): -f follows until Ctrl-C,
    every line shown once."""
    (tmp_path / "workerlog.0").write_text("first\n")
    me = os.getpid()
    start = int(open(f"/proc/{me}/stat").read().rsplit(")", 1)[1].split()[19])
    fake = {"version": 1, "node": 0, "node_ip": "127.0.0.1", "nodes": 1, "host": os.uname().nodename,
            "run_id": "x", "launcher_pid": me, "launcher_start": start, "attempt": 0, "max_restarts": 0,
            "phase": "running", "exit_code": None, "started": time.time(), "updated": time.time(),
            "processes": [{"label": "rank 0", "key": 0, "pid": me, "log": "workerlog.0", "started": time.time(),
                           "ended": None, "returncode": None}]}
    (tmp_path / "launcher.node0.json").write_text(json.dumps(fake))
    follower = subprocess.Popen(launcher_cmd("logs", tmp_path, "-f"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)
    guard = threading.Timer(60, follower.kill)  # bounds the readlines: each waits for its own line
    guard.start()
    try:
        shown = [follower.stdout.readline()]
        with open(tmp_path / "workerlog.0", "a") as f:
            f.write("second\n")
        shown.append(follower.stdout.readline())
        assert follower.poll() is None  # the job still runs: it follows
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=10)
    finally:
        guard.cancel()
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 130
    assert "".join(shown).splitlines() == ["[rank 0] first", "[rank 0] second"] and out == ""
    assert "Traceback" not in err


def test_the_processes_tests_start_do_not_inherit_ignored_signals():
    """Under ``nohup`` or ``cmd &`` the suite starts with SIGINT ignored: conftest resets that for
    its children, or the Ctrl-C tests (above, test_faults, test_log_faults) fail."""
    from conftest import INHERITED_SIGNALS
    child = subprocess.Popen(["sleep", "30"])
    try:
        with open(f"/proc/{child.pid}/status") as f:
            ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    finally:
        child.kill()
        child.wait()
    assert [s.name for s in INHERITED_SIGNALS if ignored & (1 << (s - 1))] == []


def test_a_job_whose_launcher_is_gone(tmp_path):
    r = run_launcher("--nproc_per_node", 1, "--log_dir", tmp_path, WORKERS / "probe.py")
    assert r.returncode == 0, r.stderr
    record = state_of(tmp_path)
    record.update(phase="running", exit_code=None)  # as if it had been killed with -9 mid-run
    record["processes"][0].update(ended=None, returncode=None)
    (tmp_path / "launcher.node0.json").write_text(json.dumps(record))
    r = tool("status", tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"not running any more: its launcher (pid {record['launcher_pid']}) is gone" in r.stdout
    assert "stopped" in r.stdout.splitlines()[2]
    r = tool("logs", tmp_path, "-f", timeout=10)  # nothing to follow: ends at once
    assert r.returncode == 0 and "[rank 0] worker rank 0 done" in r.stdout


@pytest.mark.parametrize("args, message", [
    (("status", "{tmp}/none"), "does not exist"),
    (("status", "{tmp}"), "no launcher state file"),
    (("logs", "{tmp}"), "no workerlog.N or serverlog.N"),
    (("logs", "{tmp}/none", "-f"), "does not exist"),
])
def test_missing_or_empty_log_dir_is_one_sentence(tmp_path, args, message):
    r = tool(*(a.format(tmp=tmp_path) for a in args))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr and r.stderr.startswith("launcher: error: ")


def test_a_corrupt_state_file(tmp_path):
    (tmp_path / "launcher.node0.json").write_text('{"version": 1, "node": ')
    (tmp_path / "workerlog.0").write_text("line\n")
    r = tool("status", tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "launcher.node0.json is not a launcher state file (not JSON" in r.stderr
    r = tool("logs", tmp_path)  # the logs do not need it
    assert r.returncode == 0 and r.stdout == "[rank 0] line\n"


def test_logs_on_one_huge_line_holds_little_memory(tmp_path):
    """A 96 MiB line is read in pieces and cut as the launcher cuts it, not held whole."""
    log = tmp_path / "workerlog.0"
    with open(log, "wb") as f:
        f.write(b"===== 2026-01-01 00:00:00 launcher: rank 0 starts: python x.py\n")
        for _ in range(96):
            f.write(b"x" * (1 << 20))
        f.write(b"\nend\n")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    # Measured from a small parent: Linux keeps a process's peak RSS across exec, so a child forked by
    # this (large, by now) test process would report at least this process's size.
    measure = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
               "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    for args in (("logs", tmp_path), ("status", tmp_path)):
        r = subprocess.run([sys.executable, "-c", measure, *launcher_cmd(*args)], capture_output=True, text=True,
                           cwd=REPO, env={**os.environ, "PYTHONPATH": path}, timeout=120)
        peak = int(r.stdout.strip())  # KiB
        assert peak < 80 * 1024, f"{args[0]}: {peak // 1024} MiB at most"


def test_status_and_logs_on_a_hostile_state_file(tmp_path):
    """Wrong-typed values are unknown ('?'), and a log named outside the log dir is never read."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (tmp_path / "secret.txt").write_text("the secret\n")
    (log_dir / "workerlog.0").write_text("step 1\n")
    procs = [{"label": "rank 0", "key": 0, "pid": 1, "log": "../secret.txt", "started": float("nan"),
              "ended": None, "returncode": None},
             {"label": "rank 1", "key": 1, "pid": "x", "log": "workerlog.0", "started": 1e300, "ended": None,
              "returncode": "one"}]
    head = dict(version=1, node=0, node_ip="127.0.0.1", nodes=1, host="h", run_id="r", launcher_pid=1,
                launcher_start=0, attempt="one", max_restarts=0, phase="running", exit_code=None,
                started=1e300, updated=float("nan"), processes=procs)
    (log_dir / "launcher.node0.json").write_text(json.dumps(head))
    r = tool("status", log_dir)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "the secret" not in r.stdout and "step 1" in r.stdout and "attempt ? of 1" in r.stdout
    r = tool("logs", log_dir)
    assert r.returncode == 0 and r.stdout == "[rank 1] step 1\n", r.stderr


def test_logs_follow_ends_when_its_log_dir_is_deleted(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "workerlog.0").write_text("one\n")  # no state file: only the folder's end can stop it
    follower = subprocess.Popen(launcher_cmd("logs", log_dir, "-f"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)
    guard = threading.Timer(30, follower.kill)  # bounds the readline below
    guard.start()
    try:
        first = follower.stdout.readline()  # the follower has listed and read the logs
        shutil.rmtree(log_dir)
        out, err = follower.communicate(timeout=20)
    finally:
        guard.cancel()
        follower.kill()
    assert follower.returncode == 0 and first + out == "[rank 0] one\n"
    assert "is gone (deleted or moved)" in err and err.count("\n") == 1


def test_parameter_server_logs(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    r = run_launcher("--server_num", 1, "--worker_num", 1, "--log_dir", tmp_path / "logs",
                     WORKERS / "ps_role.py", records)
    assert r.returncode == 0, r.stderr
    r = tool("status", tmp_path / "logs")
    assert "server 0" in r.stdout and "trainer 0" in r.stdout and "exited 0" in r.stdout
    r = tool("logs", tmp_path / "logs", "--ranks", "s0")
    assert r.returncode == 0 and r.stdout and all(line.startswith("[server 0] ") for line in r.stdout.splitlines())


def test_a_training_script_named_status_is_not_shadowed(tmp_path):
    (tmp_path / "status").write_text("import os; print('training script', os.environ['RANK'])\n")
    r = tool("status", cwd=tmp_path, timeout=60)  # first argument, but a file of that name is here
    assert r.returncode == 0 and "training script 0" in r.stdout, r.stderr
    r = tool("--nproc_per_node", 1, "status", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "training script 0" in r.stdout, r.stderr
    (tmp_path / "status").unlink()
    r = tool("status", cwd=tmp_path)  # no such file: the tool
    assert r.returncode == 2 and "status needs the --log_dir" in r.stderr


def test_a_state_file_that_cannot_be_written_does_not_fail_the_job(tmp_path):
    (tmp_path / "launcher.node0.json").mkdir()
    r = run_launcher("--nproc_per_node", 2, "--log_dir", tmp_path, WORKERS / "probe.py")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("cannot write the state file") == 1
    assert "worker rank 1 done" in (tmp_path / "workerlog.1").read_text()
