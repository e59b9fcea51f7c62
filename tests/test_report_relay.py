"""--report_log under --hostfile: each host's report log relayed over its lifeline to the command's machine, kept in
LOG_DIR/reports.nodeN.relayed.jsonl. The pure parts (launcher/plan/over_ssh.py: the messages and what is kept of
them; launcher/output/report_log.py: a growing file's new lines, the file names), the host's relay thread
(launcher/cli/over_ssh.py), the command's end against a real process posing as a host (launcher/run/over_ssh.py), and
the tuner reading both files of a host without counting a line twice (launcher/plan/tune_rate.py,
launcher/run/tune_trial.py). Jobs over a real sshd: tests/integration/test_over_ssh.py."""

import json
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from launcher.output import report_log
from launcher.plan import over_ssh, report_lines
from launcher.plan.tune_rate import Series


def report(rank, step, t=None):
    return json.dumps({"rank": rank, "step": step, "t": 100.0 + step if t is None else t, "scalars": {}},
                      separators=(",", ":")).encode()


# ---------------------------------------------------------------- the pure parts


def test_the_relayed_file_has_a_name_of_its_own_that_the_tuner_reads_too(tmp_path):
    assert report_log.path_for("d", 3) == "d/reports.node3.jsonl"
    assert report_log.path_for("d", 3, relayed=True) == "d/reports.node3.relayed.jsonl"
    assert report_log.is_report_log("reports.node3.relayed.jsonl") and report_log.is_report_log("reports.node3.jsonl")
    for name in ("reports.nodeX.relayed.jsonl", "reports.node.relayed.jsonl", "reports.node3.relayed.json",
                 "reports.node3.other.jsonl"):
        assert not report_log.is_report_log(name), name


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=600))
def test_the_messages_relay_every_line_in_order_each_message_bounded(lines):
    messages = over_ssh.report_messages(lines, "k")
    got = []
    for message in messages:
        fields = over_ssh.read_line(message, "k")
        assert fields is not None and 1 <= len(fields["reports"]) <= report_lines.MOST_LINES
        assert sum(len(x) for x in fields["reports"]) <= report_lines.MOST_BYTES
        got += fields["reports"]
    assert got == [line.decode(errors="replace") for line in lines]


def test_a_line_past_the_bytes_of_a_message_goes_alone():
    big = b"x" * (report_lines.MOST_BYTES + 1)
    messages = over_ssh.report_messages([b"a", big, b"b"], "k")
    assert [over_ssh.read_line(m, "k")["reports"] for m in messages] == [["a"], [big.decode()], ["b"]]


def test_only_json_objects_on_one_line_are_kept_of_a_relayed_message():
    good = report(0, 1).decode()
    items = [good, "not json", "[1, 2]", "7", '{"a":\n1}', '{"a": 1}\r', "{}", 5, None, {"rank": 0}, "\ud800",
             '{"a": "\ud800"}', json.dumps({"x" * report_lines.LONGEST: 1})]
    assert report_lines.kept(items) == good.encode() + b"\n{}\n" + b'{"a": "?"}\n'
    for fields in ({}, {"reports": "a string"}, {"reports": {"a": 1}}, {"reports": None}):
        assert report_lines.kept(fields.get("reports")) == b""


@settings(max_examples=100)
@given(st.lists(st.one_of(st.text(max_size=30), st.integers(), st.none(), st.dictionaries(st.text(), st.integers())),
                max_size=8))
def test_whatever_a_host_sends_as_reports_never_raises_and_keeps_only_object_lines(items):
    kept = report_lines.kept(items)
    for line in kept.splitlines():
        assert isinstance(json.loads(line), dict)


def test_new_lines_of_a_growing_file_each_once_whole_and_a_line_too_long_skipped(tmp_path):
    path = tmp_path / "f"
    lines = report_log.NewLines(str(path), longest=10, most=8)
    assert lines.read() == []  # no file yet
    path.write_bytes(b"one\ntw")
    assert lines.read() == [b"one"]
    with open(path, "ab") as f:
        f.write(b"o\n" + b"y" * 25 + b"\nthree\n")
    got = []
    for _ in range(10):  # at most 8 bytes a look
        got += lines.read()
    assert got == [b"two", b"three"]


# ---------------------------------------------------------------- the host's relay thread


def test_the_host_relays_every_line_of_its_report_logs_at_its_end_behind_the_key(tmp_path, capfd, monkeypatch):
    from launcher.cli.over_ssh import Relay

    monkeypatch.setattr(report_log, "_WRITTEN", [])  # this test's process has written no report log before
    (tmp_path / "reports.node0.jsonl").write_bytes(report(7, 0) + b"\n")  # another host's, in a shared folder
    first = report_log.ReportLog(str(tmp_path), 1)  # an elastic job's node 1 in its first round...
    first.write(b"".join(report(r, s) + b"\n" for s in range(300) for r in range(2)) + b"cut sh")
    again = report_log.ReportLog(str(tmp_path), 2)  # ...and node 2 after it re-formed
    again.write(report(2, 300) + b"\n")
    report_log.ReportLog(str(tmp_path), 3, relayed=True).write(report(9, 0) + b"\n")  # a relay's, kept here
    relay = Relay("k")
    relay.end()  # the last lines sent before the end line, whether the thread looked or not
    out = capfd.readouterr().out.encode()
    messages = [over_ssh.read_line(m + b"\n", "k") for m in out.splitlines()]
    assert all(m is not None for m in messages) and len(messages) >= 3  # 601 lines: at most 256 a message
    relayed = [json.loads(x) for m in messages for x in m["reports"]]
    assert len(relayed) == 601 and relayed[-2] == {"rank": 1, "step": 299, "t": 399.0, "scalars": {}}
    assert relayed[-1]["rank"] == 2 and {r["rank"] for r in relayed} == {0, 1, 2}  # never rank 7's nor 9's
    assert not relay.thread.is_alive()


# ---------------------------------------------------------------- the command's end, a real process as the host

FAKE_HOST = textwrap.dedent("""\
    import json, os, sys
    MARKER = b"\\x1elauncher-over-ssh "
    def line():
        data = b""
        while not data.endswith(b"\\n"):
            c = os.read(0, 1)
            if not c:
                sys.exit(0)
            data += c
        return json.loads(data[len(MARKER):]) if data.startswith(MARKER) else None
    n = b""
    while not n.endswith(b"\\n"):
        n += os.read(0, 1)
    os.read(0, int(n))  # the environment
    key = line()["probe"]["key"]
    def tell(**fields):
        os.write(1, MARKER + json.dumps(fields).encode() + b"\\n")
    tell(key=key, facts={})
    while True:
        run = line()
        if run and "run" in run:
            break
    with open(sys.argv[1], "w") as f:
        json.dump(run["run"], f)
    good = json.dumps({"rank": 3, "step": 9, "t": 1.0})
    tell(key=key, node=7, reports=[good, "not json", "[1]"])
    tell(reports=[json.dumps({"rank": 66, "forged": True})])  # no key: a worker's line
    tell(key="guessed", reports=[json.dumps({"rank": 67, "forged": True})])
    tell(key=key, end=0, cause=None)
""")


def fan_out(tmp_path, ssh=True, log_dir=None):
    """A FanOut of one host, a process that reads the lifeline as a host does and relays three lines, two of them
    no JSON object, then two forged ones; what the command wrote and what the host was asked."""
    from launcher.run.over_ssh import FanOut, Remote

    (tmp_path / "host.py").write_text(FAKE_HOST)
    asked = tmp_path / "asked.json"
    reach = over_ssh.Reach(sys.executable, str(tmp_path), connect_timeout=30)
    remote = Remote(1, "h", [sys.executable, str(tmp_path / "host.py"), str(asked)], b"[h] ", ssh=ssh)
    fan = FanOut([remote], reach, 1, stop_node_0_only=True)
    try:
        assert fan.check(over_ssh.environment({}), over_ssh.probe_request(None, None, [], 0, fan.key))
        log_dir = str(tmp_path / "logs") if log_dir is None else log_dir
        assert fan.run({1: ["x.py"]}, 10.0, report_dir=log_dir if ssh else None) is None
    finally:
        fan.close()
    return json.loads(asked.read_text())


def test_the_command_keeps_only_the_host_s_keyed_json_lines_under_the_node_it_knows(tmp_path, capfd):
    (tmp_path / "logs").mkdir()
    asked = fan_out(tmp_path)
    assert asked == {"argv": ["x.py"], "reports": True}
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["reports.node1.relayed.jsonl"]  # not node 7
    kept = (tmp_path / "logs" / "reports.node1.relayed.jsonl").read_bytes()
    assert kept == json.dumps({"rank": 3, "step": 9, "t": 1.0}).encode() + b"\n"
    assert "forged" in capfd.readouterr().out  # shown as a worker's line, kept nowhere


def test_a_host_run_here_without_ssh_is_not_asked_to_relay(tmp_path):
    assert fan_out(tmp_path, ssh=False) == {"argv": ["x.py"]}


def test_a_relayed_file_that_cannot_be_written_is_one_warning_and_the_job_goes_on(tmp_path, caplog):
    fan_out(tmp_path, log_dir=str(tmp_path / "no such folder"))
    assert sum("cannot write the reports" in r.getMessage() for r in caplog.records) == 1


# ---------------------------------------------------------------- the tuner reads both files of a host


def lines_of_two_ranks(steps):
    return [json.loads(report(rank, step, t=10.0 + step * 0.1 + rank * 0.01))
            for step in range(steps) for rank in (0, 1)]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=3, max_value=30), st.integers(min_value=0, max_value=3), st.data())
def test_a_host_s_lines_read_from_its_own_file_and_its_relayed_copy_in_any_interleaving_give_one_file_s_rate(
        steps, warmup, data):
    lines = lines_of_two_ranks(steps)
    one = Series("steps", warmup)
    for line in lines:
        one.add(line)
    order = data.draw(st.permutations([0] * len(lines) + [1] * len(lines)))  # which file is read next
    both, at = Series("steps", warmup), [0, 0]
    for source in order:
        both.add(lines[at[source]])
        at[source] += 1
    assert both.ranks == one.ranks and both.first_step == one.first_step and both.rate() == one.rate()


def test_the_tuner_reads_a_host_s_relayed_file(tmp_path):
    from launcher.run.tune_trial import TrialReports

    (tmp_path / "reports.node0.jsonl").write_bytes(report(0, 1) + b"\n")
    (tmp_path / "reports.node1.relayed.jsonl").write_bytes(report(1, 1) + b"\n" + report(1, 2) + b"\n")
    series = Series("steps", warmup_steps=0)
    TrialReports(str(tmp_path)).read_into(series)
    assert set(series.ranks) == {0, 1} and len(series.ranks[1]) == 2
