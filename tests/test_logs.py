"""Output pieces: line cutting, prefixes, the plan table, failure summaries."""

import dataclasses
import json
import os

import pytest

from launcher.output import console
from launcher.output import console_stream
from launcher.output import lines
from launcher.output import log_files
from launcher.output import reports
from launcher.output import sinks
from launcher.plan.model import HostFacts, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.run.workers import Failure
from launcher.plan.policy import shell_code as exit_code


def test_line_buffer_keeps_the_unfinished_line_for_later():
    b = lines.LineBuffer()
    assert b.feed(b"ab") == b""
    assert b.feed(b"c\nde") == b"abc\n"
    assert b.feed(b"f\ng\nh") == b"def\ng\n"
    assert b.rest() == b"h\n" and b.rest() == b""


def test_take_gives_a_files_whole_lines_without_a_copy_and_leaves_the_rest_to_read_again():
    b = lines.LineBuffer()
    data = b"one\ntwo\nthr"
    got, again = b.take(data)
    assert bytes(got) == b"one\ntwo\n" and again == 3 and isinstance(got, memoryview) and got.obj is data
    whole = b"three\n"
    got, again = b.take(whole)
    assert bytes(got) == whole and again == 0 and got.obj is whole
    chunk = bytearray(b"a\nb\nc\n" + b"\0" * 10)  # a buffer read into: only its first 5 bytes are news
    got, again = b.take(chunk, 5)
    assert bytes(got) == b"a\nb\n" and again == 1 and got.obj is chunk
    # no newline, a redrawn line, or an unfinished line kept from before: as feed does
    assert b.take(b"par") == (b"", 0) and b.partial == b"par"
    assert b.take(b"tial\nx\n") == (b"partial\nx\n", 0)
    assert b.take(b"\rstep 1\rstep 2\nz") == (b"step 2\n", 0) and b.partial == b"z"


def test_an_endless_line_is_not_held_forever(monkeypatch):
    monkeypatch.setattr(lines, "MAX_PARTIAL_LINE", 10)
    b = lines.LineBuffer()
    assert b.feed(b"x" * 11) == b"x" * 11 + b"\n"


def test_prefix_goes_before_every_line():
    assert lines.prefixed(b"[rank 1] ", b"a\nb\n") == b"[rank 1] a\n[rank 1] b\n"


def test_plan_table_lists_every_local_worker():
    plan = make_plan(LaunchOptions("train.py", nproc_per_node=3, log_dir="mylog"), {},
                     HostFacts(gpu_count=None, cpu_count=4), lambda ip, n: [7000, 7001, 7002])
    table = reports.format_plan(plan)
    assert "3 CPU worker(s) here, world size 3" in table
    assert "127.0.0.1:7002" in table and "mylog/workerlog.2" in table


def test_failure_summary_names_rank_code_time_log_and_last_lines():
    f = Failure(rank=3, local_rank=1, pid=42, returncode=-9, run_time=2.5, log_file="mylog/workerlog.3",
                last_lines=("loss=nan", "Killed"))
    text = reports.format_failure(f)
    assert "rank 3 (local rank 1, pid 42) failed: killed by SIGKILL after 2.5 s; log: mylog/workerlog.3" in text
    assert "  | Killed" in text
    assert exit_code(-9) == 137 and exit_code(7) == 7


def test_last_lines_are_never_cut_at_the_start(monkeypatch):
    monkeypatch.setattr(lines, "TAIL_BYTES", 10)
    assert lines.last_lines_of(b"first line\nabc\ndef\n", 5) == ["abc", "def"]
    assert lines.last_lines_of(b"a\nb\n", 1) == ["b"]
    assert lines.last_lines_of(b"rt line\nwhole\n", 5, cut=True) == ["whole"]


def test_a_removed_log_file_has_no_last_lines(tmp_path):
    """A log removed while its worker ran (a clean-up, a rotation) must not break the failure summary."""
    path = str(tmp_path / "workerlog.0")
    out = sinks.FileOutput(path, log_files.open_log(path, str(tmp_path), "rank 0", ("python", "x.py")), echo=False)
    os.write(out.child_fds()[0], b"a line\n")
    out.spawned()
    assert out.last_lines() == ["a line"]
    os.remove(path)
    assert out.last_lines() == []


def test_two_descriptors_of_one_file_share_one_console_buffer():
    """stdout and stderr on one pipe (2>&1 | tee): one buffer, so no write lands inside a line."""
    r, w = os.pipe()
    other_r, other_w = os.pipe()
    twin = os.dup(w)
    c = console.Console()
    try:
        assert c.stream(w) is c.stream(twin)
        assert c.stream(other_w) is not c.stream(w)
    finally:
        c.reset()
        for fd in (r, w, other_r, other_w, twin):
            os.close(fd)


def test_what_a_pipe_still_holds_is_read_without_waiting_for_its_writer():
    import threading

    r, w = os.pipe()
    try:
        os.write(w, b"last line\n")
        got = []  # the write end is still open: a read that waited for its writer would never return
        reader = threading.Thread(target=lambda: got.extend([sinks.left_in(r), sinks.left_in(r)]), daemon=True)
        reader.start()
        reader.join(120)  # a hang guard
        assert not reader.is_alive(), "left_in waits for the pipe's writer"
        assert got == [b"last line\n", b""]
    finally:
        os.close(r)
        os.close(w)


def test_an_endless_line_is_cut_into_bounded_pieces(monkeypatch):
    monkeypatch.setattr(lines, "MAX_PARTIAL_LINE", 10)
    b = lines.LineBuffer()
    out = b"".join(b.feed(b"y" * 4) for _ in range(10)) + b.feed(b"\n") + b.rest()
    pieces = out.split(b"\n")[:-1]
    assert b"".join(pieces) == b"y" * 40 and all(0 < len(p) <= 10 + 4 for p in pieces)


def test_a_stream_that_cannot_be_written_any_more_is_dropped_once_without_an_error():
    """A pipe whose reader went away (| head): no exception (BufferError once came from here), the
    output is dropped, and its owner is told once."""
    r, w = os.pipe()
    os.close(r)
    lost = []
    s = console_stream.Stream(w, lambda stream, e: lost.append(e.errno))
    try:
        s.pending += b"x" * 100_000
        s.push()
        assert s.closed and not s.pending and not s.waiting
        s.push()
        assert lost == [32]  # EPIPE, once
    finally:
        os.close(w)
        if s.owned:
            os.close(s.out)


def test_a_line_redrawn_in_place_is_its_last_state_and_only_that_is_kept():
    b = lines.LineBuffer()
    assert b.feed(b"\rstep 1/3") == b"" and b.progress() == b"step 1/3"
    assert b.feed(b"\rstep 2/3" * 100_000) == b"" and b.progress() == b"step 2/3"
    assert len(b.partial) < 20  # the states before the last one are not kept
    assert b.feed(b"\rstep 3/3\nnext\n") == b"step 3/3\nnext\n" and b.progress() is None
    assert b.feed(b"print end='\\r' style\r") == b"" and b.progress() == b"print end='\\r' style"
    assert b.feed(b"done\n") == b"done\n"
    assert b.feed(b"crlf line\r\n") == b"crlf line\r\n"  # a line ending in \r\n is left as it is
    assert b.feed(b"plain partial") == b"" and b.progress() is None
    assert b.rest() == b"plain partial\n"
    b.feed(b"\r10%\r20%")
    assert b.rest() == b"20%\n"


def test_a_live_line_is_cut_to_the_terminal_width_counting_what_shows():
    assert console_stream.fit(b"x" * 100, 0) == b"x" * 100  # no width known
    assert console_stream.fit(b"x" * 100, 40) == b"x" * 39
    assert console_stream.fit("\u2588".encode() * 50, 40) == "\u2588".encode() * 39  # 3 bytes, one column each
    assert console_stream.fit("\u4e2d".encode() * 50, 40) == "\u4e2d".encode() * 19  # two columns each
    assert console_stream.fit(b"\x1b[32m" + b"y" * 50, 11) == b"\x1b[32m" + b"y" * 10  # colour takes no column


class FakeTerminal:
    """A pipe that the Console takes for a terminal."""

    def __init__(self):
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)

    def read(self) -> bytes:
        try:
            return os.read(self.r, 1 << 20)
        except BlockingIOError:
            return b""


@pytest.fixture
def terminal(monkeypatch):
    """(a FakeTerminal, a Console that takes it for a terminal); both closed after the test."""
    term = FakeTerminal()
    monkeypatch.setattr(console_stream.os, "isatty", lambda fd: fd == term.w)
    c = console.Console()
    yield term, c
    c.reset()
    os.close(term.r)
    os.close(term.w)


def test_on_a_terminal_other_lines_erase_the_live_line_and_draw_it_again_below(terminal):
    term, c = terminal
    bar, other = object(), object()
    c.draw(term.w, bar, b"[rank 0] step 1/3")
    assert term.read() == b"\r[rank 0] step 1/3\x1b[K"
    c.write(term.w, b"[rank 1] a line\n", other)
    assert term.read() == b"\r\x1b[K[rank 1] a line\n\r[rank 0] step 1/3\x1b[K"
    c.draw(term.w, other, b"[rank 1] step 1/9")  # one live line: another rank's bar takes it over
    assert term.read() == b"\r[rank 1] step 1/9\x1b[K"
    c.draw(term.w, bar, b"[rank 0] step 2/3")
    assert term.read() == b"\r[rank 0] step 2/3\x1b[K"
    c.write(term.w, b"[rank 0] step 3/3\n", bar)  # the bar's own line ends it
    assert term.read() == b"\r\x1b[K[rank 0] step 3/3\n"
    c.write(term.w, b"launcher: done\n")
    assert term.read() == b"launcher: done\n"


def test_not_on_a_terminal_nothing_is_drawn():
    r, w = os.pipe()
    c = console.Console()
    try:
        c.draw(w, object(), b"step 1/3")
        c.write(w, b"line\n")
        assert os.read(r, 100) == b"line\n"
    finally:
        c.reset()
        os.close(r)
        os.close(w)


def test_a_terminal_that_does_not_take_output_holds_one_bar_state_not_every_one(terminal):
    """Ctrl-S, or a slow terminal: states drawn meanwhile are not queued; the latest is drawn once it takes output again."""
    term, c = terminal
    os.set_blocking(term.w, False)
    try:
        while True:
            os.write(term.w, b"f" * 65536)
    except BlockingIOError:
        pass
    bar = object()
    for k in range(1000):
        c.draw(term.w, bar, b"step %d/1000" % k)
    assert len(c.stream(term.w).pending) < 100
    while term.read():
        pass
    c.stream(term.w).push()
    assert term.read() == b"\rstep 0/1000\x1b[K\rstep 999/1000\x1b[K"


def test_a_bar_still_drawn_at_the_end_is_left_on_a_line_of_its_own(terminal):
    term, c = terminal
    c.draw(term.w, object(), b"step 1/3")
    c.write(term.w, b"launcher: error: internal error\n")
    term.read()
    c.finish()
    assert term.read() == b"\n"


def test_failure_summary_shows_the_workers_record_as_root_cause():
    record = {"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback (x)\nValueError: boom\n"}}}
    f = Failure(rank=1, local_rank=1, pid=42, returncode=1, run_time=2.5, log_file=None, last_lines=("RuntimeError: peer",),
                error=record)
    text = reports.format_failure(f)
    assert "root cause, as rank 1's @record wrote it (TORCHELASTIC_ERROR_FILE):\n  | Traceback (x)\n  | ValueError: boom" in text
    assert "root cause" not in reports.format_failure(dataclasses.replace(f, error=None))
    assert "  | plain text" in reports.format_failure(dataclasses.replace(f, error={"message": "plain text"}))


def test_a_huge_recorded_traceback_is_bounded_in_the_summary_and_for_the_other_nodes():
    from launcher.nodes.transport.wire import encode, MAX_MESSAGE
    from launcher.output import error_file
    from launcher.plan import policy

    stack = "Traceback\n" + "  File x, line 1, in f\n" * 20000 + "RecursionError: deep\n"
    record = {"message": {"message": "RecursionError: deep", "extraInfo": {"py_callstack": stack}}}
    f = Failure(rank=0, local_rank=0, pid=1, returncode=1, run_time=1.0, log_file=None, last_lines=(), error=record)
    summary = reports.format_failure(f)
    assert summary.count("\n") < 50 and summary.endswith("  | RecursionError: deep")
    cause = policy.Cause(0, "worker", 1, "rank 0 failed", summary, json.dumps(error_file.bounded(record)))
    assert len(encode(cause.as_dict())) < MAX_MESSAGE
    assert error_file.loads(cause.error)["message"]["extraInfo"]["py_callstack"].endswith("RecursionError: deep\n")
