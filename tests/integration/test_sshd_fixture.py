"""The real-sshd test helper (tests/sshd.py) itself: the real ssh client reaches every host through it with its
config file alone, each failure host fails as it says (exit 255 and the exact stderr a launcher maps to a reason),
and nothing it started outlives it: no sshd, no session, no listener."""

import subprocess

import psutil
import pytest

from conftest import alive, assert_all_gone, listening, wait_for
from sshd import SshdError, ssh_hosts, ssh_hosts_factory, start_sshd, started_sshd  # noqa: F401 - the fixtures

CONNECT_TIMEOUT = 3


def run_all(commands, timeout=60):
    """Run the commands at once; (returncode, stdout, stderr) of each."""
    procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, *output) for p, output in zip(procs, outputs)]


def test_ssh_runs_a_command_on_each_host_at_its_own_address(ssh_hosts):
    """The session of ``ssh HOST`` arrives on HOST (its SSH_CONNECTION names it), not on another address."""
    results = run_all(ssh_hosts.ssh_command(host, "echo $SSH_CONNECTION") for host in ssh_hosts.hosts)
    assert [(code, err) for code, _, err in results] == [(0, "")] * 3
    assert [out.split()[2:] for _, out, _ in results] == [[host, str(ssh_hosts.port)] for host in ssh_hosts.hosts]
    assert ssh_hosts.ssh_args == ("-F", str(ssh_hosts.config))


def test_each_failure_host_fails_with_its_own_message(ssh_hosts):
    names = [*ssh_hosts.failure_hosts, "unresolvable"]
    hosts = [ssh_hosts.failure_hosts.get(name, "no-such-host.invalid") for name in names]
    results = run_all(ssh_hosts.ssh_command(host, "true", connect_timeout=CONNECT_TIMEOUT) for host in hosts)
    got = {name: (code, err) for name, (code, _, err) in zip(names, results)}
    assert got == {name: (255, ssh_hosts.expected_stderr(name)) for name in names}
    assert len(ssh_hosts.silent.connections) == 1  # the silent host did accept the connection


def test_more_than_16_addresses_take_several_sshd_on_one_port(ssh_hosts_factory):
    servers = ssh_hosts_factory(hosts=20, failures=False)
    assert len(servers.pids) == 2 and servers.hosts[-1] == "127.0.0.20"
    results = run_all(servers.ssh_command(host, "true") for host in ("127.0.0.16", "127.0.0.17", "127.0.0.20"))
    assert [(code, err) for code, _, err in results] == [(0, "")] * 3
    assert not listening("127.0.0.21", servers.port)


def test_nothing_it_started_is_left_after_it_ends(tmp_path):
    """A session still running (and the command it runs), every sshd and the silent listener: all gone at the end,
    without a signal to anything but what the helper started."""
    with started_sshd(tmp_path) as start:
        servers = start()
        client = subprocess.Popen(servers.ssh_command(servers.hosts[1], "sleep 300"), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sleeper = []

        def session_runs():
            sleeper[:] = [p for pid in servers.pids for p in psutil.Process(pid).children(recursive=True)
                          if p.name() == "sleep"]
            return sleeper

        wait_for(session_runs, 30, what="the session's command")
        pids = servers.pids + [p.pid for pid in servers.pids for p in psutil.Process(pid).children(recursive=True)]
        silent = (servers.failure_hosts["silent"], servers.port)
        assert all(alive(pid) for pid in pids) and listening(*silent)
    assert_all_gone(pids)
    assert not listening(*silent)
    assert client.wait(timeout=30) != 0  # its session ended under it
    assert sleeper[0].pid in [pid for pid, _ in servers.leftovers]


def test_hosts_must_be_loopback_addresses(tmp_path):
    with pytest.raises(SshdError, match="loopback"):
        start_sshd(tmp_path, ["127.0.0.2", "10.1.2.3"])


def test_hostfile_lists_every_host_with_its_slots(ssh_hosts, tmp_path):
    path = ssh_hosts.hostfile(tmp_path / "hostfile", slots=2)
    assert path.read_text() == "127.0.0.1 slots=2\n127.0.0.2 slots=2\n127.0.0.3 slots=2\n"
