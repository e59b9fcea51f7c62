"""Bad input is refused before anything starts: exit code 2, one sentence, no traceback, no worker."""

import os
import resource
import socket
import subprocess

import psutil
import pytest

from conftest import dumps_of_one_node, launcher_cmd, PROBE, REPO, run_launcher


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
    (["--log_level", "²"], "'²' is not a log level"),
    (["--selected_gpus", "²"], "malformed GPU id '²'"),
    (["--selected_gpus", "0,00"], "names GPU 0 twice (0 and 00); give each GPU once"),
    (["--shutdown_timeout", "nan"], "'nan' is not a number of seconds from 0 to 86400 (one day)"),
    (["--shutdown_timeout", "inf"], "'inf' is not a number of seconds from 0 to 86400 (one day)"),
    (["--shutdown_timeout", "1e300"], "'1e300' is not a number of seconds from 0 to 86400 (one day)"),
    (["--nproc_per_node", "99999999999999999999"], "give at most 65535"),
    (["--hang_timeout", "0"], "'0' is not a number of seconds from 1 to 86400 (one day); leave the option out"),
    (["--hang_timeout", "0.001"], "'0.001' is not a number of seconds from 1 to 86400"),
    (["--heartbeat_timeout", "0"], "'0' is not a number of seconds from 0.5 to 86400"),
    (["--join_timeout", "nan"], "'nan' is not a number of seconds from 0.5 to 86400"),
    (["--started_port", "nan"], "'nan' is not a port from 1 to 65535; give a whole number in that range."),
    (["--control_port", "1e3"], "'1e3' is not a port from 1 to 65535"),
    (["--max_restarts", "1.5"], "'1.5' is not a number of restarts from 0 to 1000"),
    (["--max_restarts", "-1"], "'-1' is not a number of restarts from 0 to 1000"),
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
    ("- 1\n- 2\n", "holds a list ([1, 2]), not a mapping"),
    ("nproc_per_nod: 2\n", "unknown key 'nproc_per_nod'; did you mean nproc_per_node?"),
    ("nproc_per_node: two\n", "nproc_per_node: 'two' is not a number of workers; give a whole number such as 2, or auto, gpu or cpu"),
    ("use_paddlecloud: 3\n", "use_paddlecloud expects true or false"),
    ("env: [1, 2]\n", "env must be a mapping"),
    ("nproc_per_node: 0\n", "--nproc_per_node 0 is below 1"),
    ("nproc_per_node: 2.5\n", "nproc_per_node expects a whole number, not 2.5"),
    ("nproc_per_node: .inf\n", "nproc_per_node expects a whole number, not inf"),
    ("shutdown_timeout: .inf\n", "shutdown_timeout: inf is not a number of seconds from 0 to 86400"),
    ("log_dir: 2020-01-01\n", "log_dir is a date (datetime.date(2020, 1, 1)), not text, a number or true/false; put it in quotes"),
    ("nproc_per_node: " + "[" * 600 + "]" * 600 + "\n", "nests its values too deeply"),
    ('env: {"A=B": 1}\n', "the variable name 'A=B' contains '='"),
    ('env: {"A\\0B": 1}\n', "the variable name 'A\\x00B' contains a NUL character"),
    ('env: {"": 1}\n', "env has an empty variable name"),
], ids=lambda v: v[:40] if isinstance(v, str) else None)
def test_bad_config_file(tmp_path, text, fragment):
    path = tmp_path / "job.yaml"
    if text is not None:
        path.write_text(text)
    assert fragment in refused(tmp_path, "--config", path, *probe_args(tmp_path))


@pytest.mark.parametrize("make,fragment", [
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),  # read, it would block forever
    (lambda p: os.symlink("/dev/zero", p), "is a device, not a regular file"),  # read, it never ends
    (lambda p: p.mkdir(), "is a folder, not a regular file"),
    (lambda p: p.write_text("# " + "x" * (1 << 20) + "\n"), "is larger than 1 MiB"),
], ids=["fifo", "dev-zero", "folder", "too-big"])
def test_config_file_that_is_not_a_small_regular_file(tmp_path, make, fragment):
    path = tmp_path / "job.yaml"
    make(path)
    msg = refused(tmp_path, "--config", path, *probe_args(tmp_path))
    assert f"config file {path} {fragment}; give --config a YAML file of options (at most 1 MiB)." in msg


def test_paddlecloud_variable_missing(tmp_path):
    env = {"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "PADDLE_TRAINER_ID": "0",
           "TRAINER_PORTS_NUM": "2", "POD_IP": ""}
    msg = refused(tmp_path, "--use_paddlecloud", *probe_args(tmp_path), env=env)
    assert "needs the variable POD_IP" in msg


def test_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"log_dir: \xe9t\xe9\n")  # Latin-1
    msg = refused(tmp_path, "--config", path, *probe_args(tmp_path))
    assert "is not UTF-8 text (byte 0xe9 at offset 9); save it as UTF-8" in msg


PADDLECLOUD = {"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "POD_IP": "127.0.0.1",
               "PADDLE_TRAINER_ID": "0", "PADDLE_PORT": "35019", "TRAINER_PORTS_NUM": "2"}


@pytest.mark.parametrize("env,fragment", [
    ({"DISTRIBUTED_TRAINER_ENDPOINTS": "127.0.0.1:35019,127.0.0.1:99999,127.0.0.2:35019,127.0.0.2:35020"},
     "'127.0.0.1:99999', which has the port '99999', not a whole number from 1 to 65535"),
    ({"DISTRIBUTED_TRAINER_ENDPOINTS": "127.0.0.1:0,127.0.0.1:35020,127.0.0.2:35019,127.0.0.2:35020"},
     "'127.0.0.1:0', which has the port '0', not a whole number from 1 to 65535"),
    ({"DISTRIBUTED_TRAINER_ENDPOINTS": "127.0.0.1:35019,127.0.0.1:35019,127.0.0.2:35019,127.0.0.2:35020"},
     "DISTRIBUTED_TRAINER_ENDPOINTS lists the endpoint 127.0.0.1:35019 twice"),
    ({"PADDLE_PORT": "0"}, "PADDLE_PORT=0 with 2 workers needs ports 0 to 1, outside 1-65535"),
    ({"PADDLE_PORT": "x"}, "PADDLE_PORT=x is not a whole number"),
], ids=["port-99999", "port-0", "duplicate", "paddle-port-0", "paddle-port-x"])
def test_paddlecloud_bad_ports(tmp_path, env, fragment):
    msg = refused(tmp_path, "--use_paddlecloud", "--selected_gpus=0,1", *probe_args(tmp_path),
                  env={**PADDLECLOUD, "CUDA_VISIBLE_DEVICES": "0,1", **env})
    assert fragment in msg


def test_paddlecloud_without_port_variables_runs_on_6170_as_paddle(tmp_path):
    # Paddle 1.8's own launcher test unsets PADDLE_PORT and TRAINER_PORTS_NUM and expects 6170
    env = {k: v for k, v in PADDLECLOUD.items() if k not in ("PADDLE_PORT", "TRAINER_PORTS_NUM")}
    found = dumps_of_one_node(tmp_path, 2, "--use_paddlecloud", "--selected_gpus=0,1", PROBE, "--dump", tmp_path,
                              env={**env, "CUDA_VISIBLE_DEVICES": "0,1"})
    dumps = {rank: found[rank]["env"] for rank in (0, 1)}
    assert dumps[1]["PADDLE_TRAINER_ENDPOINTS"] == "127.0.0.1:6170,127.0.0.1:6171,127.0.0.2:6170,127.0.0.2:6171"
    assert dumps[1]["PADDLE_CURRENT_ENDPOINT"] == "127.0.0.1:6171"


# ---------------------------------------------------------------- scripts that cannot run as asked


def shell_script(tmp_path, name, first_line):
    """A script that would leave a file in the dump folder if it ever ran."""
    path = tmp_path / name
    path.write_text(f"{first_line}touch {tmp_path / 'dumps' / 'started'}\n")
    path.chmod(0o755)
    return path


def test_no_python_script_without_a_shebang_line(tmp_path):
    path = shell_script(tmp_path, "exe.sh", "")
    msg = refused(tmp_path, "--no_python", path)
    assert f"training script {path} has no #! line, so the system cannot run it as a program" in msg


def test_no_python_bare_name_of_a_file_in_the_current_folder(tmp_path):
    shell_script(tmp_path, "exe.sh", "#!/bin/sh\n")
    (tmp_path / "dumps").mkdir()
    r = run_launcher("--no_python", "exe.sh", cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "training script exe.sh is not a command on PATH" in r.stderr and "write ./exe.sh" in r.stderr
    assert not list((tmp_path / "dumps").iterdir()), "a worker started"
    r = run_launcher("--no_python", "--nproc_per_node", 1, "./exe.sh", cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dumps" / "started").exists()


@pytest.mark.parametrize("name,first_line,fragment", [
    ("train.sh", "#!/bin/bash\n", "is a script for /bin/bash (its #! line), not Python; add --no_python"),
    ("train.sh", "", "looks like a shell script, not Python; add --no_python"),
], ids=["shebang", "suffix"])
def test_shell_script_without_no_python_gets_the_hint(tmp_path, name, first_line, fragment):
    assert fragment in refused(tmp_path, shell_script(tmp_path, name, first_line))


def with_open_files(soft, hard, *args):
    """The launcher run with RLIMIT_NOFILE at (soft, hard), as after ``ulimit -S -n soft``."""
    return subprocess.run(launcher_cmd(*args), capture_output=True, text=True, timeout=120, cwd=REPO,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))


def test_the_port_search_raises_the_soft_descriptor_limit_first():
    """64 workers need more than 64 descriptors, already to find their ports: the soft limit is raised first."""
    r = with_open_files(64, 4096, "--nproc_per_node", 64, "--no_python", "--print_config", "false", "/bin/true")
    assert r.returncode == 0, r.stderr
    assert "all 64 worker(s) finished" in r.stderr


def test_a_hard_descriptor_limit_too_low_names_the_ulimit_to_ask_for():
    r = with_open_files(64, 64, "--nproc_per_node", 64, "--no_python", "/bin/true")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "but the limit is 64 (ulimit -n); raise it (ulimit -n " in r.stderr and "ports" not in r.stderr


STORE_WHEN_TOLD = """\
import os, sys, time
if os.environ["RANK"] == "0":
    print("waiting", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.02)
    import torch.distributed as dist
    dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, True)
    print("store up", flush=True)
"""


def test_what_the_reserved_rank_0_port_keeps_off(tmp_path):
    """docs/logs.md, Guarantees: held with SO_REUSEADDR and not listening, MASTER_PORT refuses a bind
    without SO_REUSEADDR (and the kernel never picks it for port 0), while a program that sets
    SO_REUSEADDR itself can bind and listen on it, as rank 0's TCPStore does (--agent_store off: rank 0 hosts it)."""
    script, go = tmp_path / "store.py", tmp_path / "go"
    script.write_text(STORE_WHEN_TOLD)
    proc = subprocess.Popen(launcher_cmd("--agent_store", "off", "--nproc_per_node", 2, "--print_config", "false",
                                         script, go),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "[rank 0] waiting\n"  # rank 0 runs; the port is held
        rank_0 = next(p for p in psutil.Process(proc.pid).children() if p.environ().get("RANK") == "0")
        port = int(rank_0.environ()["MASTER_PORT"])
        with socket.socket() as s:
            with pytest.raises(OSError):
                s.bind(("127.0.0.1", port))
        with socket.socket() as s:  # not covered: SO_REUSEADDR, which most servers set
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        go.touch()
        proc.kill()
    assert proc.returncode == 0, err
    assert "[rank 0] store up" in out
