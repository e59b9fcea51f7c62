"""The state file and the operator tools (``status``, ``logs``), without running a job."""

import json
import os
import time

import pytest
from click.testing import CliRunner

from launcher.cli import main as cli
from launcher.output import state_file as state
from launcher.tools.log_dir import read_states
from launcher.host.changes import Changed
from launcher.tools import follow as follow_tool
from launcher.tools import logs as log_tool
from launcher.tools import status
from launcher.errors import LaunchError

T0 = 1_800_000_000.0


def node_state(**changes):
    procs = (state.ProcessState("rank 0", 0, 101, "workerlog.0", T0, None, None),
             state.ProcessState("rank 1", 1, 102, "workerlog.1", T0, T0 + 3.0, 7))
    values = dict(node=0, node_ip="127.0.0.1", nodes=1, host="h", run_id="abc", launcher_pid=99,
                  launcher_start=5, attempt=0, max_restarts=2, phase="running", exit_code=None,
                  started=T0, updated=T0 + 3.0, processes=procs)
    return state.NodeState(**{**values, **changes})


def write_log(folder, name, *runs):
    """A log of several runs: (header time, lines)."""
    text = "".join(f"===== {when} launcher: {name} starts: python x.py\n" + "".join(f"{l}\n" for l in lines)
                   for when, lines in runs)
    (folder / name).write_text(text)


# ---------------------------------------------------------------- the state file


def test_state_round_trips_through_json():
    s = node_state()
    assert state.from_json(state.to_json(s)) == s


@pytest.mark.parametrize("text", [b"{not json", b"[]", b'{"version": 1}', b'{"version": 9, "node": 0}',
                                  b"\xff\xfe"])
def test_a_corrupt_state_file_is_a_value_error(text):
    with pytest.raises(ValueError):
        state.from_json(text)


def test_writer_replaces_the_file_whole(tmp_path):
    path = tmp_path / "launcher.node0.json"
    w = state.Writer(str(path))
    w.write(node_state(attempt=1))
    w.write(node_state(attempt=2))
    assert state.from_json(path.read_bytes()).attempt == 2
    assert os.listdir(tmp_path) == ["launcher.node0.json"]  # no temporary file left


def test_writer_that_cannot_write_warns_once_and_never_raises(tmp_path, caplog):
    path = tmp_path / "launcher.node0.json"
    path.mkdir()  # a folder where the file should be: the rename fails
    w = state.Writer(str(path))
    with caplog.at_level("WARNING", logger="launcher"):
        for _ in range(3):
            w.write(node_state())
    assert w.failed and not w.written
    assert len([r for r in caplog.records if "state file" in r.getMessage()]) == 1
    assert os.listdir(tmp_path) == ["launcher.node0.json"]


def test_state_file_names_are_per_node():
    assert state.path_for("d", 3) == os.path.join("d", "launcher.node3.json")
    assert state.is_state_file("launcher.node12.json")
    assert not state.is_state_file("launcher.nodeX.json") and not state.is_state_file("launcher.node0.json.1.tmp")


def test_launcher_liveness_uses_pid_and_start_time():
    me = os.getpid()
    alive = node_state(launcher_pid=me, launcher_start=state.process_start(me))
    assert state.launcher_status(alive, "h") == "alive"
    assert state.launcher_status(node_state(launcher_pid=me, launcher_start=1), "h") == "gone"  # recycled pid
    assert state.launcher_status(node_state(launcher_pid=2 ** 22 + 1), "h") == "gone"
    assert state.launcher_status(alive, "other-host") == "elsewhere"


# ---------------------------------------------------------------- status


def test_status_table_running_job():
    text = status.format_status([node_state()], ["alive"], [["step 3", "boom"]], T0 + 5.0)
    lines = text.splitlines()
    assert "node 0 of 1 (127.0.0.1): running, launcher pid 99, attempt 1 of 3" in lines[0]
    assert lines[1].split() == ["node", "process", "pid", "state", "time", "restarts", "last", "line"]
    assert lines[2].split() == ["0", "rank", "0", "101", "running", "5.0", "s", "0", "step", "3"]
    assert lines[3].split() == ["0", "rank", "1", "102", "exited", "7", "3.0", "s", "0", "boom"]


def test_status_of_a_job_whose_launcher_is_gone():
    text = status.format_status([node_state()], ["gone"], [["", ""]], T0 + 60.0)
    assert "not running any more: its launcher (pid 99) is gone" in text
    assert "stopped" in text.splitlines()[2] and "3.0 s" in text.splitlines()[2]  # until the last update


def test_status_of_an_ended_job_and_signals():
    p = state.ProcessState("server 0", 0, 5, "serverlog.0", T0, T0 + 200.0, -15)
    text = status.format_status([node_state(phase="ended", exit_code=143, processes=(p,))], ["gone"], [[""]], T0)
    assert "ended with exit code 143" in text
    assert "server 0" in text and "killed by SIGTERM" in text and "0:03:20" in text


def test_last_line_skips_blank_lines_and_says_nothing_for_a_new_run(tmp_path):
    log = tmp_path / "workerlog.0"
    log.write_text("===== 2026-01-01 00:00:00 launcher: rank 0 starts: x\nstep 1\n\n")
    assert status.last_line(str(log)) == "step 1"
    log.write_text("old\n===== 2026-01-01 00:00:00 launcher: rank 0 starts: x\n")
    assert status.last_line(str(log)) == ""
    log.write_text("x" * 200 + "\n")
    assert len(status.last_line(str(log))) == status.LAST_LINE_WIDTH


def test_status_errors_are_one_sentence(tmp_path):
    with pytest.raises(LaunchError, match="does not exist"):
        status.status(str(tmp_path / "none"))
    with pytest.raises(LaunchError, match="no launcher state file"):
        status.status(str(tmp_path))
    (tmp_path / "launcher.node0.json").write_text("{")
    with pytest.raises(LaunchError, match="is not a launcher state file"):
        status.status(str(tmp_path))


# ---------------------------------------------------------------- logs


def test_runs_are_merged_in_the_order_they_started(tmp_path):
    write_log(tmp_path, "workerlog.0", ("2026-01-01 00:00:00", ["a1"]), ("2026-01-01 00:00:09", ["a2"]))
    write_log(tmp_path, "workerlog.1", ("2026-01-01 00:00:00", ["b1"]), ("2026-01-01 00:00:09", ["b2"]))
    write_log(tmp_path, "serverlog.0", ("2026-01-01 00:00:05", ["s1"]))
    files = log_tool.log_files(str(tmp_path))
    out = b"".join(log_tool.merged(files, log_tool.sizes(files, False), log_tool.compile_grep(r"^\w\d$"))).decode()
    assert out.splitlines() == ["[rank 0] a1", "[rank 1] b1", "[server 0] s1", "[rank 0] a2", "[rank 1] b2"]


def test_logs_selects_ranks_and_servers(tmp_path):
    for name in ("workerlog.0", "workerlog.3", "serverlog.1"):
        write_log(tmp_path, name, ("2026-01-01 00:00:00", [name]))
    names = [f.name for f in log_tool.log_files(str(tmp_path), log_tool.parse_ranks("3,s1"))]
    assert names == ["serverlog.1", "workerlog.3"]
    with pytest.raises(LaunchError, match="no workerlog.7"):
        log_tool.log_files(str(tmp_path), log_tool.parse_ranks("7"))
    with pytest.raises(LaunchError, match="is not a rank"):
        log_tool.parse_ranks("0,x")


def test_logs_uses_the_state_files_labels(tmp_path):
    write_log(tmp_path, "workerlog.1", ("2026-01-01 00:00:00", ["t"]))
    p = state.ProcessState("trainer 1", 3, 5, "workerlog.1", T0)
    (tmp_path / "launcher.node0.json").write_bytes(state.to_json(node_state(processes=(p,))))
    assert [f.label for f in log_tool.log_files(str(tmp_path))] == ["trainer 1"]


def test_a_partial_last_line_waits_for_the_follower(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"one\ntw")
    files = log_tool.log_files(str(tmp_path))
    ends = log_tool.sizes(files, whole_lines=True)
    assert b"".join(log_tool.merged(files, ends)) == b"[rank 0] one\n"
    follower = follow_tool.Follower(files, ends)
    assert follower.read() == b""
    with open(tmp_path / "workerlog.0", "ab") as f:
        f.write(b"o\nthree")
    assert follower.read() == b"[rank 0] two\n"
    assert follower.read(final=True) == b"[rank 0] three\n"


def test_follower_starts_over_on_a_truncated_file(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"one\ntwo\n")
    files = log_tool.log_files(str(tmp_path))
    follower = follow_tool.Follower(files, log_tool.sizes(files, True))
    (tmp_path / "workerlog.0").write_bytes(b"new\n")
    assert follower.read() == b"[rank 0] new\n"


def test_follow_stops_once_the_job_has_ended(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"")
    (tmp_path / "launcher.node0.json").write_bytes(state.to_json(node_state(phase="ended", exit_code=0)))
    files = log_tool.log_files(str(tmp_path))
    shown = []
    follow_tool.follow(str(tmp_path), follow_tool.Follower(files, [0]), NoChanges(), shown.append)
    assert shown == [b"", b"", b""]  # nothing new, no change, then the last lines: none


class NoChanges:
    """A folder in which nothing changes: each wait gives what ``then`` says (an empty batch)."""

    how = "test"

    def __init__(self, then=lambda timeout: Changed()) -> None:
        self.wait = then

    def close(self) -> None:
        pass


def test_logs_of_an_empty_or_missing_folder(tmp_path):
    with pytest.raises(LaunchError, match="no workerlog.N or serverlog.N"):
        log_tool.log_files(str(tmp_path))
    with pytest.raises(LaunchError, match="does not exist"):
        log_tool.log_files(str(tmp_path / "none"))


# ---------------------------------------------------------------- the command line


def test_tools_are_chosen_only_when_no_file_of_that_name_is_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.command_for(["status", "d"])[:2] == (cli.status_command, ["d"])
    assert cli.command_for(["logs", "d", "-f"])[:2] == (cli.logs_command, ["d", "-f"])
    assert cli.command_for(["--log_dir", "x", "status"])[0] is cli.launch
    (tmp_path / "logs").mkdir()  # a folder named logs does not make `logs` a script
    assert cli.command_for(["logs", "logs"])[0] is cli.logs_command
    (tmp_path / "status").write_text("print('training')\n")
    assert cli.command_for(["status"])[0] is cli.launch


def test_tools_help_and_launch_help_say_how():
    r = CliRunner().invoke(cli.launch, ["--help"])
    assert "status and logs are these tools only as the first argument" in r.output
    r = CliRunner().invoke(cli.logs_command, ["--help"])
    assert r.exit_code == 0 and "--ranks" in r.output and "--grep" in r.output and "-f, --follow" in r.output


def test_status_command_prints_the_table(tmp_path):
    write_log(tmp_path, "workerlog.0", ("2026-01-01 00:00:00", ["step 9"]))
    (tmp_path / "launcher.node0.json").write_bytes(state.to_json(node_state(host=state.this_host(), updated=time.time())))
    r = CliRunner().invoke(cli.status_command, [str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "not running any more" in r.output and "step 9" in r.output


# ---------------------------------------------------------------- an untrusted state file


def hostile_state(tmp_path, **node):
    """A state file with wrong-typed values, written as JSON allows (nan, 1e300, strings for numbers)."""
    procs = [{"label": "rank 0", "key": 0, "pid": "x", "log": "workerlog.0", "started": float("nan"),
              "ended": 1e300, "returncode": 1.5},
             {"label": ["l"], "key": {}, "pid": 2 ** 80, "log": ["workerlog.1"], "started": "now",
              "ended": None, "returncode": "-9"},
             "not a process"]
    values = dict(node=0, node_ip=7, nodes="two", host=None, run_id="r", launcher_pid=-1, launcher_start="s",
                  attempt="one", max_restarts=float("inf"), phase=3, exit_code=1e9, started=float("-inf"),
                  updated=1e300, processes=procs)
    import json
    text = json.dumps({"version": state.VERSION, **values, **node})
    (tmp_path / "launcher.node0.json").write_text(text)
    return text


def test_wrong_typed_values_are_shown_as_unknown(tmp_path):
    hostile_state(tmp_path)
    write_log(tmp_path, "workerlog.0", ("2026-01-01 00:00:00", ["step 1"]))
    text = status.status(str(tmp_path))
    assert "step 1" in text and "?" in text
    s = read_states(str(tmp_path))[0]
    assert (s.updated, s.attempt, s.max_restarts, s.nodes, s.processes[0].pid, s.processes[1].log) == (None,) * 6
    assert [f.label for f in log_tool.log_files(str(tmp_path))] == ["rank 0"]


@pytest.mark.parametrize("node", [dict(processes={"a": 1}), dict(processes=None), dict(updated=float("nan")),
                                  dict(node="x"), dict(attempt=-5, max_restarts=-1), dict(label=None)])
def test_status_and_logs_commands_never_trace_on_a_hostile_state_file(tmp_path, node):
    hostile_state(tmp_path, **node)
    write_log(tmp_path, "workerlog.0", ("2026-01-01 00:00:00", ["step 1"]))
    for command, args in ((cli.status_command, [str(tmp_path)]), (cli.logs_command, [str(tmp_path)])):
        r = CliRunner().invoke(command, args)
        assert r.exit_code == 0 and r.exception is None, r.output


def test_a_log_outside_the_log_dir_is_never_read(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (tmp_path / "secret.txt").write_text("the secret\n")
    procs = (state.ProcessState("rank 0", 0, 101, "../secret.txt", T0),
             state.ProcessState("rank 1", 1, 102, "workerlog.1", T0),
             state.ProcessState("rank 2", 2, 103, str(tmp_path / "secret.txt"), T0))
    (log_dir / "launcher.node0.json").write_bytes(state.to_json(node_state(processes=procs)))
    (log_dir / "workerlog.1").symlink_to(tmp_path / "secret.txt")  # a link out of the dir: not followed
    text = status.status(str(log_dir))
    assert "secret" not in text.replace("secret.txt", "")
    with pytest.raises(LaunchError, match="no workerlog.N or serverlog.N"):
        log_tool.log_files(str(log_dir))


def test_a_state_file_that_is_not_a_regular_file_is_one_sentence(tmp_path):
    os.mkfifo(tmp_path / "launcher.node0.json")
    with pytest.raises(LaunchError, match="not a regular file"):
        status.status(str(tmp_path))


def test_follow_ends_when_its_log_dir_is_gone(tmp_path):
    import shutil
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "workerlog.0").write_bytes(b"")  # no state file: the job cannot be seen to end
    files = log_tool.log_files(str(log_dir))
    shown, ticks = [], []

    def gone_after_3(timeout):
        ticks.append(timeout)
        assert len(ticks) < 100, "still following a log dir that is gone"
        if len(ticks) == 3:
            shutil.rmtree(log_dir)
        return Changed()

    clock = iter(range(10 ** 6)).__next__
    why = follow_tool.follow(str(log_dir), follow_tool.Follower(files, [0]), NoChanges(gone_after_3), shown.append,
                             clock=clock)
    assert "is gone (deleted or moved)" in why and len(ticks) == 3


def test_a_huge_line_is_cut_as_the_launcher_cuts_it(tmp_path, monkeypatch):
    from launcher.output import lines
    monkeypatch.setattr(lines, "MAX_PARTIAL_LINE", 1000)
    monkeypatch.setattr(lines, "CHUNK", 256)
    fake_header = "===== 2026-01-01 00:00:09 launcher: not a header, in the middle of a line"
    write_log(tmp_path, "workerlog.0", ("2026-01-01 00:00:00", ["x" * 256 + fake_header, "x" * 5000, "end"]))
    files = log_tool.log_files(str(tmp_path))
    assert len(log_tool.sections(files[0].path, 0, os.path.getsize(files[0].path))) == 1
    out = b"".join(log_tool.merged(files, log_tool.sizes(files, False))).splitlines()[1:]
    assert out[-1] == b"[rank 0] end" and all(len(line) < 1400 for line in out)
    assert sum(line.count(b"x") for line in out) == 5256


@pytest.mark.parametrize("cpus", [{"a": [[[1]]]}, ["0-3"], 7, "0-3\x1b[2J", "0," * 2000, None])
def test_a_hostile_cpu_list_in_the_state_file_is_not_shown(tmp_path, cpus):
    """The CPUs a process is bound to come from the file, untrusted: nested, of the wrong type, with an escape
    sequence or longer than a line, they are unknown; with no process bound the column is not there at all."""
    procs = (state.ProcessState("rank 0", 0, 101, "workerlog.0", T0, cpus="0-1"),
             state.ProcessState("rank 1", 1, 102, "workerlog.1", T0))
    doc = json.loads(state.to_json(node_state(processes=procs)))
    doc["processes"][1]["cpus"] = cpus
    (tmp_path / "launcher.node0.json").write_text(json.dumps(doc))
    read = read_states(str(tmp_path))[0]
    assert [p.cpus for p in read.processes] == ["0-1", None]
    lines = status.status(str(tmp_path)).splitlines()
    header = next(line for line in lines if line.split()[:2] == ["node", "process"])
    assert "cpus" in header.split()
    at = header.index("cpus")  # the table's columns line up under the header
    rows = [line for line in lines if line.split()[:3] in (["0", "rank", "0"], ["0", "rank", "1"])]
    assert [row[at:].split()[0] for row in rows] == ["0-1", "any"]
