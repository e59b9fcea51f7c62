"""What torchrun gives a worker, given by this launcher too: every variable, @record's error files, PYTHON_EXEC."""

import json
import os
import sys

from conftest import WORKERS, read_dumps, run_launcher


def test_every_torchrun_variable_and_torch_sees_a_torchelastic_launch(tmp_path):
    r = run_launcher("--agent_store", "off", "--print_config", "false", "--nproc_per_node", 2, "--max_restarts", 1,
                     WORKERS / "torchrun_env.py", tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(tmp_path, 2)
    for rank, d in dumps.items():
        assert d["is_torchelastic_launched"] is True
        assert (d["ROLE_RANK"], d["ROLE_WORLD_SIZE"], d["ROLE_NAME"]) == (str(rank), "2", "default")
        assert (d["TORCHELASTIC_RESTART_COUNT"], d["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "1")
        assert d["TORCHELASTIC_USE_AGENT_STORE"] == "False" and d["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert d["TORCHELASTIC_ERROR_FILE"].endswith(f"error.{rank}.json")
    assert dumps[0]["TORCHELASTIC_RUN_ID"] == dumps[1]["TORCHELASTIC_RUN_ID"]
    assert not os.path.exists(os.path.dirname(dumps[0]["TORCHELASTIC_ERROR_FILE"]))  # removed at the end


def test_a_recorded_exception_is_the_root_cause_and_goes_to_the_given_error_file(tmp_path):
    given = tmp_path / "scheduler_error.json"
    r = run_launcher("--print_config", "false", "--nproc_per_node", 2, WORKERS / "record_fail.py",
                     env={"TORCHELASTIC_ERROR_FILE": str(given)}, timeout=120)
    assert r.returncode == 1, r.stderr
    summary = r.stderr[r.stderr.index("launcher: rank 1 (local rank 1"):]
    assert "root cause, as rank 1's @record wrote it (TORCHELASTIC_ERROR_FILE):" in summary
    assert "  | ValueError: rank 1 raised this on purpose" in summary
    message = json.loads(given.read_text())["message"]  # rank 0's "Connection closed by peer" does not overwrite it
    assert message["message"] == "ValueError: rank 1 raised this on purpose" and message["errorCode"] == 1
    assert "record_fail.py" in message["extraInfo"]["py_callstack"]


def test_a_failure_without_record_is_still_written_to_the_given_error_file(tmp_path):
    given = tmp_path / "scheduler_error.json"
    r = run_launcher("--print_config", "false", "--nproc_per_node", 2, WORKERS / "probe.py", "--fail-rank", 0,
                     "--code", 7, "--sleep", 30, env={"TORCHELASTIC_ERROR_FILE": str(given)}, timeout=60)
    assert r.returncode == 7, r.stderr
    message = json.loads(given.read_text())["message"]
    assert message["message"] == "rank 0 failed (exit code 7)" and message["errorCode"] == 7


def test_python_exec_runs_the_workers(tmp_path):
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\nPYTHON_EXEC_MARKER=wrapped exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    r = run_launcher("--print_config", "false", "--nproc_per_node", 1, WORKERS / "torchrun_env.py", tmp_path,
                     env={"PYTHON_EXEC": str(wrapper)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert read_dumps(tmp_path, 1)[0]["marker"] == "wrapped"


def test_pythons_own_resource_tracker_is_not_reported_as_left_running():
    for _ in range(3):  # it lingers in most runs: 3 of 3 printed the warning before
        r = run_launcher("--nproc_per_node", 2, WORKERS / "spawn_pool.py", timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("sum 285") == 2
        assert "left running" not in r.stderr


def test_an_earlier_attempts_record_is_not_taken_for_a_later_failure(tmp_path):
    given = tmp_path / "scheduler_error.json"
    r = run_launcher("--print_config", "false", "--nproc_per_node", 1, "--max_restarts", 1,
                     WORKERS / "record_then_exit.py", env={"TORCHELASTIC_ERROR_FILE": str(given)}, timeout=120)
    assert r.returncode == 3, r.stderr
    final = r.stderr[r.stderr.rindex("launcher: rank 0 (local rank 0"):]
    assert "exit code 3" in final and "attempt 0 raised this" not in final
    assert json.loads(given.read_text())["message"]["message"] == "rank 0 failed (exit code 3)"
