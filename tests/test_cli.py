"""The command line itself: help, spellings, and no torch in the launcher process."""

import subprocess
import sys

from click.testing import CliRunner

from conftest import PROBE, REPO, read_dumps, start_launcher
from launcher.cli import launch


def test_help_reads_like_torchrun_and_paddle():
    r = CliRunner().invoke(launch, ["--help"])
    assert r.exit_code == 0
    for option in ("--cluster_node_ips, --cluster-node-ips", "--node_ip, --node-ip", "--started_port",
                   "--selected_gpus", "--log_dir", "--use_paddlecloud", "--print_config", "--log_level",
                   "--nproc_per_node", "--config", "-m, --module", "--no_python", "--shutdown_timeout"):
        assert option in r.output
    assert "[TRAINING_SCRIPT_ARGS]..." in r.output


def test_launcher_modules_do_not_import_torch():
    code = ("import sys; from launcher import cli, plan, preflight, supervisor, logs, config, watchdog; "
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
