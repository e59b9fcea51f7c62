"""Bad input is refused before anything starts: exit code 2, one sentence, no worker (CONTRACT section 8)."""

import os
import socket

import pytest

from conftest import PROBE, run_launcher


def refused(tmp_path, *args, env=None):
    """Run the launcher with a probe that would leave a dump; assert nothing started; the message."""
    dump = tmp_path / "dumps"
    dump.mkdir(exist_ok=True)
    r = run_launcher(*args, env=env)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert not list(dump.iterdir()), "a worker started"
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("launcher: error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def probe_args(tmp_path):
    return [PROBE, "--dump", tmp_path / "dumps"]


@pytest.mark.parametrize("args,fragment", [
    (["--cluster_node_ips", "127.0.0.1,127.0.0.300"], "malformed address '127.0.0.300'"),
    (["--cluster_node_ips", "127.0.0.1,127.0.0.1"], "lists 127.0.0.1 twice"),
    (["--cluster_node_ips", "127.0.0.2,127.0.0.3"], "--node_ip 127.0.0.1 is not in --cluster_node_ips 127.0.0.2,127.0.0.3"),
    # 192.0.2.1 is a documentation address: only compared with this machine's, never contacted
    (["--cluster_node_ips", "192.0.2.1", "--node_ip", "192.0.2.1"], "--node_ip 192.0.2.1 is not an address of this machine"),
    (["--started_port", "70000"], "70000"),
    (["--started_port", "65535", "--nproc_per_node", "2"], "outside 1-65535"),
    (["--selected_gpus", "0,x"], "malformed GPU id 'x'"),
    (["--selected_gpus", "1,1"], "names GPU 1 twice"),
    (["--nproc_per_node", "0"], "--nproc_per_node 0 is below 1"),
    (["--log_level", "LOUD"], "'LOUD' is not a log level"),
    (["--print_config", "maybe"], "maybe"),
])
def test_bad_options(tmp_path, args, fragment):
    assert fragment in refused(tmp_path, *args, *probe_args(tmp_path))


def test_unknown_gpu_of_cuda_visible_devices(tmp_path):
    msg = refused(tmp_path, "--selected_gpus", "3", *probe_args(tmp_path), env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "GPU 3 of --selected_gpus=3 is not in CUDA_VISIBLE_DEVICES=0,1" in msg


def test_missing_script(tmp_path):
    msg = refused(tmp_path, tmp_path / "nope.py")
    assert f"training script {tmp_path / 'nope.py'} does not exist" in msg
    assert "no training script given" in refused(tmp_path)


def test_port_in_use_names_the_process_holding_it(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        msg = refused(tmp_path, "--started_port", port, "--nproc_per_node", 1, *probe_args(tmp_path))
    assert f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in msg


def test_log_dir_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    msg = refused(tmp_path, "--log_dir", blocker / "logs", *probe_args(tmp_path))
    assert "cannot be created" in msg and str(blocker) in msg


@pytest.mark.parametrize("text,fragment", [
    (None, "does not exist"),
    ("nproc_per_node: [1\n", "is not valid YAML at line"),
    ("- 1\n- 2\n", "holds a list, not a mapping"),
    ("nproc_per_nod: 2\n", "unknown key 'nproc_per_nod'; did you mean nproc_per_node?"),
    ("nproc_per_node: two\n", "nproc_per_node: 'two' is not a valid integer"),
    ("use_paddlecloud: 3\n", "use_paddlecloud expects true or false"),
    ("env: [1, 2]\n", "env must be a mapping"),
    ("nproc_per_node: 0\n", "--nproc_per_node 0 is below 1"),
])
def test_bad_config_file(tmp_path, text, fragment):
    path = tmp_path / "job.yaml"
    if text is not None:
        path.write_text(text)
    assert fragment in refused(tmp_path, "--config", path, *probe_args(tmp_path))


def test_paddlecloud_variable_missing(tmp_path):
    env = {"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "PADDLE_TRAINER_ID": "0",
           "TRAINER_PORTS_NUM": "2", "POD_IP": ""}
    msg = refused(tmp_path, "--use_paddlecloud", *probe_args(tmp_path), env=env)
    assert "needs the variable POD_IP" in msg
