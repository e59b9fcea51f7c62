"""Restarts on one node: a restarted worker is run by a spare interpreter started ahead, and must
see exactly what a freshly started one sees."""

import ast
import json
import os
import re
import shutil
import signal

import psutil
import pytest

from conftest import WORKERS, run_launcher, spares_of, release_stubborn, start_launcher, start_stubborn, wait_for

INTROSPECT = str(WORKERS / "introspect.py")
TWIN = WORKERS / "twin.py"


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


# ---------------------------------------------------------------- a restart is a fresh start


def twin_case(tmp_path, how):
    """(launcher arguments, extra environment, cwd) running twin.py ``how``: by its absolute path,
    a relative one, a symlink in another folder, or as a module. Next to the real script lie a
    json.py that must shadow the standard one and a sibling.py it imports; for a module, instead of
the json.py, a sitecustomize.py that must run, and see the worker's environment."""
    real = tmp_path / "real"
    real.mkdir()
    shutil.copy(TWIN, real / "twin.py")
    (real / "json.py").write_text("LOCAL = True\n")
    (real / "sibling.py").write_text("WHERE = 'real'\n")
    records = tmp_path / "records"
    records.mkdir()
    if how == "symlink":
        (tmp_path / "links").mkdir()
        (tmp_path / "links" / "twin.py").symlink_to(os.path.join("..", "real", "twin.py"))
        return ["links/twin.py", records], {}, tmp_path
    if how == "module":  # a json.py on PYTHONPATH would shadow the launcher's own too
        (real / "json.py").unlink()
        (real / "sitecustomize.py").write_text(
            "import builtins, os\nbuiltins.SITE_SAW = os.environ.get('TORCHELASTIC_RESTART_COUNT')\n")
        return ["-m", "twin", records], {"PYTHONPATH": str(real)}, tmp_path
    return ([str(real / "twin.py")] if how == "absolute" else ["real/twin.py"]) + [records], {}, tmp_path


def traceback_of(log, attempt):
    """The traceback attempt ``attempt`` left in its log section."""
    section = log.split("===== ")[attempt + 1]
    return section[section.index("Traceback"):section.index(f"RuntimeError: attempt {attempt} fails")]


@pytest.mark.parametrize("how", ["absolute", "relative", "symlink", "module"])
def test_a_restarted_worker_cannot_tell_it_ran_in_a_spare(tmp_path, how):
    args, env, cwd = twin_case(tmp_path, how)
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]))}
    r = run_launcher("--nproc_per_node", 1, "--max_restarts", 1, "--log_dir", tmp_path / "logs", *args, env=env, cwd=cwd)
    assert r.returncode == 1, r.stderr
    folder = tmp_path / "records"
    fresh, again = (ast.literal_eval((folder / f"{n}.rec").read_text()) for n in (0, 1))
    assert again["started_ticks"] < fresh["now_ticks"]  # attempt 2's process was there before attempt 1 ran: a spare
    assert again["restart"] == ("1", "1") and fresh["restart"] == ("0", "0")
    assert {k: v for k, v in again["env"].items() if "RESTART_COUNT" not in k} == \
        {k: v for k, v in fresh["env"].items() if "RESTART_COUNT" not in k}
    assert (fresh["site_saw"], again["site_saw"]) == (("0", "1") if how == "module" else (None, None))
    for key in sorted(set(fresh) - {"env", "restart", "site_saw", "started_ticks", "now_ticks"}):
        assert again[key] == fresh[key], key
    assert fresh["json_is_local"] == (how != "module") and not fresh["json_loaded"] and fresh["builtins"] == "module"
    assert fresh["cmdline"].split(b"\0")[1:-2] == [b"-u", *map(os.fsencode, args[:-1])]
    if how == "symlink":
        assert fresh["sibling"] == "real"
    assert sorted(p.name for p in folder.glob("*.pickle")) == ["0.atexit.pickle", "0.thread.pickle",
                                                                "1.atexit.pickle", "1.thread.pickle"]
    log = (tmp_path / "logs" / "workerlog.0").read_text()
    assert traceback_of(log, 1) == traceback_of(log, 0)
    assert len(re.findall(r'^  File "', traceback_of(log, 0), re.M)) == (4 if how == "module" else 2)


def test_spares_do_not_outlive_a_launcher_killed_with_sigkill(tmp_path):
    """They wait outside the job's cgroup: their end comes from the launcher's death itself."""
    launcher, spares = start_stubborn(tmp_path)
    try:
        launcher.kill()
        launcher.communicate(timeout=30)
        wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in spares), timeout=10,
                 what="the spares to go")
    finally:
        (tmp_path / "go").touch()
        for p in spares:
            if p.is_running():
                p.kill()


def test_a_spare_whose_log_file_was_replaced_is_not_used(tmp_path):
    """Its output would go to the old file: the worker is started afresh, into the new one."""
    logs_dir = tmp_path / "logs"
    launcher, _ = start_stubborn(tmp_path, "--log_dir", logs_dir)
    (logs_dir / "workerlog.1").unlink()
    err = release_stubborn(launcher, tmp_path)
    assert launcher.returncode == 0, err
    for rank in (0, 1):
        assert f"attempt 1 rank {rank} here" in (logs_dir / f"workerlog.{rank}").read_text()
