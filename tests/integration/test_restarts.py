"""Restarts on one node: a restarted worker is run by a spare interpreter started ahead, and must
see exactly what a freshly started one sees."""

import json
import os
import shutil
import signal

import psutil

from conftest import WORKERS, run_launcher, start_launcher, wait_for

INTROSPECT = str(WORKERS / "introspect.py")


def spares_of(launcher_pid):
    """The launcher's idle spare interpreters."""
    found = []
    for child in psutil.Process(launcher_pid).children():
        try:
            if "spare.py" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # ended meanwhile
            continue
    return found


def records(folder):
    return {p.name[:-5]: json.loads(p.read_text()) for p in folder.glob("*.json")}


def test_a_restarted_worker_sees_what_a_fresh_one_sees(tmp_path):
    r = run_launcher("--nproc_per_node", 2, "--max_restarts", 1, "--log_dir", tmp_path / "logs", INTROSPECT, tmp_path, "x y")
    assert r.returncode == 0, r.stderr
    seen = records(tmp_path)
    assert sorted(seen) == ["0.0", "0.1", "1.0", "1.1"]
    for rank in (0, 1):
        first, again = seen[f"0.{rank}"], seen[f"1.{rank}"]
        assert (first["restart"], again["restart"]) == ("0", "1")
        for key in ("argv", "file", "name", "path0", "unbuffered", "main"):
            assert first[key] == again[key], key
        assert again["argv"] == [INTROSPECT, str(tmp_path), "x y"] and again["name"] == "__main__"
        log = (tmp_path / "logs" / f"workerlog.{rank}").read_text()
        assert log.index(f"attempt 0 rank {rank} here") < log.index("(attempt 2, restart 1)") < log.index(f"attempt 1 rank {rank} here")


def test_a_restarted_module_worker_sees_what_a_fresh_one_sees(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(WORKERS), os.environ.get("PYTHONPATH", "")])}
    r = run_launcher("--nproc_per_node", 2, "--max_restarts", 1, "-m", "introspect", tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    seen = records(tmp_path)
    for key in ("argv", "file", "name", "main"):
        assert seen["0.0"][key] == seen["1.0"][key], key
    assert "[rank 1] attempt 1 rank 1 here" in r.stdout


def test_restarts_of_a_no_python_worker_start_it_afresh(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\nexec {shutil.which('python3') or 'python3'} {INTROSPECT} \"$@\"\n")
    script.chmod(0o755)
    r = run_launcher("--nproc_per_node", 2, "--max_restarts", 1, "--no_python", script, tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(records(tmp_path)) == ["0.0", "0.1", "1.0", "1.1"]


def test_spares_leave_nothing_behind_when_the_job_ends(tmp_path):
    hold = tmp_path / "hold"
    launcher = start_launcher("--nproc_per_node", 2, "--max_restarts", 3, INTROSPECT, tmp_path,
                              env={"INTROSPECT_HOLD": str(hold)})
    try:
        wait_for(lambda: len(records(tmp_path)) == 4, what="two attempts")
        spares = []

        workers = {r["pid"] for r in records(tmp_path).values()}  # woken spares among them

        def idle_spares():
            spares[:] = [p for p in spares_of(launcher.pid) if p.pid not in workers]
            return len(spares) == 2

        wait_for(idle_spares, what="the spares for attempt 3")
    finally:
        hold.touch()
        out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, err
    assert "left running" not in err
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in spares), timeout=5,
             what="the spares to go")


def test_a_spare_that_died_is_replaced_by_a_fresh_start(tmp_path):
    marker = tmp_path / "go"
    script = tmp_path / "wait_then_fail.py"
    script.write_text(
        "import os, sys, time\n"
        f"folder = {str(tmp_path)!r}\n"
        "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "open(os.path.join(folder, f'ran.{attempt}.{os.environ[\"RANK\"]}'), 'w').close()\n"
        f"while attempt == '0' and not os.path.exists({str(marker)!r}): time.sleep(0.02)\n"
        "sys.exit(3 if attempt == '0' and os.environ['RANK'] == '1' else 0)\n")
    launcher = start_launcher("--nproc_per_node", 2, "--max_restarts", 1, script)
    try:
        wait_for(lambda: len(list(tmp_path.glob("ran.0.*"))) == 2, what="the first attempt")
        wait_for(lambda: len(spares_of(launcher.pid)) == 2, what="the spares")
        for spare in spares_of(launcher.pid):
            spare.send_signal(signal.SIGKILL)
        marker.touch()
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, err
    assert sorted(p.name for p in tmp_path.glob("ran.*")) == ["ran.0.0", "ran.0.1", "ran.1.0", "ran.1.1"]
