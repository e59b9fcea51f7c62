"""The command line itself: help, spellings, and no torch in the launcher process."""

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from conftest import PROBE, REPO, assert_refused_in_one_line, read_dumps, start_launcher
from launcher import __version__
from launcher.cli.main import launch, prog_name


def test_help_reads_like_torchrun_and_paddle():
    r = CliRunner().invoke(launch, ["--help"])
    assert r.exit_code == 0
    assert "Every option takes underscores or dashes" in r.output
    for option in ("--cluster_node_ips", "--node_ip", "--started_port",
                   "--selected_gpus", "--log_dir", "--use_paddlecloud", "--print_config", "--log_level",
                   "--nproc_per_node", "--config", "-m, --module", "--no_python", "--shutdown_timeout"):
        assert option in r.output
    assert "[TRAINING_SCRIPT_ARGS]..." in r.output


def test_launcher_modules_do_not_import_torch():
    code = ("import sys; import launcher.cli.main, launcher.plan.planner, launcher.host.preflight, launcher.run.attempts, "
            "launcher.output.console, launcher.output.sinks, launcher.output.reports, launcher.cli.config_file, launcher.run.watchdog, launcher.output.state_file, launcher.tools.status, launcher.tools.logs; "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "False", r.stderr


def test_running_launcher_has_no_torch_mapped(tmp_path):
    launcher = start_launcher("--nproc_per_node", 1, PROBE, "--dump", tmp_path, "--sleep", 30)
    try:
        read_dumps(tmp_path, 1)
        maps = open(f"/proc/{launcher.pid}/maps").read()
        assert "python" in maps and "torch" not in maps
    finally:
        launcher.terminate()
        launcher.communicate(timeout=30)
    assert launcher.returncode == 143


def test_version():
    r = CliRunner().invoke(launch, ["--version"], prog_name="launcher")
    assert r.exit_code == 0 and r.output == f"launcher {__version__}\n"
    r = subprocess.run([sys.executable, "-m", "launcher", "--version"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout == f"python -m launcher {__version__}\n", r.stderr


def test_console_script_shows_its_own_name():
    # what pip's console_scripts wrapper does: argv[0] is the program's path, then main()
    code = "import sys; sys.argv[0] = '/usr/local/bin/launcher'; from launcher.cli.main import main; main()"
    help_text = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd=REPO).stdout
    assert help_text.startswith("Usage: launcher [OPTIONS]"), help_text
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "usage: launcher [OPTIONS] training_script" in r.stderr, r.stderr
    assert "python -m" not in r.stderr


def test_prog_name():
    assert prog_name("/usr/local/bin/launcher") == "launcher"
    assert prog_name("/src/launcher/__main__.py") == "python -m launcher"
    assert prog_name("") == "python -m launcher"


@pytest.mark.parametrize("value", ["²", "٢٠", "20.0", "9", "41", ""])
def test_log_level_refuses_what_is_not_a_level(value):
    r = CliRunner().invoke(launch, ["--log_level", value, "train.py"], standalone_mode=False)
    assert isinstance(r.exception, click.BadParameter) and "is not a log level" in r.exception.message


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "86401", "-1", "²", "soon"])
def test_shutdown_timeout_refuses_what_the_stop_sequence_cannot_wait_for(value):
    r = CliRunner().invoke(launch, ["--shutdown_timeout", value, "train.py"], standalone_mode=False)
    assert isinstance(r.exception, click.BadParameter)
    assert "is not a number of seconds from 0 to 86400 (one day)" in r.exception.message


@pytest.mark.parametrize("value,seconds", [("0", 0.0), ("2.5", 2.5), ("86400", 86400.0)])
def test_shutdown_timeout_accepts_a_day_at_most(value, seconds):
    ctx = launch.make_context("launcher", ["--shutdown_timeout", value, "train.py"])
    assert ctx.params["shutdown_timeout"] == seconds


@pytest.mark.parametrize("args, sentence", [
    (("--servers", "::1:6170", "--workers", "127.0.0.1:6171"), "--servers has the endpoint '::1:6170', which has no "
     "port (an IPv6 address takes its port in brackets: [::1:6170]:PORT); give comma-separated host:port pairs such as "
     "10.0.0.1:6170."),
    (("--servers", "127.0.0.1:0", "--workers", "127.0.0.1:6171"), "--servers has the endpoint '127.0.0.1:0', which has "
     "the port '0', not a whole number from 1 to 65535; give comma-separated host:port pairs such as 10.0.0.1:6170."),
    (("--nnodes", "2:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", "[::1"), "--rdzv-endpoint [::1 has the endpoint "
     "'[::1', which is not HOST:PORT; give etcd's address and client port, such as 10.0.0.1:2379."),
    (("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "1"), "--cluster_env auto "
     "(found torchrun's options): --master-port 1 leaves no port below it to gather the node list on; give one with "
     "--control_port."),
])
def test_a_bad_address_exits_2_with_one_sentence_whichever_option_holds_it(tmp_path, args, sentence):
    assert_refused_in_one_line(tmp_path, args, sentence)
