"""The progress page (launcher.progress_page), a worker's report (launcher.runtime.report) and the launcher's pages
(launcher.run.progress): what a worker writes is untrusted, half a report is never taken, a report never raises."""

import json
import mmap
import os

import pytest

from launcher import envvars as ev
from launcher import progress_page as pp
from launcher.plan import policy as p
from launcher.run.progress import ProgressPages
from launcher.runtime import progress


def page() -> mmap.mmap:
    return mmap.mmap(-1, pp.SIZE)


def test_a_report_reads_back_as_it_was_written():
    memory = page()
    sequence = pp.write(memory, 0, pp.encode(12, 1.5, {"loss": 0.25, "lr": 1, "bad": float("nan"), "flag": True,
                                                         "text": "x"}))
    assert pp.read(memory) == (sequence, pp.encode(12, 1.5, {"loss": 0.25, "lr": 1}))
    assert pp.decode(pp.read(memory)[1]) == {"step": 12, "t": 1.5, "scalars": {"loss": 0.25, "lr": 1.0}, "compute": None}


def test_half_a_report_is_never_taken():
    memory = page()
    pp.write(memory, 0, pp.encode(1, 1.0, {}))
    memory[0:8] = (3).to_bytes(8, "little")  # odd: a report being written
    assert pp.read(memory) == (3, None)
    memory[0:8] = (4).to_bytes(8, "little")
    memory[8:12] = (pp.BODY + 1).to_bytes(4, "little")  # a length past the page
    assert pp.read(memory)[1] is None


@pytest.mark.parametrize("body", [
    b"", b"null", b"[1]", b"{", b"[" * 50_000 + b"]" * 50_000, b'{"step": "3", "t": 1, "scalars": {}}',
    b'{"step": -1, "t": 1, "scalars": {}}', b'{"step": 1e3, "t": 1, "scalars": {}}', b'{"step": true, "t": 1, "scalars": {}}',
    b'{"step": 99999999999999999999999, "t": 1, "scalars": {}}', b'{"step": 1, "t": NaN, "scalars": {}}',
    b'{"step": 1, "t": "now", "scalars": {}}', b'{"step": 1, "t": 1, "scalars": []}', b"\xff\xfe",
    b'{"step": 1, "t": 1' + b"0" * 400 + b', "scalars": {}}',  # an int past a float's range: float() of it raises
])
def test_what_is_not_a_report_is_none(body):
    assert pp.decode(body) is None


def test_scalars_are_kept_only_when_plain_and_bounded():
    scalars = {"ok": 1.0, "\x1b[2J": 1.0, "x" * 65: 1.0, "inf": 1e999, "list": [1], "nested": {"a": 1}, "true": True,
               "huge": 10 ** 400}
    scalars.update({f"s{i}": i for i in range(100)})
    report = pp.decode(json.dumps({"step": None, "t": 0, "scalars": scalars}).encode())
    assert report["step"] is None and report["scalars"]["ok"] == 1.0 and "huge" not in report["scalars"]
    assert "huge" not in pp.decode(pp.encode(1, 0.0, scalars))["scalars"]  # the worker's side leaves it out too
    assert len(report["scalars"]) <= pp.MAX_SCALARS and all(k.isprintable() and len(k) <= pp.MAX_NAME for k in report["scalars"])


def test_report_without_a_page_does_nothing_and_never_raises(monkeypatch):
    monkeypatch.setattr(progress, "_page", progress._Page())
    monkeypatch.delenv(ev.PROGRESS_FD, raising=False)
    progress.report(step=1, loss=0.5)
    assert progress._page.memory is None
    monkeypatch.setattr(progress, "_page", progress._Page())
    monkeypatch.setenv(ev.PROGRESS_FD, "999")  # not open
    progress.report(step=1)
    assert progress._page.memory is None


def test_report_never_raises_on_what_it_is_given(monkeypatch):
    pages = ProgressPages(wanted=True)
    try:
        monkeypatch.setenv(ev.PROGRESS_FD, str(pages.fds(0)[0]))
        monkeypatch.setattr(progress, "_page", progress._Page())
        pages.started(0, 0.0)
        progress.report(step="seven")  # not a number: dropped
        progress.report(step=3, **{f"m{i}": object() for i in range(5)}, loss="x" * 10_000)
        pages.poll(1.0)
        assert pages.last(0) == {"step": 3, "t": pages.last(0)["t"], "scalars": {}, "compute": None}
    finally:
        pages.close()


def test_a_worker_that_stops_reporting_is_stalled_after_the_limit_only():
    pages = ProgressPages(wanted=True)
    try:
        fd = pages.fds(0)[0]
        memory = mmap.mmap(fd, pp.SIZE)
        pages.started(0, now=0.0)
        pages.poll(5.0)
        assert pages.stalled([0], 2.0, 5.0) is None  # it never reported: the lines rule is the one for it
        pp.write(memory, 0, pp.encode(4, 1.0, {}))
        pages.poll(6.0)
        assert pages.stalled([0], 2.0, 7.9) is None
        assert pages.stalled([0], 2.0, 8.0) == (0, {"step": 4, "t": 1.0, "scalars": {}, "compute": None})
        pages.started(0, now=9.0)  # a new worker: its page emptied, nothing of the old one kept
        assert pp.read(memory) == (0, None) and pages.stalled([0], 2.0, 20.0) is None
    finally:
        pages.close()


def test_no_page_is_made_unless_wanted():
    pages = ProgressPages(wanted=False)
    assert pages.fds(0) == () and pages.env(0) == {}
    pages.started(0, 0.0)
    pages.poll(1.0)
    assert pages.stalled([0], 1.0, 10.0) is None


def test_a_page_the_kernel_refuses_is_one_warning(monkeypatch, caplog):
    def refuse(*args):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(os, "memfd_create", refuse)
    pages = ProgressPages(wanted=True)
    assert pages.fds(0) == () and pages.fds(1) == ()
    assert [r.getMessage() for r in caplog.records] == [
        "no progress page for the workers ([Errno 12] Cannot allocate memory): their reports are not read"]


def test_a_stalled_rank_is_a_hang_named_with_its_last_step():
    state = p.start((0, 1), 10.0)
    after, actions = p.decide(state, p.Hung(60.0, 1, 1200), 0.0)
    assert after.hung == 60.0 and after.stalled == (1, 1200) and p.exit_code(after) == 1
    assert actions[0].text == ("rank 1 made no progress for 60 s (its last report: step 1200) (--hang_timeout): "
                               "stopping the job")
    assert p.hang_text(after, " on node 2") == "rank 1 on node 2 made no progress for 60 s (its last report: step 1200)"


# ---------------------------------------------------------------- the compute time a report carries (stragglers)

from launcher.run.straggler_watch import StragglerWatch, peer_times  # noqa: E402
from launcher.runtime import timing  # noqa: E402


def reporting(monkeypatch, pages):
    monkeypatch.setenv(ev.PROGRESS_FD, str(pages.fds(0)[0]))
    monkeypatch.setattr(progress, "_page", progress._Page())
    monkeypatch.setattr(timing, "waits", timing.Waits())
    pages.started(0, 0.0)


def test_a_report_carries_the_step_time_less_the_waits_counted(monkeypatch):
    pages = ProgressPages(wanted=True)
    clock = iter([10.0, 11.0, 13.0, 14.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    try:
        reporting(monkeypatch, pages)
        timing.add_wait(0.4)  # before the first report: no step to charge it to
        progress.report(step=1)
        assert pages.poll(1.0) == [0] and pages.last(0)["compute"] is None
        timing.add_wait(0.25)
        progress.report(loss=0.5)  # no step: the wait is kept for the next report that names one
        progress.report(step=2)  # 1 s since, 0.25 s of it waiting
        pages.poll(2.0)
        assert pages.last(0)["compute"] == 0.75
        progress.report(step=4)  # 2 s for two steps, no wait: 1 s each
        pages.poll(3.0)
        assert pages.last(0)["compute"] == 1.0
        progress.report(step=5, compute=0.125)  # the program's own measure wins
        pages.poll(4.0)
        assert pages.last(0)["compute"] == 0.125 and timing.waited() == 0.65
        assert pages.poll(5.0) == []
    finally:
        pages.close()


def test_without_a_wait_counted_a_report_carries_no_compute_time(monkeypatch):
    pages = ProgressPages(wanted=True)
    try:
        reporting(monkeypatch, pages)
        for step in range(3):
            progress.report(step=step)
        pages.poll(1.0)
        assert pages.last(0)["compute"] is None
        for bad in (float("nan"), -1.0, "0.5", True):
            assert pp.decode(pp.encode(1, 0.0, {}, bad))["compute"] is None
    finally:
        pages.close()


class Events:
    node = 0

    def __init__(self):
        self.written = []

    def write(self, event, **fields):
        self.written.append((event, fields))


def test_the_watch_names_a_slow_rank_once_and_says_when_it_is_no_longer_slow(caplog):
    watch, events = StragglerWatch(), Events()
    step = 0
    for step in range(40):
        watch.note(0, 0, "10.0.0.1", {"step": step, "compute": 0.2}, step)
        watch.note(1, 0, "10.0.0.1", {"step": step, "compute": 0.8}, step)
        watch.look(step, (), events)
    assert [e for e, _ in events.written] == ["straggler"]
    assert events.written[0][1]["ranks"] == [1] and events.written[0][1]["speed"] == 0.25
    assert events.written[0][1]["node"] == 0 and events.written[0][1]["host"] == "10.0.0.1"
    assert watch.compute(1, step) == pytest.approx(0.8) and watch.verdict.ranks == pytest.approx({0: 1.0, 1: 0.25})
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("straggler: node 0 (10.0.0.1) is a straggler: rank 1 at 0.25")
    for step in range(40, 80):
        watch.note(1, 0, "10.0.0.1", {"step": step, "compute": 0.2}, step)
        watch.note(0, 0, "10.0.0.1", {"step": step, "compute": 0.2}, step)
        watch.look(step, (), events)
    assert [e for e, _ in events.written] == ["straggler", "straggler_cleared"] and watch.named == {}


def test_other_nodes_ranks_come_from_their_views_and_a_slow_node_is_named():
    watch, events = StragglerWatch(), Events()
    rows = [{"node": 1, "node_ip": "10.0.0.2", "error": "", "workers": [
                {"rank": 2, "compute_seconds": 0.8, "step": 100}, {"rank": 3, "compute_seconds": None, "step": 100}]},
            {"node": 2, "node_ip": "10.0.0.3", "error": "no answer", "workers": []}]
    assert peer_times(rows, 0) == (peer_times(rows, 0)[0],) and peer_times(rows, 1) == ()
    for step in range(40):
        watch.note(0, 0, "10.0.0.1", {"step": step, "compute": 0.2}, step)
        watch.note(1, 0, "10.0.0.1", {"step": step, "compute": 0.21}, step)
        rows[0]["workers"][0]["step"] = 100 + step
        watch.look(step, peer_times(rows, 0), events)
    assert [(e, f["node"], f["ranks"]) for e, f in events.written] == [("straggler", 1, [2])]
    assert watch.verdict.nodes == pytest.approx({0: 0.2 / 0.21, 1: 0.25})
