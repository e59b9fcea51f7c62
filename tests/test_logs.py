"""Output pieces: line cutting, prefixes, the plan table, failure summaries."""

import dataclasses
import json
import os
import time

from launcher import logs
from launcher.plan import HostFacts, LaunchOptions, make_plan
from launcher.supervisor import Failure, exit_code


def test_line_buffer_keeps_the_unfinished_line_for_later():
    b = logs.LineBuffer()
    assert b.feed(b"ab") == b""
    assert b.feed(b"c\nde") == b"abc\n"
    assert b.feed(b"f\ng\nh") == b"def\ng\n"
    assert b.rest() == b"h\n" and b.rest() == b""


def test_an_endless_line_is_not_held_forever(monkeypatch):
    monkeypatch.setattr(logs, "MAX_PARTIAL_LINE", 10)
    b = logs.LineBuffer()
    assert b.feed(b"x" * 11) == b"x" * 11 + b"\n"


def test_prefix_goes_before_every_line():
    assert logs.prefixed(b"[rank 1] ", b"a\nb\n") == b"[rank 1] a\n[rank 1] b\n"


def test_plan_table_lists_every_local_worker():
    plan = make_plan(LaunchOptions("train.py", nproc_per_node=3, log_dir="mylog"), {},
                     HostFacts(gpu_count=None, cpu_count=4), lambda ip, n: [7000, 7001, 7002])
    table = logs.format_plan(plan)
    assert "3 CPU worker(s) here, world size 3" in table
    assert "127.0.0.1:7002" in table and "mylog/workerlog.2" in table


def test_failure_summary_names_rank_code_time_log_and_last_lines():
    f = Failure(rank=3, local_rank=1, pid=42, returncode=-9, run_time=2.5, log_file="mylog/workerlog.3",
                last_lines=("loss=nan", "Killed"))
    text = logs.format_failure(f)
    assert "rank 3 (local rank 1, pid 42) failed: killed by SIGKILL after 2.5 s; log: mylog/workerlog.3" in text
    assert "  | Killed" in text
    assert exit_code(-9) == 137 and exit_code(7) == 7


def test_last_lines_are_never_cut_at_the_start(monkeypatch):
    monkeypatch.setattr(logs, "TAIL_BYTES", 10)
    assert logs._last_lines(b"first line\nabc\ndef\n", 5) == ["abc", "def"]
    assert logs._last_lines(b"a\nb\n", 1) == ["b"]
    assert logs._last_lines(b"rt line\nwhole\n", 5, cut=True) == ["whole"]


def test_two_descriptors_of_one_file_share_one_console_buffer():
    """stdout and stderr on one pipe (2>&1 | tee): one buffer, so no write lands inside a line."""
    r, w = os.pipe()
    other_r, other_w = os.pipe()
    twin = os.dup(w)
    c = logs.Console()
    try:
        assert c.stream(w) is c.stream(twin)
        assert c.stream(other_w) is not c.stream(w)
    finally:
        c.reset()
        for fd in (r, w, other_r, other_w, twin):
            os.close(fd)


def test_what_a_pipe_still_holds_is_read_without_waiting_for_its_writer():
    r, w = os.pipe()
    try:
        os.write(w, b"last line\n")
        started = time.monotonic()
        assert logs._left_in(r) == b"last line\n"  # the write end is still open
        assert logs._left_in(r) == b""
        assert time.monotonic() - started < 1
    finally:
        os.close(r)
        os.close(w)


def test_an_endless_line_is_cut_into_bounded_pieces(monkeypatch):
    monkeypatch.setattr(logs, "MAX_PARTIAL_LINE", 10)
    b = logs.LineBuffer()
    out = b"".join(b.feed(b"y" * 4) for _ in range(10)) + b.feed(b"\n") + b.rest()
    pieces = out.split(b"\n")[:-1]
    assert b"".join(pieces) == b"y" * 40 and all(0 < len(p) <= 10 + 4 for p in pieces)


def test_failure_summary_shows_the_workers_record_as_root_cause():
    record = {"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback (x)\nValueError: boom\n"}}}
    f = Failure(rank=1, local_rank=1, pid=42, returncode=1, run_time=2.5, log_file=None, last_lines=("RuntimeError: peer",),
                error=record)
    text = logs.format_failure(f)
    assert "root cause, as rank 1's @record wrote it (TORCHELASTIC_ERROR_FILE):\n  | Traceback (x)\n  | ValueError: boom" in text
    assert "root cause" not in logs.format_failure(dataclasses.replace(f, error=None))
    assert "  | plain text" in logs.format_failure(dataclasses.replace(f, error={"message": "plain text"}))


def test_a_huge_recorded_traceback_is_bounded_in_the_summary_and_for_the_other_nodes():
    from launcher import control, error_file, policy

    stack = "Traceback\n" + "  File x, line 1, in f\n" * 20000 + "RecursionError: deep\n"
    record = {"message": {"message": "RecursionError: deep", "extraInfo": {"py_callstack": stack}}}
    f = Failure(rank=0, local_rank=0, pid=1, returncode=1, run_time=1.0, log_file=None, last_lines=(), error=record)
    summary = logs.format_failure(f)
    assert summary.count("\n") < 50 and summary.endswith("  | RecursionError: deep")
    cause = policy.Cause(0, "worker", 1, "rank 0 failed", summary, json.dumps(error_file.bounded(record)))
    assert len(control.encode(cause.as_dict())) < control.MAX_MESSAGE
    assert error_file.loads(cause.error)["message"]["extraInfo"]["py_callstack"].endswith("RecursionError: deep\n")
