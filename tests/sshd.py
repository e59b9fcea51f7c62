"""A real sshd for tests and the bench, on loopback addresses (127.0.0.x) only.

    from sshd import ssh_hosts, ssh_hosts_factory   # the fixtures
    from sshd import started_sshd, start_sshd        # or by hand (a module's fixture, the bench), then close()

``start_sshd(folder, hosts=3)`` runs the machine's own ``/usr/sbin/sshd -D -e -f CONFIG`` with everything of its
own under ``folder``: a host key and a client key (ssh-keygen, ed25519), an authorized_keys file, a free port, a
PidFile, ``UsePAM no``, ``StrictModes no``, ``PermitRootLogin prohibit-password`` (the tests run as root), limits
high enough for 128 hosts connecting at once. It listens on every address of ``hosts`` (a count: 127.0.0.1 to
127.0.0.N; or a list of loopback addresses), all on the same port; sshd takes at most 16 ListenAddress, so a
process per 16 addresses (and one more for the failure hosts). It never reads /etc/ssh or ~/.ssh, nor touches the
machine's own sshd.

The :class:`SshHosts` it returns has ``hosts`` (the addresses that work), ``port``, ``config`` (a client config
file: the client key, a known_hosts file with every working address's host key, ``StrictHostKeyChecking yes``,
``BatchMode yes``) and ``ssh_args`` (``("-F", config)``: what a launcher passes to ssh, ``--ssh_args "-F FILE"``).
``ssh(host, *command)`` runs the real ssh client with them. ``failures=True`` (the default) adds a host for each
way a host can fail, each on an address of its own (``failure_hosts``, by name):

    refuses_key    sshd there authorizes no key:      ``root@127.0.99.1: Permission denied (publickey).``
    asks_password  sshd there takes passwords only:   ``root@127.0.99.2: Permission denied (password).``
    silent         accepts connections, never speaks: ``Connection timed out during banner exchange`` (after
                   ssh's ConnectTimeout)
    unknown_key    a working sshd whose host key is not in the known_hosts file:
                   ``No ED25519 host key is known for [127.0.99.4]:PORT and you have requested strict checking.``
                   and ``Host key verification failed.`` (two lines)
    refused        nothing listens:                   ``ssh: connect to host 127.0.99.5 port PORT: Connection refused``

and ``UNRESOLVABLE``, a name that never resolves: ``ssh: Could not resolve hostname no-such-host.invalid: Name or
service not known``. Every line ends with a newline; ssh exits 255 for each (``EXPECTED_STDERR`` has them).

``close()`` ends every sshd it started (SIGTERM to its pid, then wait; SIGKILL after 10 s) and every process still
running under them (the sessions, and what the sessions started), and the silent listener; safe to call twice.
A session's environment is sshd's own (HOME, USER, SHELL, PATH=/usr/local/sbin:/usr/local/bin:..., SSH_CLIENT,
SSH_CONNECTION, SHLVL), whatever the test's is: the command's own variables reach a host only if it sends them. The
fixtures skip the test when sshd, ssh or ssh-keygen is missing.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterable, Union

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # sshd (as root) refuses to start without it
MAX_LISTEN = 16  # sshd's limit of ListenAddress lines
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
FAILURE_ADDRESSES = {"refuses_key": "127.0.99.1", "asks_password": "127.0.99.2", "silent": "127.0.99.3",
                     "unknown_key": "127.0.99.4", "refused": "127.0.99.5"}
UNRESOLVABLE = "no-such-host.invalid"
# What ``ssh -F CONFIG -o ConnectTimeout=T HOST true`` writes on stderr for each failure host (exit code 255).
EXPECTED_STDERR = {
    "refuses_key": "{user}@{host}: Permission denied (publickey).\n",
    "asks_password": "{user}@{host}: Permission denied (password).\n",
    "silent": "Connection timed out during banner exchange\n",
    "unknown_key": ("No ED25519 host key is known for [{host}]:{port} and you have requested strict checking.\n"
                    "Host key verification failed.\n"),
    "refused": "ssh: connect to host {host} port {port}: Connection refused\n",
    "unresolvable": "ssh: Could not resolve hostname {host}: Name or service not known\n",
}
# KexAlgorithms: curve25519 costs the client 11 ms of CPU a connection, sntrup761x25519 (the default) 78 ms: at 128
# hosts on 2 cores, seconds. SetEnv SHLVL=1: bash run by sshd reads ~/.bashrc only as a top-level shell (SHLVL below
# 2 once it adds one), and the machine's ~/.bashrc may run anything (pyenv init here: 0.1 s of CPU a session).
SERVER_OPTIONS = """\
Port {port}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
MaxStartups 1024
KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org
MaxSessions 256
X11Forwarding no
PrintMotd no
PrintLastLog no
SetEnv SHLVL=1
LogLevel {log_level}
"""
FAILURE_MATCHES = """\
Match LocalAddress {refuses_key}
    AuthorizedKeysFile none
Match LocalAddress {asks_password}
    PubkeyAuthentication no
    PasswordAuthentication yes
    AuthenticationMethods password
"""
CLIENT_OPTIONS = """\
Port {port}
User {user}
IdentityFile {client_key}
IdentitiesOnly yes
UserKnownHostsFile {known_hosts}
GlobalKnownHostsFile /dev/null
StrictHostKeyChecking yes
BatchMode yes
LogLevel ERROR
"""


def missing_tools() -> list:
    """The programs these servers need that are not there (empty when all are)."""
    found = {"sshd": os.access(SSHD, os.X_OK), "ssh": shutil.which("ssh"), "ssh-keygen": shutil.which("ssh-keygen")}
    return [name for name, there in found.items() if not there]


def loopback_addresses(count: int, first: int = 1) -> list:
    """``count`` loopback addresses from 127.0.0.FIRST on (past 127.0.0.254, 127.0.1.1 and so on)."""
    return [f"127.0.{n // 254}.{n % 254 + 1}" for n in range(first - 1, first - 1 + count)]


class SshdError(RuntimeError):
    pass


class SilentHost:
    """A TCP listener that accepts connections and never writes a byte: a host that hangs ssh before its banner."""

    def __init__(self, address: str, port: int) -> None:
        self.listener = socket.create_server((address, port), backlog=256)
        self.connections: list = []
        self.thread = threading.Thread(target=self._accept, name=f"silent {address}", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept()
        self.listener.close()
        self.thread.join(timeout=5)
        for conn in self.connections:
            conn.close()


class SshHosts:
    """sshd processes on loopback addresses; build with :func:`start_sshd`, always ``close()`` (a context manager)."""

    def __init__(self, folder: Path, hosts: list, failures: bool, log_level: str) -> None:
        self.folder = folder
        self.hosts = hosts
        self.failure_hosts = dict(FAILURE_ADDRESSES) if failures else {}
        self.log_level = log_level
        self.user = getpass.getuser()
        self.port = 0
        self.config = folder / "ssh_config"
        self.known_hosts = folder / "known_hosts"
        self.procs: list = []
        self.silent = None
        self.leftovers: list = []  # (pid, command line) of what still ran under an sshd at close()
        self._logs: list = []

    @property
    def ssh_args(self) -> tuple:
        return ("-F", str(self.config))

    @property
    def pids(self) -> list:
        """The pid of every sshd this started (the listeners; their sessions are their children)."""
        return [proc.pid for proc in self.procs]

    def ssh_command(self, host: str, *command: str, connect_timeout: float = 10) -> list:
        return ["ssh", *self.ssh_args, "-o", f"ConnectTimeout={connect_timeout:g}", host, *command]

    def ssh(self, host: str, *command: str, connect_timeout: float = 10, timeout: float = 60,
            input: str = None) -> subprocess.CompletedProcess:
        """``ssh -F CONFIG -o ConnectTimeout=T HOST COMMAND...`` to the end, output as text."""
        return subprocess.run(self.ssh_command(host, *command, connect_timeout=connect_timeout), input=input,
                              capture_output=True, text=True, timeout=timeout, stdin=None if input else
                              subprocess.DEVNULL)

    def expected_stderr(self, failure: str) -> str:
        """What ssh writes on stderr when it fails on the failure host named ``failure`` (or "unresolvable")."""
        host = UNRESOLVABLE if failure == "unresolvable" else self.failure_hosts[failure]
        return EXPECTED_STDERR[failure].format(user=self.user, host=host, port=self.port)

    def hostfile(self, path: Path, slots: int = 1, hosts: Iterable = None) -> Path:
        """A hostfile in DeepSpeed's form, ``HOST slots=N`` a line (default: every working host)."""
        path = Path(path)
        path.write_text("".join(f"{host} slots={slots}\n" for host in (self.hosts if hosts is None else hosts)))
        return path

    def log_tail(self, limit: int = 4000) -> str:
        return "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-limit:]}"
                         for log in sorted(self.folder.glob("sshd.*.log")))

    # ------------------------------------------------------------ start
    def start(self) -> "SshHosts":
        host_key, client_key = self._keygen("host_key"), self._keygen("client_key")
        (self.folder / "authorized_keys").write_text((self.folder / "client_key.pub").read_text())
        self.port = self._free_port()
        self._write_client_files(host_key, client_key)
        # The failure hosts have an sshd of their own: one that counts failed logins per source address (OpenSSH
        # 9.8's PerSourcePenalties, turned off where known) never refuses the working hosts' connections for them.
        groups = [self.hosts[n:n + MAX_LISTEN] for n in range(0, len(self.hosts), MAX_LISTEN)]
        if self.failure_hosts:
            groups.append([self.failure_hosts[name] for name in ("refuses_key", "asks_password", "unknown_key")])
        for index, addresses in enumerate(groups):
            self._spawn(index, addresses, host_key)
        if self.failure_hosts:
            self.silent = SilentHost(self.failure_hosts["silent"], self.port)
        self._wait_listening([address for group in groups for address in group])
        self._prove(self.hosts[0])
        return self

    def _keygen(self, name: str) -> Path:
        path = self.folder / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"launcher test {name}", "-f",
                        str(path)], check=True, capture_output=True, timeout=30)
        return path

    def _free_port(self) -> int:
        """A port free on every address right now, from this pytest process's share of the ports (conftest)."""
        from conftest import free_port

        addresses = self.hosts + list(self.failure_hosts.values())
        for _ in range(100):
            port = free_port()
            if all(_bindable(address, port) for address in addresses):
                return port
        raise SshdError(f"found no port free on all of {len(addresses)} loopback addresses in 100 tries")

    def _write_client_files(self, host_key: Path, client_key: Path) -> None:
        key = " ".join((self.folder / "host_key.pub").read_text().split()[:2])
        known = self.hosts + [self.failure_hosts[name] for name in ("refuses_key", "asks_password")
                              if name in self.failure_hosts]
        self.known_hosts.write_text("".join(f"[{host}]:{self.port} {key}\n" for host in known))
        self.config.write_text(CLIENT_OPTIONS.format(port=self.port, user=self.user, client_key=client_key,
                                                     known_hosts=self.known_hosts))

    def _spawn(self, index: int, addresses: list, host_key: Path) -> None:
        config = self.folder / f"sshd_config.{index}"
        text = SERVER_OPTIONS.format(port=self.port, host_key=host_key, pid_file=self.folder / f"sshd.{index}.pid",
                                     authorized_keys=self.folder / "authorized_keys", log_level=self.log_level)
        text += "".join(f"ListenAddress {address}\n" for address in addresses)
        text += "PerSourcePenalties no\n" if _server_version() >= (9, 8) else ""
        if self.failure_hosts:
            text += FAILURE_MATCHES.format(**self.failure_hosts)
        config.write_text(text)
        log = open(self.folder / f"sshd.{index}.log", "ab")
        self._logs.append(log)
        self.procs.append(subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))

    def _wait_listening(self, addresses: list) -> None:
        """Until the sshd processes listen on every address (their own sockets, read from /proc): bounded."""
        wanted = set(addresses)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            ended = [proc.args for proc in self.procs if proc.poll() is not None]
            if ended:
                raise SshdError(f"sshd ended at start ({ended}):\n{self.log_tail()}")
            missing = wanted - self._listening()
            if not missing:
                return
            if "Address already in use" in self.log_tail():  # sshd listens on the other addresses all the same
                raise SshdError(f"sshd could not listen on all of its addresses:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise SshdError(f"sshd does not listen on {sorted(missing)} port {self.port} after "
                                f"{START_TIMEOUT:g} s:\n{self.log_tail()}")
            time.sleep(0.02)

    def _listening(self) -> set:
        found = set()
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                found.update(c.laddr.ip for c in psutil.Process(proc.pid).net_connections("tcp4")
                             if c.status == psutil.CONN_LISTEN and c.laddr.port == self.port)
        return found

    def _prove(self, host: str) -> None:
        """One real ``ssh HOST true``: the keys, the known_hosts file and the server's options agree."""
        done = self.ssh(host, "true", timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise SshdError(f"ssh {host} true failed ({done.returncode}): {done.stderr.strip()}\n{self.log_tail()}")

    # ------------------------------------------------------------ stop
    def close(self) -> None:
        """SIGTERM to every sshd started, and to what runs under them; wait (SIGKILL after STOP_TIMEOUT)."""
        under = []
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                under += psutil.Process(proc.pid).children(recursive=True)
        self.leftovers += [(p.pid, _cmdline(p)) for p in under]
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for p in under:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(under, timeout=STOP_TIMEOUT)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.silent:
            self.silent.close()
            self.silent = None
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> "SshHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.lru_cache(maxsize=None)
def _server_version() -> tuple:
    """sshd's version, (major, minor): ``sshd -V`` says ``OpenSSH_9.2p1 ...`` (on stderr)."""
    said = subprocess.run([SSHD, "-V"], capture_output=True, text=True, timeout=30)
    found = re.search(r"OpenSSH_(\d+)\.(\d+)", said.stderr + said.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
            return True
        except OSError:
            return False


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return "(ended)"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so that no sshd outlives a killed pytest."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _privsep_dir() -> None:
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


def start_sshd(folder, hosts: Union[int, list] = 3, failures: bool = True, log_level: str = "ERROR",
               attempts: int = 3) -> SshHosts:
    """Running sshd processes on ``hosts`` (a count from 127.0.0.1, or a list of loopback addresses), with the
    failure hosts when ``failures``; files under ``folder`` (made if missing). Raises SshdError if they fail."""
    addresses = loopback_addresses(hosts) if isinstance(hosts, int) else list(hosts)
    if not addresses or not all(address.startswith("127.") for address in addresses):
        raise SshdError(f"the hosts must be loopback addresses (127.x.y.z), not {addresses}")
    _privsep_dir()
    for attempt in range(attempts):
        servers = SshHosts(Path(folder) / f"try{attempt}", addresses, failures, log_level)
        servers.folder.mkdir(parents=True)
        try:
            return servers.start()
        except BaseException as exc:
            servers.close()
            # Another process took the port on one of the addresses between the check and sshd's bind: a new port.
            if "Address already in use" not in str(exc) or attempt == attempts - 1:
                raise


# -- pytest fixtures -------------------------------------------------------------------------------------------
def _skip_without_ssh() -> None:
    missing = missing_tools()
    if missing:
        pytest.skip(f"the real sshd tests need {' and '.join(missing)} (apt-get install openssh-server "
                    f"openssh-client)")


@contextlib.contextmanager
def started_sshd(folder: Path):
    """A ``start(hosts=3, failures=True, log_level="ERROR")`` that starts sshd under ``folder`` (skips the test when
    sshd or ssh is missing); everything it started is closed at the end (a module's fixture may use it with a
    folder of ``tmp_path_factory``)."""
    _skip_without_ssh()
    started = []

    def start(hosts: Union[int, list] = 3, failures: bool = True, log_level: str = "ERROR") -> SshHosts:
        started.append(start_sshd(folder / f"sshd{len(started)}", hosts, failures, log_level))
        return started[-1]

    try:
        yield start
    finally:
        for servers in started:
            servers.close()


@pytest.fixture
def ssh_hosts_factory(tmp_path):
    """``start(hosts=3, failures=True)`` starts sshd on loopback addresses; all closed after the test."""
    with started_sshd(tmp_path) as start:
        yield start


@pytest.fixture
def ssh_hosts(tmp_path):
    """sshd on 127.0.0.1, 127.0.0.2 and 127.0.0.3, with the failure hosts; closed after the test."""
    with started_sshd(tmp_path) as start:
        yield start()
