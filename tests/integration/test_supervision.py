"""Exit codes, failures, signals and teardown, with real worker processes."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import PROBE, REPO, assert_all_gone, pids_of, read_dumps, read_until, run_launcher, start_launcher


def test_all_workers_succeed_exit_zero(tmp_path):
    r = run_launcher("--nproc_per_node", 3, PROBE, "--dump", tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(read_dumps(tmp_path, 3)) == 3
    assert "all 3 worker(s) finished" in r.stderr


def test_failing_worker_code_is_returned_and_the_others_stopped(tmp_path):
    r = run_launcher("--nproc_per_node", 3, "--log_dir", tmp_path / "log", PROBE, "--dump", tmp_path,
                     "--fail-rank", 1, "--code", 7, "--delay", 0.5, "--sleep", 60, "--child", timeout=180)
    assert r.returncode == 7
    for rank in (0, 2):  # the sleepers (60 s) were stopped, not waited for: they never said they were done
        log = (tmp_path / "log" / f"workerlog.{rank}").read_text()
        assert f"worker rank {rank} up" in log and f"worker rank {rank} done" not in log, log
    assert "rank 1 (local rank 1, pid" in r.stderr and "failed: exit code 7" in r.stderr
    assert f"log: {tmp_path / 'log' / 'workerlog.1'}" in r.stderr
    assert "| rank 1 is about to fail with 7" in r.stderr
    assert_all_gone(pids_of(read_dumps(tmp_path, 3)))


def test_failure_without_log_dir_shows_the_last_lines_from_the_console(tmp_path):
    r = run_launcher("--nproc_per_node", 2, PROBE, "--fail-rank", 0, "--code", 3, "--sleep", 60)
    assert r.returncode == 3
    assert "log: console (no --log_dir)" in r.stderr
    assert "| rank 0 is about to fail with 3" in r.stderr


def test_worker_killed_by_a_signal_gives_128_plus_n(tmp_path):
    r = run_launcher("--nproc_per_node", 2, PROBE, "--fail-rank", 1, "--kill-self", "--sleep", 60)
    assert r.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in r.stderr


def test_teardown_is_fast_when_workers_exit_on_sigterm(tmp_path):
    # the failing rank records when it exits; the others sleep and die on SIGTERM
    launcher = start_launcher("--nproc_per_node", 3, PROBE, "--dump", tmp_path, "--fail-rank", 2,
                              "--code", 5, "--delay", 1.0, "--sleep", 60)
    launcher.communicate(timeout=30)
    assert launcher.returncode == 5
    assert_all_gone(pids_of(read_dumps(tmp_path, 3)), timeout=2)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_stopping_signals_are_passed_on_then_the_job_stops(tmp_path, sig):
    launcher = start_launcher("--nproc_per_node", 2, PROBE, "--dump", tmp_path, "--signals", tmp_path,
                              "--sleep", 60, "--child")
    dumps = read_dumps(tmp_path, 2)
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + sig, err
    for rank in (0, 1):
        assert (tmp_path / f"signal.{rank}.{sig.name}").exists()
    assert f"received {sig.name}" in err
    assert_all_gone(pids_of(dumps))


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_user_signals_are_passed_on_and_change_nothing_else(tmp_path, sig):
    launcher = start_launcher("--nproc_per_node", 2, PROBE, "--dump", tmp_path, "--signals", tmp_path, "--sleep", 2)
    read_dumps(tmp_path, 2)
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 0, err
    for rank in (0, 1):
        assert (tmp_path / f"signal.{rank}.{sig.name}").exists()


def test_worker_ignoring_sigterm_is_killed_after_the_shutdown_timeout(tmp_path):
    r = run_launcher("--nproc_per_node", 2, "--shutdown_timeout", 0.5, PROBE, "--dump", tmp_path,
                     "--ignore-term", "--fail-rank", 0, "--code", 9, "--delay", 0.5, "--sleep", 60, timeout=180)
    assert r.returncode == 9
    assert "sending SIGKILL" in r.stderr
    # killed, not waited for: rank 1 (it sleeps 60 s, then says it is done) never got to its end
    output = r.stdout + r.stderr
    assert "worker rank 1 up" in output and "worker rank 1 done" not in output, output
    assert_all_gone(pids_of(read_dumps(tmp_path, 2)))


def test_second_sigint_kills_at_once(tmp_path):
    launcher = start_launcher("--nproc_per_node", 2, "--shutdown_timeout", 60, PROBE, "--dump", tmp_path,
                              "--ignore-term", "--sleep", 60)
    dumps = read_dumps(tmp_path, 2)
    launcher.send_signal(signal.SIGTERM)
    read_until(launcher, "received SIGTERM")
    launcher.send_signal(signal.SIGINT)
    launcher.communicate(timeout=15)
    assert launcher.returncode == 128 + signal.SIGTERM
    assert_all_gone(pids_of(dumps), timeout=2)


def test_nothing_outlives_a_launcher_killed_with_sigkill(tmp_path):
    launcher = start_launcher("--nproc_per_node", 2, "--shutdown_timeout", 1, PROBE, "--dump", tmp_path,
                              "--sleep", 120, "--child")
    dumps = read_dumps(tmp_path, 2)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.communicate(timeout=10)
    assert_all_gone(pids_of(dumps), timeout=10)


def test_processes_that_left_the_group_are_stopped_after_kill_9(tmp_path):
    launcher = start_launcher("--nproc_per_node", 2, "--shutdown_timeout", 1, PROBE, "--dump", tmp_path,
                              "--sleep", 120, "--setsid-child")
    dumps = read_dumps(tmp_path, 2)
    children = [c for d in dumps.values() for c in d["children"]]
    assert all(os.getpgid(c) != d["pgid"] for d in dumps.values() for c in d["children"])
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.communicate(timeout=10)
    assert_all_gone(pids_of(dumps) + children, timeout=10)


def test_leftover_processes_are_stopped_when_workers_finish(tmp_path):
    r = run_launcher("--nproc_per_node", 2, "--shutdown_timeout", 2, PROBE, "--dump", tmp_path, "--setsid-child")
    assert r.returncode == 0, r.stderr
    assert "left running" in r.stderr
    assert_all_gone(pids_of(read_dumps(tmp_path, 2)), timeout=1)


INJECT = """
import sys
from launcher.cli import main as cli
from launcher.plan import policy
decide = policy.decide
def broken(state, event, now):
    if isinstance(event, policy.WorkerExited):
        raise RuntimeError("injected fault")
    return decide(state, event, now)
policy.decide = broken
sys.argv[0] = "launcher"
cli.main(sys.argv[1:])
"""


def test_internal_error_exits_1_and_stops_the_workers(tmp_path):
    cmd = [sys.executable, "-c", INJECT, "--nproc_per_node", "2", "--shutdown_timeout", "2", PROBE,
           "--dump", str(tmp_path), "--fail-rank", "0", "--delay", "0.3", "--sleep", "60", "--child"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 1
    assert "injected fault" in r.stderr and "internal error of the launcher" in r.stderr
    assert_all_gone(pids_of(read_dumps(tmp_path, 2)), timeout=2)


def _ignoring(*sigs):
    def setup():
        for sig in sigs:
            signal.signal(sig, signal.SIG_IGN)
    return setup


def _ignored_by(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)


def test_under_nohup_a_hangup_stops_nothing_and_the_workers_ignore_it_too(tmp_path):
    """`nohup python -m launcher train.py &`: the terminal's hangup reaches the launcher, which keeps
    SIGHUP (and a background job's SIGINT) ignored as it found them, like any program."""
    launcher = start_launcher("--nproc_per_node", 2, PROBE, "--dump", tmp_path, "--sleep", 3,
                              preexec_fn=_ignoring(signal.SIGHUP, signal.SIGINT))
    dumps = read_dumps(tmp_path, 2)
    for record in dumps.values():
        mask = _ignored_by(record["pid"])
        assert mask & (1 << (signal.SIGHUP - 1)) and mask & (1 << (signal.SIGINT - 1)), hex(mask)
    launcher.send_signal(signal.SIGHUP)
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, err
    assert "received" not in err


def test_an_ignored_sigterm_is_still_a_stop(tmp_path):
    """A scheduler stops jobs with SIGTERM: the launcher handles it even where it was ignored."""
    launcher = start_launcher("--nproc_per_node", 1, PROBE, "--dump", tmp_path, "--sleep", 60,
                              preexec_fn=_ignoring(signal.SIGTERM))
    read_dumps(tmp_path, 1)
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signal.SIGTERM, err
