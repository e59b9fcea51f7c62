"""The console's bounds: what it holds, how long its end waits for a reader, what it drops and how
it says so; on real pipes. Every wait is bounded."""

import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from launcher.output import console
from launcher.output import console_stream
from launcher.output import state_file as state
from launcher.tools import follow as follow_tool
from launcher.tools import logs as log_tool
from launcher.tools import status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = b"%06d " + b"x" * 92 + b"\n"  # 100 bytes


@pytest.fixture
def unread():
    """(a Console, the write end of a pipe nobody reads, already full): closed after the test."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"f" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    c = console.Console()
    yield c, r, w
    c.reset()
    os.close(r)
    os.close(w)


def lines(n: int, start: int = 0) -> bytes:
    return b"".join(LINE % i for i in range(start, start + n))


class FakeTime:
    """The console's clock and its waits for a reader (``console.time``, ``console.select``): a wait for a
    pipe to take output lasts its whole timeout on this clock; ``reader`` (if set) then takes what it takes."""

    def __init__(self):
        self.now = 0.0
        self.reader = None

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def select(self, rlist, wlist, xlist, timeout):
        self.now += timeout
        if self.reader is not None:
            self.reader()
        return [], [], []


@pytest.fixture
def fake_time(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(console, "time", fake)
    monkeypatch.setattr(console, "select", fake)
    return fake


def test_the_end_gives_up_on_a_reader_that_takes_nothing_and_counts_what_it_dropped(unread, fake_time, caplog):
    c, r, w = unread
    c.write(w, lines(1000))
    with caplog.at_level(logging.WARNING, logger="launcher"):
        c.finish(stall=0.3, limit=5.0)
    assert fake_time.now == pytest.approx(0.3)  # the stall, not the limit
    s = c.stream(w)
    assert (s.dropped_lines, s.dropped_bytes, s.pending) == (1000, 100_000, b"")
    assert c.note.startswith("the console dropped 1000 line(s) (0.1 MB) of descriptor ")
    assert [rec.getMessage() for rec in caplog.records] == [c.note]
    ended = fake_time.now
    c.write(w, lines(10))  # after the end: not waited for again, not said again
    c.finish(stall=0.3, limit=5.0)
    assert fake_time.now == ended and s.dropped_lines == 1010 and len(caplog.records) == 1


def test_the_end_waits_while_the_reader_takes_output_but_never_past_its_limit(unread, fake_time):
    c, r, w = unread
    c.write(w, lines(200_000))  # 20 MB, read at 64 KiB a wait of 0.1 s below: it would take 32 s
    fake_time.reader = lambda: os.read(r, 65536)
    c.finish(stall=0.3, limit=1.0)  # the reader never stalls 0.3 s: the limit ends it
    s = c.stream(w)
    assert fake_time.now == pytest.approx(1.0)
    assert 0 < s.dropped_lines < 200_000 and not s.pending


def test_after_abandon_the_end_writes_what_fits_at_once_and_waits_for_nothing(unread):
    c, r, w = unread
    c.write(w, lines(100))
    c.abandon()
    c.finish(stall=5.0, limit=5.0)
    assert c.stream(w).dropped_lines == 100


def test_beyond_hold_the_oldest_whole_lines_go_and_a_line_written_in_part_is_ended(unread, monkeypatch):
    c, r, w = unread
    monkeypatch.setattr(console_stream, "HOLD", 1000)
    s = c.stream(w)
    s.pending += b"rest of a line written in part\n"
    s.mid_line = True
    c.write(w, lines(15))  # 1,531 bytes: at least 531 must go, in whole lines, after the rest
    assert bytes(s.pending) == b"rest of a line written in part\n" + lines(9, start=6)
    assert (s.dropped_lines, s.dropped_bytes) == (6, 600)


def test_a_console_that_takes_everything_drops_nothing_and_says_nothing():
    r, w = os.pipe()
    c = console.Console()
    try:
        c.write(w, lines(10))
        c.finish(stall=0.3, limit=1.0)
        assert os.read(r, 1 << 20) == lines(10) and c.note is None
    finally:
        c.reset()
        os.close(r)
        os.close(w)


def test_what_the_console_dropped_is_kept_in_the_state_file_and_shown_by_status():
    note = "the console dropped 12 line(s) (1200 bytes) of stdout that were not read in time"
    s = state.NodeState(node=0, node_ip="127.0.0.1", nodes=1, host="h", run_id="r", launcher_pid=9, launcher_start=1,
                        attempt=0, max_restarts=0, phase="ended", exit_code=3, started=1e9, updated=1e9, console=note)
    back = state.from_json(state.to_json(s))
    assert back.console == note
    text = status.format_status([back], ["gone"], [[]], 1e9)
    assert text.splitlines()[1] == f"  console: {note}"
    old = json.loads(state.to_json(s))
    del old["console"]  # a file written before the field was known
    assert state.from_json(json.dumps(old).encode()).console is None
    old["console"] = "\x1b[2Jspoofed"  # untrusted: no escape sequence reaches the terminal
    assert state.from_json(json.dumps(old).encode()).console is None


def test_logs_follow_stops_waiting_for_the_reader_once_the_job_has_ended(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"one\ntwo\n")
    s = state.NodeState(node=0, node_ip="127.0.0.1", nodes=1, host=state.this_host(), run_id="r",
                        launcher_pid=os.getpid(), launcher_start=state.process_start(os.getpid()), attempt=0,
                        max_restarts=0, phase="running", exit_code=None, started=1e9, updated=1e9)
    path = tmp_path / "launcher.node0.json"
    path.write_bytes(state.to_json(s))
    shown, waits = [], []

    def wait(seconds):  # a reader who never reads: no room, ever; the job ends after 3 waits
        waits.append(seconds)
        assert len(waits) < 50, "still waiting for a reader after the job's end"
        if len(waits) == 3:
            path.write_bytes(state.to_json(s.__class__(**{**vars(s), "phase": "ended", "exit_code": 0})))

    clock = iter(range(10 ** 6)).__next__
    write = follow_tool.Paced(str(tmp_path), shown.append, lambda: False, wait, clock)
    assert log_tool.show(str(tmp_path), True, None, None, write) is None
    assert b"".join(shown) == b"[rank 0] one\n[rank 0] two\n"


def test_python_s_own_stderr_writes_through_the_console_and_never_blocks(tmp_path):
    """sys.stderr (warnings, logging's last resort, a thread's traceback) into a pipe nobody reads:
    the process still ends at once."""
    code = ("from launcher.output import standard_streams as s; s.open_standard_streams(); import sys\n"
            "for i in range(20000): print('warning', i, 'x' * 100, file=sys.stderr)\n"
            "s.finish_output(); print('ended', flush=True)\n")
    r, w = os.pipe()
    try:
        # a write that waited for the pipe's reader would never return: the timeout (120 s) is a hang guard;
        # how long the end waits for a reader that takes nothing: test_the_end_gives_up_on_a_reader_...
        p = subprocess.run([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=w, timeout=120,
                           env={**os.environ, "PYTHONPATH": REPO})
        assert p.returncode == 0 and p.stdout == b"ended\n"
    finally:
        os.close(r)
        os.close(w)


def test_threads_that_write_at_once_lose_no_line_and_repeat_none():
    """The elastic links log from their own threads while the main loop writes the workers' output
    and pushes: each line reaches the reader once and whole, and no write raises (two threads
    resizing one buffer raised BufferError and wrote a line twice)."""
    r, w = os.pipe()
    c, got, errors = console.Console(), bytearray(), []

    def read():
        while chunk := os.read(r, 512):
            got.extend(chunk)

    def write(who: int):
        try:
            for i in range(2000):
                c.write(w, b"%d %06d %s\n" % (who, i, b"y" * (i % 97)))
                if i % 50 == 0:
                    c.wait(0)
        except Exception as e:  # noqa: BLE001 - the failure the test is for
            errors.append(e)

    reader = threading.Thread(target=read, daemon=True)
    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    try:
        reader.start()
        for t in writers:
            t.start()
        for t in writers:
            t.join(60)
        c.finish(stall=5, limit=30)
    finally:
        c.reset()
        os.close(w)
        reader.join(10)
        os.close(r)
    assert errors == []
    expected = sorted(b"%d %06d %s" % (n, i, b"y" * (i % 97)) for n in range(4) for i in range(2000))
    assert sorted(bytes(got).splitlines()) == expected


def test_a_reader_that_leaves_while_threads_write_is_said_once_and_raises_in_none(caplog):
    """Four threads write more than a pipe holds while its reader goes (``| head``): the stream is dropped,
    one warning says so, and no writer sees an error."""
    r, w = os.pipe()
    c, errors = console.Console(), []

    def write(who: int):
        try:
            for i in range(5000):
                c.write(w, b"%d %06d\n" % (who, i))
        except Exception as e:  # noqa: BLE001 - the failure the test is for
            errors.append(e)

    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    try:
        with caplog.at_level(logging.WARNING, logger="launcher"):
            for t in writers:
                t.start()
            time.sleep(0.01)
            os.close(r)
            for t in writers:
                t.join(30)
            c.stream(w).push()  # the pipe held more than 64 KiB: at least this push meets the closed pipe
    finally:
        c.reset()
        os.close(w)
    assert errors == []
    lost = [rec.getMessage() for rec in caplog.records if "cannot be written any more" in rec.getMessage()]
    assert len(lost) == 1 and "Broken pipe" in lost[0], lost
