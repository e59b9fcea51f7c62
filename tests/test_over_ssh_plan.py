"""The pure part of --hostfile's command (launcher/plan/over_ssh.py), its argument filter (launcher/cli/cluster.py),
and both ends of the lifeline that need no sshd: the host's bootstrap and line reader (launcher/run/lifeline.py),
and the host's launcher fed bad lines (launcher/cli/over_ssh.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from launcher.cli import cluster
from launcher.plan import over_ssh
from launcher.run import lifeline

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sshd import EXPECTED_STDERR  # noqa: E402

REACH = over_ssh.Reach(python=sys.executable, directory="/a dir/with 'quotes'")


@pytest.mark.parametrize("failure, reason", [
    ("refuses_key", "it refuses the key"), ("asks_password", "it asks for a password"),
    ("silent", "it accepted the connection but never answered ssh"), ("unknown_key", "its host key is not known here"),
    ("refused", "it refuses connections on the ssh port"), ("unresolvable", "its name does not resolve")])
def test_each_way_ssh_fails_has_its_reason(failure, reason):
    stderr = EXPECTED_STDERR[failure].format(user="root", host="127.0.99.1", port=2222)
    assert over_ssh.failure_reason(255, stderr, REACH).startswith(reason)


def test_the_remote_command_s_own_failures_have_their_reasons():
    assert "has no folder /a dir/with 'quotes'" in over_ssh.failure_reason(over_ssh.NO_FOLDER, "", REACH)
    assert f"has no {sys.executable}" in over_ssh.failure_reason(127, "sh: 1: exec: x: not found", REACH)
    assert "no launcher installed" in over_ssh.failure_reason(1, "No module named launcher\n", REACH)
    assert over_ssh.failure_reason(255, "", REACH) == "its ssh session ended with exit code 255"


def test_the_user_s_ssh_arguments_come_first_so_that_theirs_win():
    reach = over_ssh.Reach(sys.executable, "/w", port=2200, identity_file="/k", extra=("-o", "ConnectTimeout=99"))
    command = over_ssh.ssh_command("node1", reach)
    assert command[:3] == ["ssh", "-o", "ConnectTimeout=99"]
    assert command.index("BatchMode=yes") > 2 and command[command.index("-p") + 1] == "2200"
    assert command[-3:-1] == ["--", "node1"]


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
                       st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40),
                       max_size=4))
def test_the_environment_reaches_the_host_s_python_exactly_and_never_on_a_command_line(env):
    """The host's bootstrap, as its login shell runs it, in a folder whose name needs quoting; the module it becomes
    is found on the PYTHONPATH the environment carries."""
    folder = Path("/tmp/launcher test 'dir'")
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    (folder / "lib" / "envdump.py").write_text(
        "import json, os\nprint(json.dumps({k: v for k, v in os.environ.items() if k.startswith('T_')}))\n")
    env = {f"T_{k}": f"\u00ab{v}\u00bb" for k, v in env.items()}  # marked: no part of the command
    command = over_ssh.remote_command(over_ssh.Reach(sys.executable, str(folder)), module="envdump")
    assert all(v not in command for v in env.values())
    result = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=60,
                            input=over_ssh.environment({**env, "PYTHONPATH": str(folder / "lib")}))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == env


def test_a_missing_folder_is_the_remote_command_s_own_exit_code():
    reach = over_ssh.Reach(sys.executable, "/no/such/folder")
    assert subprocess.run(over_ssh.local_command(reach), input=b"", timeout=60).returncode == over_ssh.NO_FOLDER


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_no_line_a_worker_or_the_network_sends_raises_or_passes_without_the_key(data):
    for line in (data, over_ssh.MARKER + data):
        fields = over_ssh.read_line(line, "k")
        assert fields is None or fields.get("key") == "k"


def test_a_worker_printing_the_marker_cannot_pass_for_its_launcher():
    forged = over_ssh.line(key="guess", end=0)
    assert over_ssh.read_line(forged, "the session's key") is None
    assert over_ssh.read_line(over_ssh.line(key="k", end=3), "k")["end"] == 3
    assert over_ssh.read_line(over_ssh.MARKER + b"[1]\n", None) is None
    assert over_ssh.read_line(over_ssh.MARKER + b"[" * 100000 + b"\n", None) is None


def test_the_first_start_free_on_every_host_for_its_workers_is_taken():
    starts = (20000, 21000, 22000)
    assert over_ssh.common_start(starts, [[2, 9, 9], [9, 1, 9]], [3, 3]) == 22000
    assert over_ssh.common_start(starts, [[2, 9, 9], [9, 1, 2]], [3, 3]) is None
    assert over_ssh.common_start(starts, [None, "x", [True]], [1, 1, 1]) is None  # what a host said, never trusted
    assert over_ssh.candidate_starts(6070, None) == (6069,)
    drawn = over_ssh.candidate_starts(None, lambda low, high: low)
    assert len(drawn) == over_ssh.PORT_TRIES and drawn[0] == over_ssh.PORT_LOW


def test_each_host_gets_its_place_in_a_fixed_job_and_node_0_alone_prints_its_plan():
    names, counts = ["10.0.0.1", "10.0.0.2"], [2, 1]
    first = over_ssh.host_options(names, 0, counts, (0, 3), 23000)
    assert first[first.index("--cluster_node_ips") + 1] == "10.0.0.1,10.0.0.2"
    assert first[first.index("--started_port") + 1] == "23001"
    assert first[first.index("--node_workers") + 1] == "2,1"
    assert first[first.index("--selected_gpus") + 1] == "0,3"
    assert "--print_config" not in first
    second = over_ssh.host_options(names, 1, counts, None, 23000)
    assert second[second.index("--node_ip") + 1] == "10.0.0.2" and second[-2:] == ["--print_config", "false"]
    same = over_ssh.host_options(names, 1, [1, 1], None, 23000)
    assert "--node_workers" not in same


def test_an_elastic_job_s_hosts_join_node_0_s_membership():
    options = over_ssh.host_options(["fd00::1", "fd00::2"], 1, [1, 1], None, 23000, elastic=True)
    assert options[options.index("--rdzv_endpoint") + 1] == "[fd00::1]:23000"
    assert "--cluster_node_ips" not in options
    named = over_ssh.host_options(["a", "b"], 1, [1, 1], None, 23000, elastic=True, endpoint_given=True)
    assert "--rdzv_endpoint" not in named


def test_the_table_gives_ranks_in_hostfile_order_and_each_host_s_ports():
    placed = [over_ssh.Placed(0, "a", "10.0.0.1", 2), over_ssh.Placed(1, "b", "10.0.0.2", 1),
              over_ssh.Placed(2, "c", problems=("it did not answer",))]
    rows = over_ssh.table_rows(placed, 30000, elastic=False)[1:]
    assert rows[0] == ("a", "10.0.0.1", "2", "0-1", "30000-30002", "ok")
    assert rows[1] == ("b", "10.0.0.2", "1", "2", "30001-30001", "ok")
    assert rows[2] == ("c", "?", "-", "-", "-", "it did not answer")
    assert over_ssh.table_rows(placed[:1], 30000, elastic=True)[1][3] == "by round"


def test_the_outcome_is_the_nodes_code_and_cause_and_a_silent_host_is_not_a_good_end():
    cause = {"node": 1, "text": "rank 2 failed"}
    assert over_ssh.outcome([{"end": 7, "cause": cause}, {"end": 7, "cause": cause}]) == (7, cause)
    assert over_ssh.outcome([{"end": 0, "cause": None}] * 2) == (0, None)
    assert over_ssh.outcome([{"end": 0}, None]) == (255, None)
    assert over_ssh.outcome([{"end": True}, {"end": "7"}]) == (255, None)


@pytest.mark.parametrize("argv, kept", [
    (["--hostfile", "h", "--log_dir", "x", "t.py", "--hostfile", "y"], ["--log_dir", "x", "t.py", "--hostfile", "y"]),
    (["--hostfile=h", "-H", "a:1", "-Ha:2", "--ssh-args", "-F c", "--env", "A=1", "t.py"], ["t.py"]),
    (["--nproc_per_node", "2", "-m", "--started-port=7", "--", "pkg.mod"], ["-m", "--", "pkg.mod"]),
    (["--max_restarts", "--hostfile", "t.py"], ["--max_restarts", "--hostfile", "t.py"]),  # a value, not an option
    (["--config", "trial-3/trial.yaml", "--log_dir=x", "--config=c.yaml", "t.py"], ["--log_dir=x", "t.py"]),  # its text goes
])
def test_the_hosts_get_the_command_line_less_what_the_command_sets_itself(argv, kept):
    assert cluster._passed_on(argv) == kept


# ---------------------------------------------------------------- the host's end


def test_the_line_reader_gives_lines_then_times_out_then_ends():
    read, write = os.pipe()
    reader = lifeline.LineReader(read)
    os.write(write, b"one\ntw")
    assert reader.next(5) == b"one\n"
    assert reader.next(0.05) is None
    os.write(write, b"o\n")
    assert reader.next(5) == b"two\n"
    os.close(write)
    assert reader.next(5) is lifeline.EOF
    os.close(read)


@pytest.mark.parametrize("sent, expected", [
    (over_ssh.line(beat=1) + over_ssh.line(stop=int(signal.SIGINT)), signal.SIGINT),
    (over_ssh.line(stop=999999) + b"garbage\n", signal.SIGTERM),  # then the stream ends
    (b"x" * (over_ssh.MAX_LINE + 10), signal.SIGTERM),
    (None, signal.SIGTERM),  # silence
])
def test_the_lifeline_stops_the_launcher_once_with_the_right_signal(sent, expected):
    read, write = os.pipe()
    told = []
    done = threading.Event()

    def writer():
        if sent is not None:
            with os.fdopen(write, "wb") as f:
                try:
                    f.write(sent)
                except BrokenPipeError:
                    pass

    threading.Thread(target=writer, daemon=True).start()
    thread = lifeline.watch(lifeline.LineReader(read), lambda sig: (told.append(sig), done.set()), silent_after=0.2)
    assert done.wait(60)
    thread.join(60)
    assert told == [expected]
    os.close(read)
    if sent is None:
        os.close(write)


@pytest.mark.parametrize("stdin", [b"", b"garbage\n", over_ssh.line(probe="not a dict"),
                                   over_ssh.MARKER + b"{" * 50000 + b"\n"])
def test_the_host_s_launcher_ends_with_exit_2_and_no_traceback_on_a_bad_first_line(stdin):
    result = subprocess.run([sys.executable, "-m", over_ssh.REMOTE_MODULE], input=stdin, capture_output=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2 and b"Traceback" not in result.stderr


def test_the_host_s_launcher_answers_the_check_and_ends_quietly_when_no_job_follows(tmp_path):
    (tmp_path / "train.py").write_text("")
    probe = over_ssh.line(probe=over_ssh.probe_request("train.py", "missing.yaml", [1, 20000], 3, "k"))
    result = subprocess.run([sys.executable, "-m", over_ssh.REMOTE_MODULE], input=probe + b"not json\n", cwd=tmp_path,
                            capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    facts = over_ssh.read_line(result.stdout, "k")["facts"]
    assert facts["script_found"] is True and facts["config_found"] is False
    assert facts["directory"] == str(tmp_path) and len(facts["free"]) == 2
