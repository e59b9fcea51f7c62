"""Hangs seen by progress: a worker that reports its steps (launcher.runtime.report) and then makes none for
--hang_timeout is found, however many lines it writes; also in a restarted attempt (whose workers may be spares)."""

import json

from conftest import WORKERS, run_launcher

REPORTER = WORKERS / "reporter.py"


def test_a_rank_that_logs_but_makes_no_step_is_a_hang(tmp_path):
    (tmp_path / "stall.1").touch()
    r = run_launcher("--nproc_per_node", 2, "--hang_timeout", 2, "--log_dir", tmp_path / "logs", REPORTER, tmp_path,
                     timeout=120)
    assert r.returncode == 1, r.stderr
    assert "rank 1 made no progress for 2 s (its last report: step 4) (--hang_timeout): stopping the job" in r.stderr
    assert "step 9" in (tmp_path / "logs" / "workerlog.1").read_text()  # it went on writing lines all along


def test_a_restarted_worker_reports_too(tmp_path):
    """Rank 1 fails in the first attempt; in the second (a spare, woken) it stalls, and is found."""
    (tmp_path / "fail.1").touch()
    (tmp_path / "stall.1").touch()
    r = run_launcher("--nproc_per_node", 2, "--hang_timeout", 2, "--max_restarts", 1, "--log_dir", tmp_path / "logs",
                     REPORTER, tmp_path, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "rank 1 made no progress for 2 s (its last report: step 4)" in r.stderr
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    kinds = [(e["event"], e.get("kind") or e.get("attempt")) for e in events if e["event"] in ("stop", "restart")]
    assert kinds == [("stop", "worker"), ("restart", 1), ("stop", "hang")], kinds


def test_without_hang_timeout_no_page_is_given_and_report_does_nothing(tmp_path):
    (tmp_path / "fail.0").touch()  # ends at step 3
    r = run_launcher("--nproc_per_node", 1, REPORTER, tmp_path, timeout=60)
    assert r.returncode == 3 and (tmp_path / "fd.0").read_text() == "none"
