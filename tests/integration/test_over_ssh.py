"""The whole cluster from one command (docs/cluster-ssh.md): `python -m launcher --hostfile FILE` against a real sshd
of the test's own (tests/sshd.py) on loopback addresses, each host a real launcher over a real ssh session.

The workers never import torch: what is checked is the launcher's. One sshd serves the module.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from launcher.plan.tune_rate import Series
from launcher.run.tune_trial import TrialReports
from sshd import FAILURE_ADDRESSES, UNRESOLVABLE, started_sshd

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]  # never 127.0.0.1: this machine's own address runs without ssh
SECRET = "s3cret value with 'quotes', \"double\", $HOME and\na newline"
WORKER = textwrap.dedent("""\
    import json, os, sys, time
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "PADDLE_TRAINER_ENDPOINTS",
             "PADDLE_CURRENT_ENDPOINT", "MYSECRET", "FROM_FILE", "HOSTNAME_SEEN")
    seen = {n: os.environ.get(n) for n in names}
    secret = os.environ.get("MYSECRET")
    on_a_command_line = []
    if secret:
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if secret.encode() in f.read().replace(b"\\0", b" "):
                        on_a_command_line.append(pid)
            except OSError:
                pass
    seen["on_a_command_line"] = on_a_command_line
    print("WORKER " + json.dumps(seen), flush=True)
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        sys.exit(7)
    deadline = time.monotonic() + 120
    while os.environ.get("GO") and not os.path.exists(os.environ["GO"]) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the test says go (within a bound)
    if os.environ.get("SLEEP"):
        open(f"{os.environ['MARKS']}/{os.getpid()}", "w").close()
        time.sleep(float(os.environ["SLEEP"]))
    if os.environ.get("STEPS"):
        from launcher.runtime import report  # imports no torch
        forged = json.dumps({"rank": 99, "step": 777, "t": 1.0})
        print("\x1elauncher-over-ssh " + json.dumps({"reports": [forged]}), flush=True)  # a relay without the key
        for step in range(int(os.environ["STEPS"])):
            report(step=step)
            time.sleep(0.05)
""")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with started_sshd(tmp_path_factory.mktemp("sshd")) as start:
        yield start(HOSTS)


@pytest.fixture
def job(tmp_path, hosts):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "marks").mkdir()
    return Job(tmp_path, hosts)


class Job:
    def __init__(self, folder: Path, hosts) -> None:
        self.folder, self.hosts = folder, hosts
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "MARKS": str(folder / "marks")}

    def command(self, *options, hostfile: str = None, script: str = "worker.py") -> list:
        places = ["--hostfile", hostfile] if hostfile else []
        return [sys.executable, "-m", "launcher", *places, "--ssh_args", f"-F {self.hosts.config}",
                "--ssh_connect_timeout", "5", *options, script]

    def hostfile(self, text: str) -> str:
        path = self.folder / "hosts.txt"
        path.write_text(text)
        return str(path)

    def run(self, *options, hostfile: str = None, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*options, hostfile=hostfile), cwd=self.folder, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    def start(self, *options, hostfile: str = None, env=None) -> subprocess.Popen:
        return subprocess.Popen(self.command(*options, hostfile=hostfile), cwd=self.folder,
                                env={**self.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def marks(self) -> list:
        return [int(p.name) for p in (self.folder / "marks").iterdir()]


def workers_seen(output: str) -> list:
    return sorted((json.loads(line.split("WORKER ", 1)[1]) for line in output.splitlines() if "WORKER " in line),
                  key=lambda seen: int(seen["RANK"]))


def started(job, head) -> list:
    """The pids of the job's 3 workers once each has started; the command's output if it ended first."""
    def ready():
        if head.poll() is not None:
            raise AssertionError(f"the command ended ({head.returncode}) before every worker started:\n"
                                 f"{head.stdout.read()}")
        return len(job.marks()) == 3 and job.marks()
    return wait_for(ready, "every worker started", bound=120)


def wait_for(condition, what: str, bound: float = 60.0):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {bound} s: {what}")


def alive(pids) -> list:
    """The pids still running (a zombie is not); one that ends while it is looked at is not either."""
    return [pid for pid in pids if _running(pid)]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_hosts_of_different_sizes_make_one_job_with_ranks_in_hostfile_order_and_the_environment_exact(job, tmp_path):
    hostfile = job.hostfile("127.0.0.2 slots=2   # DeepSpeed's form\n127.0.0.3:1\n127.0.0.4\n")
    (tmp_path / "job.env").write_text("FROM_FILE=a line of = and # kept\n")
    result = job.run("--nproc_per_node", "1", "--env_file", "job.env", hostfile=hostfile,
                     env={"MYSECRET": SECRET, "HOSTNAME_SEEN": "not carried?"})
    assert result.returncode == 0, result.stderr
    assert "host       address    workers  ranks  ports" in result.stderr
    table = " ".join(result.stderr.split("\n[")[0].split())
    first, last = map(int, re.search(r"127\.0\.0\.2 127\.0\.0\.2 2 0-1 (\d+)-(\d+) ok", table).groups())
    assert last == first + 2  # node 0: the control port, then its two workers' ports
    assert f"127.0.0.3 127.0.0.3 1 2 {first + 1}-{first + 1} ok" in table
    seen = workers_seen(result.stdout + result.stderr)
    assert [(w["RANK"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"], w["GROUP_RANK"]) for w in seen] == [
        ("0", "0", "2", "0"), ("1", "1", "2", "0"), ("2", "0", "1", "1"), ("3", "0", "1", "2")]
    endpoints = seen[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert [e.rsplit(":", 1)[0] for e in endpoints] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert [w["PADDLE_CURRENT_ENDPOINT"] for w in seen] == endpoints
    assert all(w["WORLD_SIZE"] == "4" and w["MYSECRET"] == SECRET for w in seen)
    assert all(w["FROM_FILE"] == "a line of = and # kept" for w in seen)
    assert all(w["on_a_command_line"] == [] for w in seen)  # the values went over stdin
    assert "[127.0.0.3] launcher:" not in result.stderr or "[127.0.0.3]   " not in result.stderr  # one plan table


def test_every_way_a_host_fails_the_check_is_named_and_nothing_starts_anywhere(job):
    failing = {**FAILURE_ADDRESSES, "unresolvable": UNRESOLVABLE}
    hostfile = job.hostfile("".join(f"{host}\n" for host in ["127.0.0.2", *failing.values()]))
    result = job.run("--nproc_per_node", "1", hostfile=hostfile, env={"SLEEP": "30"})
    assert result.returncode == 2, result.stderr
    reasons = {"refuses_key": "it refuses the key", "asks_password": "it asks for a password",
               "silent": "never answered ssh", "unknown_key": "its host key is not known here",
               "refused": "it refuses connections on the ssh port", "unresolvable": "its name does not resolve"}
    table = result.stderr.split("launcher: error:")[0]
    for name, host in failing.items():
        line = next(line for line in table.splitlines() if line.startswith(host))
        assert reasons[name] in line, (name, line)
    assert "127.0.0.2 127.0.0.2 1 0 - ok" in " ".join(table.split())  # no ports: nothing starts
    assert "cannot take part" in result.stderr and "nothing was started" in result.stderr
    assert "Traceback" not in result.stderr
    assert job.marks() == []


def test_a_worker_failing_on_one_host_stops_every_host_with_its_code_and_names_host_and_rank(job):
    result = job.run("--nproc_per_node", "1", hostfile=job.hostfile("\n".join(HOSTS)), env={"FAIL_RANK": "1"})
    assert result.returncode == 7, result.stderr
    assert "rank 1 on node 1 (127.0.0.3) failed (exit code 7), on host 127.0.0.3; exit code 7" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_the_command_stopped_or_killed_leaves_nothing_running_on_any_host(job, sig):
    head = job.start("--nproc_per_node", "1", hostfile=job.hostfile("\n".join(HOSTS)), env={"SLEEP": "300"})
    try:
        marks = started(job, head)
        head.send_signal(sig)
        out, _ = head.communicate(timeout=60)
        wait_for(lambda: not alive(marks), "every worker stopped")
        if sig == signal.SIGINT:
            assert head.returncode == 130, out
            assert "the job stopped: node 0 (127.0.0.2) received SIGINT" in out
    finally:
        head.kill()
        head.wait()


def test_two_jobs_on_the_same_hosts_at_once_need_no_port_option(job):
    hostfile = job.hostfile("\n".join(HOSTS))
    heads = [job.start("--nproc_per_node", "1", hostfile=hostfile) for _ in range(2)]
    for head in heads:
        out, _ = head.communicate(timeout=120)
        assert head.returncode == 0, out


def test_a_taken_port_given_by_the_user_is_refused_naming_it(job):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.3", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = job.run("--nproc_per_node", "1", "--started_port", str(port), hostfile=job.hostfile("\n".join(HOSTS)))
    assert result.returncode == 2
    assert f"--started_port {port} (and the control port {port - 1} before it) is not free on every host" in result.stderr


@pytest.mark.parametrize("options, sentence", [
    (["--hostfile", "hosts.txt", "--cluster_node_ips", "127.0.0.2"], "--cluster_node_ips cannot be given with --hostfile"),
    (["--hostfile", "missing.txt"], "--hostfile missing.txt does not exist"),
    (["--hosts", "127.0.0.2:0"], "--hosts"),
    (["--hosts", "127.0.0.2", "--include", "127.0.0.9"], "127.0.0.9"),
])
def test_bad_input_is_refused_with_exit_2_and_one_sentence(job, options, sentence):
    job.hostfile("127.0.0.2\n")
    result = subprocess.run([sys.executable, "-m", "launcher", *options, "worker.py"], cwd=job.folder, env=job.env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert sentence in result.stderr and "Traceback" not in result.stderr


def test_a_bad_hostfile_line_is_refused_with_its_number(job):
    result = job.run(hostfile=job.hostfile("127.0.0.2 slots=2\n127.0.0.3 slots=two\n"))
    assert result.returncode == 2
    assert "hosts.txt:2" in result.stderr and "Traceback" not in result.stderr


def test_localhost_runs_without_ssh(job):
    result = subprocess.run([sys.executable, "-m", "launcher", "--hosts", "localhost:2", "worker.py"], cwd=job.folder,
                            env={**job.env, "MYSECRET": SECRET}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [w["RANK"] for w in workers_seen(result.stdout)] == ["0", "1"]


def test_a_silent_command_as_on_a_lost_network_makes_every_host_stop_its_workers_by_itself(job):
    head = job.start("--nproc_per_node", "1", hostfile=job.hostfile("\n".join(HOSTS)), env={"SLEEP": "300"})
    try:
        marks = started(job, head)
        head.send_signal(signal.SIGSTOP)  # its ssh clients keep their connections: the hosts hear nothing
        wait_for(lambda: not alive(marks), "every worker stopped by its own launcher", bound=180)
    finally:
        head.kill()
        head.wait()


def test_the_hosts_and_ssh_options_may_come_from_the_config_file_which_each_host_is_sent(job, tmp_path):
    """Each host's launcher reads the command's config file as sent with the job (a file of its own: here the hosts
    share the folder, so the file is changed once the command has read it). And --report_log there (as in a tuner's
    trial): each host's reports relayed to the command's log dir, which keeps none of the workers' forged relays."""
    job.hostfile("\n".join(HOSTS))
    (tmp_path / "job.yaml").write_text(f"hostfile: hosts.txt\nssh_args: -F {job.hosts.config}\nnproc_per_node: 1\n"
                                       "log_dir: logs\nreport_log: true\n")
    command = subprocess.Popen([sys.executable, "-m", "launcher", "--config", "job.yaml", "worker.py"], cwd=tmp_path,
                               env={**job.env, "STEPS": "10"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = command.stderr.readline()  # the check's table: the command has read its config
    (tmp_path / "job.yaml").write_text("nproc_per_node: 5\n")  # what a host reading the file itself would take
    out, err = command.communicate(timeout=120)
    result = subprocess.CompletedProcess(command.args, command.returncode, out, first + err)
    assert result.returncode == 0, result.stderr
    assert [w["RANK"] for w in workers_seen(result.stdout + result.stderr)] == ["0", "1", "2"]
    for node in (0, 1, 2):  # node 0 is a host over ssh too
        relayed = [json.loads(line) for line in open(tmp_path / "logs" / f"reports.node{node}.relayed.jsonl")]
        assert {r["rank"] for r in relayed} == {node} and relayed[-1]["step"] == 9, relayed
    for path in (tmp_path / "logs").glob("reports.node*"):
        assert "777" not in path.read_text(), path  # the workers' forged relays are kept nowhere


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("nodes", [(), ("--nnodes", "2:2")], ids=["fixed", "elastic"])
def test_tune_over_ssh_measures_each_trial_on_every_host(job, tmp_path, nodes):
    tunable = REPO / "tests" / "integration" / "workers" / "tunable.py"  # 0.04 s a step: 25 steps/s a rank at most
    (tmp_path / "space.yaml").write_text("metric: samples\ntrial_seconds: 15\nrepeats: 1\nknobs:\n"
                                         "  arg.--batch-size: [8, 32]\n")
    command = [sys.executable, "-m", "launcher", "tune", "--space", "space.yaml", "--hostfile",
               job.hostfile("\n".join(HOSTS[:2])), *job.command("--nproc_per_node", "1", "--log_dir", "logs", *nodes,
                                                                  script=str(tunable))[3:]]
    done = subprocess.run(command, cwd=tmp_path, env=job.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    history = [json.loads(line) for line in open(tmp_path / "logs" / "tune.jsonl")]
    assert len(history) == 3 and all(h["rate"] for h in history), history
    for h in history:  # samples/s above what one rank can make: both hosts' ranks summed
        batch = dict(h["point"]).get("arg.--batch-size", 16)
        assert h["rate"]["rate"] > 1.25 * batch * 25, h
    assert "tune: best: arg.--batch-size=32" in done.stdout, done.stdout
    relayed = tmp_path / "relayed"  # the hosts' relayed files alone (here the hosts' own are in the folder too)
    relayed.mkdir()
    for path in (tmp_path / "logs" / "trial-3").glob("reports.node*.relayed.jsonl"):
        (relayed / path.name).write_bytes(path.read_bytes())
    series = Series("samples", 0)
    TrialReports(str(relayed)).read_into(series)
    assert set(series.ranks) == {0, 1} and series.rate().rate > 1.25 * 32 * 25


def test_an_elastic_job_over_ssh_forms_from_its_hosts_and_those_past_max_wait_as_spares(job):
    go = job.folder / "go"  # the workers wait for it: the job cannot end before the third host has come
    out, err = job.folder / "out.txt", job.folder / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        head = subprocess.Popen(job.command("--nproc_per_node", "1", "--nnodes", "1:2",
                                            hostfile=job.hostfile("\n".join(HOSTS))),
                                cwd=job.folder, env={**job.env, "GO": str(go)}, stdout=stdout, stderr=stderr)
    try:
        wait_for(lambda: "waits as a standby" in err.read_text() or head.poll() is not None,
                 "a host past the job's 2 waiting as a standby", bound=120)
    finally:
        go.touch()
        try:
            head.wait(timeout=120)
        finally:
            head.kill()  # nothing when it has ended
    result = subprocess.CompletedProcess(head.args, head.returncode, out.read_text(), err.read_text())
    assert result.returncode == 0, result.stderr
    assert "by round" in result.stderr  # ranks follow each round, not the hostfile
    seen = workers_seen(result.stdout + result.stderr)  # a round of one node may come first on a busy machine
    assert {w["RANK"] for w in seen} == {"0", "1"} and seen[-1]["WORLD_SIZE"] == "2", result.stderr
    assert "waits as a standby" in result.stderr and "the job ended without this launcher" in result.stderr, result.stderr
