"""The event log (launcher.output.event_log) and ``launcher logs --events`` (launcher.tools.events) against what a disk
and a hostile file can do: a full disk, a writer killed mid-line, lines that are not events, escape sequences."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO
from launcher.errors import LaunchError
from launcher.output import event_log
from launcher.tools import events as event_tool


def shown(log_dir, pattern=None) -> list:
    out = []
    event_tool.show(str(log_dir), False, pattern, lambda data, flush: out.append(data), lambda: False)
    return b"".join(out).decode().splitlines()


def test_an_event_is_a_json_line_with_its_time_node_round_and_fields(tmp_path):
    log = event_log.EventLog(str(tmp_path), 2, now=lambda: 1700000000.1234)
    log.write("job_started", workers=2, run_id=None)
    log.round = 3
    log.write("worker_exited", rank=5, code=-9, exit="killed by SIGKILL")
    log.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"time": 1700000000.123, "event": "job_started", "node": 2, "workers": 2},
        {"time": 1700000000.123, "event": "worker_exited", "node": 2, "round": 3, "rank": 5, "code": -9,
         "exit": "killed by SIGKILL"}]


def test_without_a_log_dir_nothing_is_written(tmp_path):
    log = event_log.EventLog(None, 0)
    log.write("job_started")
    assert log.fd is None


def test_a_full_disk_is_one_warning_and_the_job_goes_on(tmp_path, caplog):
    log = event_log.EventLog(str(tmp_path), 0)
    log.path = "/dev/full"
    log.write("job_started")
    log.write("job_ended", code=0)
    log.close()
    assert [r.getMessage() for r in caplog.records if "event log" in r.getMessage()] == [
        "could not write the event log /dev/full (No space left on device); it is not kept from here on"]


def test_a_writer_killed_mid_write_leaves_only_whole_lines(tmp_path):
    """A launcher killed with -9 at any moment: every line in the file is a whole event."""
    writer = subprocess.Popen([sys.executable, "-c", f"""
import sys; sys.path.insert(0, {str(REPO)!r})
from launcher.output.event_log import EventLog
log = EventLog({str(tmp_path)!r}, 0)
i = 0
while True:
    log.write("worker_exited", rank=i, exit="x" * (i % 1500))
    i += 1
"""])
    try:
        path = tmp_path / "events.jsonl"
        deadline = 2000
        while (not path.exists() or path.stat().st_size < 200_000) and deadline:
            deadline -= 1
            os.sched_yield() if deadline % 2 else __import__("time").sleep(0.01)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    ranks = [e["rank"] for e in event_log.read(str(path))]
    assert ranks == list(range(len(ranks))) and len(ranks) > 100
    whole = path.read_bytes().count(b"\n")
    assert whole == len(ranks)  # at most the line being written when it was killed is cut: the rest are whole
    log = event_log.EventLog(str(tmp_path), 0)  # the next launcher's first line is whole
    log.write("job_started")
    log.close()
    assert [e["event"] for e in event_log.read(str(path))][-2:] == ["worker_exited", "job_started"]


def test_the_next_writer_begins_after_a_cut_line(tmp_path):
    (tmp_path / "events.jsonl").write_bytes(b'{"event": "job_started", "time": 1, "node": 0}\n{"event": "wor')
    log = event_log.EventLog(str(tmp_path), 0, now=lambda: 2.0)
    log.write("job_ended", code=0)
    log.write("job_ended", code=1)
    assert [e.get("code") for e in event_log.read(str(tmp_path / "events.jsonl"))] == [None, 0, 1]


@pytest.mark.parametrize("line", [
    b"not json", b"[1, 2]", b'"text"', b"{}", b'{"event": 5, "time": 1}', b'{"event": "x", "time": "now"}',
    b'{"event": "x", "time": NaN}', b'{"event": "x", "time": Infinity}', b'{"event": "x", "time": true}',
    b"[" * 100_000 + b"]" * 100_000, b'{"event": "x", "time": 1' + b"0" * 5000 + b"}", b"\xff\xfe\x00",
    b'{"event": "x"', b"",
])
def test_a_line_that_is_not_an_event_is_skipped(tmp_path, line):
    (tmp_path / "events.jsonl").write_bytes(b'{"event": "job_started", "time": 1, "node": 0}\n' + line + b"\n"
                                            b'{"event": "job_ended", "time": 2, "node": 0, "code": 0}\n')
    assert [e["event"] for e in event_log.read(str(tmp_path / "events.jsonl"))] == ["job_started", "job_ended"]
    assert [line.split(": ", 1)[1] for line in shown(tmp_path)] == [
        "job started: ? worker(s) here, world size ?, ? node(s)", "job ended: exit code 0"]


@pytest.mark.parametrize("fields", [
    {"node": "\x1b[2J", "rank": [1], "round": {"a": 1}},
    {"member": "\x1b]0;owned\x07node 1", "reason": "a\rb\x1b[31m", "event": "member_lost"},
    {"pid": {"x": [1]}, "event": "worker_started", "kept": "yes"},
    {"event": "no_such_event", "payload": "\x1b[2J" * 100},
    {"event": "round", "round": 2, "nodes": None, "why": ["x"], "world_size": "\x1b[1m"},
])
def test_a_hostile_event_is_shown_on_one_line_with_no_escape_sequence(tmp_path, fields):
    event = {"event": "job_started", "time": 1.5, **fields}
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n")
    (line,) = shown(tmp_path)
    assert line.isprintable() and "\x1b" not in line


def test_a_cut_last_line_waits_for_its_end(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"event": "job_started", "time": 1, "node": 0}\n{"event": "job_en')
    assert len(shown(tmp_path)) == 1


def test_a_huge_file_is_read_from_its_last_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(event_log, "READ_LIMIT", 1000)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(b'{"event": "worker_exited", "time": %d, "node": 0, "rank": %d}\n' % (i, i)
                              for i in range(200)))
    ranks = [e["rank"] for e in event_log.read(str(path))]
    assert ranks == list(range(200 - len(ranks), 200)) and 0 < len(ranks) < 200


def test_no_event_log_is_one_sentence(tmp_path):
    with pytest.raises(LaunchError, match=r"^no events.jsonl in .*; give the --log_dir of the job"):
        shown(tmp_path)
