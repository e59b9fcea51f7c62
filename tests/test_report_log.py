"""--report_log's file (launcher.output.report_log): a line per worker's new report, at most one per EVERY seconds,
the last ones written at the close; a write that fails is one warning and the job goes on."""

import json

from launcher.cli.main import request_of
from launcher.errors import LaunchError
from launcher.output.report_log import EVERY, ReportLog, path_for

import pytest


def report(step, samples=None):
    return {"step": step, "t": 100.0 + step, "scalars": {} if samples is None else {"samples": samples}, "compute": None}


def lines(tmp_path):
    return [json.loads(line) for line in open(path_for(str(tmp_path), 0))]


def test_a_line_per_worker_at_most_every_interval_and_the_last_at_the_close(tmp_path):
    log = ReportLog(str(tmp_path), 0)
    log.note(0, report(1), now=10.0)
    log.note(1, report(1, 32), now=10.0)
    log.note(0, report(2), now=10.0 + EVERY / 2)  # held back
    log.flush(10.0 + EVERY / 2)
    assert [(x["rank"], x["step"]) for x in lines(tmp_path)] == [(0, 1), (1, 1)]
    log.note(0, report(3), now=10.0 + EVERY / 2)  # replaces the one held back
    log.close(10.0 + EVERY / 2)
    got = lines(tmp_path)
    assert got[-1] == {"rank": 0, "world": None, **report(3)} and len(got) == 3 and got[1]["scalars"] == {"samples": 32}


def test_a_folder_that_cannot_be_written_is_one_warning(tmp_path, caplog):
    log = ReportLog(str(tmp_path / "gone"), 0)
    log.note(0, report(1), now=1.0)
    log.note(0, report(2), now=2.0)
    log.close(3.0)
    assert sum("cannot write the reports" in r.getMessage() for r in caplog.records) == 1


def test_report_log_needs_a_log_dir():
    from launcher.plan.common import check_run_options

    with pytest.raises(LaunchError, match="--report_log keeps the reports in the log dir; give --log_dir DIR too"):
        check_run_options(request_of(["--report_log", "t.py"]).options)
