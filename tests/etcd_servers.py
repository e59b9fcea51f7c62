"""Real etcd servers for tests, on loopback (127.0.0.1) only.

    from etcd_servers import etcd, etcd_cluster, etcd_factory   # the fixtures
    from etcd_servers import start_single, start_cluster         # or by hand, then close()

``start_single`` gives a running one-member etcd, ``start_cluster`` a three-member one; both return
an :class:`EtcdCluster`. Every member is a subprocess of the test with its own data dir and log
file under ``tmp_path``; ``close()`` kills and reaps every process the cluster ever started.
``tls=True`` makes a CA, a server certificate for 127.0.0.1 and a client certificate with openssl
and requires client certificates; ``auth=("root", "pw")`` enables authentication with that root
user plus a user ``alice`` (password ``alice-pw``) that may only read and write keys under
``/launcher/``. ``cluster.ctl(...)`` runs etcdctl against the cluster with the right flags.

The fixtures skip the test when etcd (or etcdctl, or openssl for TLS) is not installed.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import free_ports

HOST = "127.0.0.1"
START_TIMEOUT = 20.0
# Ports the tests must never use (someone's hand-started etcd may be listening there).
RESERVED_PORTS = frozenset({2379, 2380, 23790, 23800})
LOG_TAIL = 4000
_DEFAULT = object()


def missing_tools(tls=False):
    """The tools these servers need that are not on PATH (empty when all are there)."""
    tools = ["etcd", "etcdctl"] + (["openssl"] if tls else [])
    return [tool for tool in tools if shutil.which(tool) is None]


def _clean_env():
    """The environment for etcd and etcdctl: none of the caller's ETCD_*/ETCDCTL_* settings (etcd reads
    its flags from ETCD_* variables, etcdctl from ETCDCTL_*) and no proxies."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ETCD_", "ETCDCTL_")) and k.lower() not in
           ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy")}
    env["ETCDCTL_API"] = "3"
    return env


def _die_with_parent():
    """In the child before exec: SIGKILL it when the test process dies, so that nothing outlives a
    killed pytest."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _tail(path, limit=LOG_TAIL):
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return text[-limit:]


def _loopback_ports(count):
    """``count`` consecutive ports free on 127.0.0.1 right now, none of them reserved."""
    for _ in range(20):
        port = free_ports(count, HOST)
        if not RESERVED_PORTS.intersection(range(port, port + count)):
            return port
    raise RuntimeError(f"no {count} free ports on {HOST} outside {sorted(RESERVED_PORTS)}")


def _unique_dir(tmp_path, stem):
    tmp_path = Path(tmp_path)
    for n in range(1000):
        path = tmp_path / (stem if n == 0 else f"{stem}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free directory name {stem}-N in {tmp_path}")


@dataclass
class EtcdTLS:
    """Certificate files made by :func:`make_tls` (PEM): ``cacert``, ``cert`` and ``key`` are what a
    client needs; ``server_cert``/``server_key`` are the server's (IP SAN 127.0.0.1)."""
    dir: Path
    cacert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    cert: Path
    key: Path


@dataclass
class EtcdAuth:
    """The users an ``auth=`` cluster has: the root user, and ``user`` with role ``role`` granting
    readwrite on keys under ``prefix`` only."""
    root_user: str
    root_password: str
    user: str = "alice"
    password: str = "alice-pw"
    role: str = "launcher"
    prefix: str = "/launcher/"

    @property
    def users(self):
        return {self.root_user: self.root_password, self.user: self.password}


def make_tls(directory, client_cn="client"):
    """A CA, a server certificate for 127.0.0.1 (IP SAN, server and client auth) and a client
    certificate (CN ``client_cn``), made with openssl in ``directory`` (EC P-256 keys, valid 2 days)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args):
        proc = subprocess.run(["openssl", *args], cwd=d, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")

    openssl("req", "-x509", *newkey, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=launcher test etcd CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    exts = {
        "server": "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
                  "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n",
        "client": "extendedKeyUsage=clientAuth\n"
                  "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n",
    }
    subjects = {"server": "/CN=127.0.0.1", "client": f"/CN={client_cn}"}
    for name, ext in exts.items():
        (d / f"{name}.ext").write_text(ext)
        openssl("req", *newkey, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subjects[name])
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return EtcdTLS(dir=d, cacert=d / "ca.pem", ca_key=d / "ca.key", server_cert=d / "server.pem",
                   server_key=d / "server.key", cert=d / "client.pem", key=d / "client.key")


@dataclass(eq=False)
class EtcdMember:
    """One etcd server process: its name, loopback ports, data dir and log file."""
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    scheme: str = "http"
    proc: subprocess.Popen = field(default=None, repr=False)
    paused: bool = False

    @property
    def endpoint(self):
        """``127.0.0.1:PORT``, the client endpoint without a scheme."""
        return f"{HOST}:{self.client_port}"

    @property
    def client_url(self):
        return f"{self.scheme}://{HOST}:{self.client_port}"

    @property
    def peer_url(self):
        return f"http://{HOST}:{self.peer_port}"

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def running(self):
        """Started and not exited (a paused member is running)."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, limit=LOG_TAIL):
        return _tail(self.log_path, limit)


class EtcdError(RuntimeError):
    pass


class EtcdCluster:
    """Running etcd members on 127.0.0.1; build one with :func:`start_single` or
    :func:`start_cluster`, and always ``close()`` it (it is also a context manager)."""

    def __init__(self, members, *, token, tls=None, auth=None, start_timeout=START_TIMEOUT):
        self.members = list(members)
        self.token = token
        self.tls = tls
        self.auth = auth
        self.start_timeout = start_timeout
        self.pids = []            # every pid this cluster ever started, in order
        self._procs = []          # every Popen, to kill and reap in close()
        self._logs = []
        self._auth_enabled = False
        self.closed = False

    # -- addresses and files -------------------------------------------------------------------
    @property
    def endpoints(self):
        """``127.0.0.1:P1,127.0.0.1:P2,...``: every member's client endpoint, no scheme."""
        return ",".join(m.endpoint for m in self.members)

    @property
    def urls(self):
        """``http(s)://127.0.0.1:P1,...``: every member's client URL."""
        return ",".join(m.client_url for m in self.members)

    @property
    def initial_cluster(self):
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def cacert(self):
        return self.tls.cacert if self.tls else None

    @property
    def cert(self):
        return self.tls.cert if self.tls else None

    @property
    def key(self):
        return self.tls.key if self.tls else None

    def member(self, name):
        return next(m for m in self.members if m.name == name)

    def live(self):
        """The members running and not paused."""
        return [m for m in self.members if m.running and not m.paused]

    # -- processes -----------------------------------------------------------------------------
    def _command(self, member, state):
        cmd = [shutil.which("etcd") or "etcd",
               "--name", member.name,
               "--data-dir", str(member.data_dir),
               "--listen-client-urls", member.client_url,
               "--advertise-client-urls", member.client_url,
               "--listen-peer-urls", member.peer_url,
               "--initial-advertise-peer-urls", member.peer_url,
               "--initial-cluster", self.initial_cluster,
               "--initial-cluster-state", state,
               "--initial-cluster-token", self.token,
               "--heartbeat-interval", "100",
               "--election-timeout", "1000",
               "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]
        if self.tls:
            cmd += ["--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
                    "--trusted-ca-file", str(self.tls.cacert), "--client-cert-auth"]
        return cmd

    def _spawn(self, member, state):
        if self.closed:
            raise EtcdError("the cluster is closed")
        member.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(member.log_path, "ab")
        log.write(f"--- started {time.strftime('%H:%M:%S')} (initial-cluster-state {state}) ---\n".encode())
        log.flush()
        self._logs.append(log)
        proc = subprocess.Popen(self._command(member, state), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=_clean_env(), preexec_fn=_die_with_parent)
        member.proc, member.paused = proc, False
        self._procs.append(proc)
        self.pids.append(proc.pid)
        return proc

    def start(self):
        """Start every member (a new cluster) and wait until all are healthy; then set up auth."""
        for member in self.members:
            self._spawn(member, "new")
        self.wait_healthy(self.members)
        if self.auth:
            self._setup_auth()
        return self

    def stop(self, member):
        """SIGKILL the member (a lost member) and reap it."""
        member = self._resolve(member)
        if member.running:
            member.proc.kill()
        if member.proc is not None:
            member.proc.wait(timeout=10)
        member.paused = False

    def pause(self, member):
        """SIGSTOP the member (it hangs: its sockets stay open and nothing answers)."""
        member = self._resolve(member)
        if not member.running:
            raise EtcdError(f"{member.name} is not running")
        member.proc.send_signal(signal.SIGSTOP)
        member.paused = True

    def resume(self, member):
        """SIGCONT a paused member."""
        member = self._resolve(member)
        if member.running:
            member.proc.send_signal(signal.SIGCONT)
        member.paused = False

    def restart(self, member, wait=True, timeout=None):
        """Start the member again (killing it first if it runs) with its data dir and
        ``--initial-cluster-state existing``; wait until it is healthy unless ``wait`` is false."""
        member = self._resolve(member)
        self.stop(member)
        self._spawn(member, "existing")
        if wait:
            self.wait_healthy([member], timeout=timeout)
        return member

    def close(self):
        """Kill every process this cluster started and reap them all; safe to call twice."""
        self.closed = True
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # SIGKILL ends a stopped (paused) process too
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for log in self._logs:
            with contextlib.suppress(OSError):
                log.close()
        self._logs.clear()
        for member in self.members:
            member.paused = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _resolve(self, member):
        if isinstance(member, EtcdMember):
            if member not in self.members:
                raise EtcdError(f"{member.name} is not a member of this cluster")
            return member
        if isinstance(member, int):
            return self.members[member]
        return self.member(member)

    # -- etcdctl -------------------------------------------------------------------------------
    def ctl_command(self, *args, members=None, endpoints=None, user=_DEFAULT, client_cert=True,
                    dial_timeout="2s", command_timeout="5s"):
        """The etcdctl command line for ``args`` against ``endpoints`` (a string or list; by default
        those of ``members``, by default all). ``user`` is (name, password), None for no user; the
        default is root once auth is on. ``client_cert=False`` leaves out the client certificate
        (the CA is still trusted)."""
        if endpoints is None:
            chosen = self.members if members is None else [self._resolve(m) for m in members]
            endpoints = [m.client_url for m in chosen]
        elif not isinstance(endpoints, str):
            endpoints = list(endpoints)
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        if self.tls:
            endpoints = [e if "://" in e else f"https://{e}" for e in endpoints]
        cmd = [shutil.which("etcdctl") or "etcdctl", f"--endpoints={','.join(endpoints)}",
               f"--dial-timeout={dial_timeout}", f"--command-timeout={command_timeout}"]
        if self.tls:
            cmd.append(f"--cacert={self.tls.cacert}")
            if client_cert:
                cmd += [f"--cert={self.tls.cert}", f"--key={self.tls.key}"]
        if user is _DEFAULT:
            user = (self.auth.root_user, self.auth.root_password) if self._auth_enabled else None
        if user is not None:
            cmd += [f"--user={user[0]}", f"--password={user[1]}"]
        return cmd + [str(a) for a in args]

    def ctl(self, *args, check=True, timeout=30, input=None, **options):
        """Run etcdctl (see :meth:`ctl_command` for the options): the CompletedProcess (text);
        raise EtcdError with its output when it fails and ``check`` is true."""
        cmd = self.ctl_command(*args, **options)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_clean_env(),
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise EtcdError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def healthy(self, members=None):
        """Whether ``etcdctl endpoint health`` says every one of ``members`` (default all) is healthy."""
        members = self.members if members is None else [self._resolve(m) for m in members]
        try:
            proc = self.ctl("endpoint", "health", members=members, check=False, timeout=10,
                            dial_timeout="1s", command_timeout="2s")
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    def wait_healthy(self, members=None, timeout=None):
        """Wait until every one of ``members`` (default all) is healthy, at most ``timeout`` seconds
        (default the start timeout); raise EtcdError with the members' log tails if not."""
        members = self.members if members is None else [self._resolve(m) for m in members]
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while True:
            dead = [m for m in members if not m.running]
            if dead:
                raise EtcdError(self._report("exited while starting", dead))
            if self.healthy(members):
                return
            if time.monotonic() > deadline:
                raise EtcdError(self._report("not healthy after "
                                             f"{self.start_timeout if timeout is None else timeout:g} s",
                                             members))
            time.sleep(0.2)

    def _report(self, what, members):
        parts = [f"etcd {', '.join(m.name for m in members)} {what}"]
        for m in members:
            code = m.proc.poll() if m.proc else None
            parts.append(f"--- {m.name} ({m.client_url}, exit code {code}) log {m.log_path} tail:\n"
                         f"{m.log_tail()}")
        return "\n".join(parts)

    def _setup_auth(self):
        a = self.auth
        steps = [("user", "add", f"{a.root_user}:{a.root_password}"),
                 ("role", "add", a.role),
                 ("role", "grant-permission", "--prefix=true", a.role, "readwrite", a.prefix),
                 ("user", "add", f"{a.user}:{a.password}"),
                 ("user", "grant-role", a.user, a.role),
                 ("auth", "enable")]
        for step in steps:
            self.ctl(*step, user=None)
        self._auth_enabled = True

    def leader(self, timeout=10.0):
        """The member that is the leader now, per ``etcdctl endpoint status -w json`` on the live
        members; waits up to ``timeout`` seconds for one (during an election there is none)."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            live = self.live()
            if live:
                proc = self.ctl("endpoint", "status", "-w", "json", members=live, check=False, timeout=10,
                                dial_timeout="1s", command_timeout="2s")
                last = proc.stdout + proc.stderr
                try:
                    statuses = json.loads(proc.stdout) if proc.stdout.strip() else []
                except ValueError:
                    statuses = []
                for entry in statuses:
                    status = entry.get("Status", {})
                    member_id = status.get("header", {}).get("member_id")
                    if member_id is not None and member_id == status.get("leader"):
                        port = int(entry["Endpoint"].rsplit(":", 1)[1])
                        return next(m for m in self.members if m.client_port == port)
            if time.monotonic() > deadline:
                raise EtcdError(f"no leader among {[m.name for m in live]} after {timeout:g} s:\n{last}")
            time.sleep(0.2)


def _new_cluster(tmp_path, count, tls, auth, start_timeout, attempts=3):
    if isinstance(auth, EtcdAuth):
        auth_info = auth
    elif auth:
        auth_info = EtcdAuth(root_user=auth[0], root_password=auth[1])
    else:
        auth_info = None
    base = _unique_dir(tmp_path, "etcd")
    tls_files = make_tls(base / "tls") if tls else None
    for attempt in range(attempts):
        port = _loopback_ports(2 * count)
        run_dir = base / f"run{attempt}"
        members = [EtcdMember(name=f"m{i}", client_port=port + 2 * i, peer_port=port + 2 * i + 1,
                              data_dir=run_dir / f"m{i}.data", log_path=run_dir / f"m{i}.log",
                              scheme="https" if tls else "http")
                   for i in range(count)]
        cluster = EtcdCluster(members, token=f"test-{uuid.uuid4().hex[:12]}", tls=tls_files, auth=auth_info,
                              start_timeout=start_timeout)
        try:
            return cluster.start()
        except BaseException as exc:
            cluster.close()
            # Another process took a port between the check and etcd binding it: try fresh ports.
            raced = isinstance(exc, EtcdError) and any(
                "address already in use" in m.log_tail(100_000) for m in members)
            if not raced or attempt == attempts - 1:
                raise


def start_single(tmp_path, tls=None, auth=None, start_timeout=START_TIMEOUT):
    """A running one-member etcd on 127.0.0.1 (an EtcdCluster with one member)."""
    return _new_cluster(tmp_path, 1, tls, auth, start_timeout)


def start_cluster(tmp_path, members=3, tls=None, auth=None, start_timeout=START_TIMEOUT):
    """A running ``members``-member etcd cluster on 127.0.0.1."""
    return _new_cluster(tmp_path, members, tls, auth, start_timeout)


# -- pytest fixtures ---------------------------------------------------------------------------
def _skip_without_etcd(tls=False):
    missing = missing_tools(tls)
    if missing:
        pytest.skip(f"real etcd tests need {' and '.join(missing)} on PATH (apt-get install etcd-server "
                    f"etcd-client{' openssl' if 'openssl' in missing else ''})")


@contextlib.contextmanager
def _factory(tmp_path):
    _skip_without_etcd()
    started = []

    def start(members=1, tls=None, auth=None, start_timeout=START_TIMEOUT):
        if tls:
            _skip_without_etcd(tls=True)
        cluster = _new_cluster(tmp_path, members, tls, auth, start_timeout)
        started.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in started:
            cluster.close()


# Each fixture needs only tmp_path, so a test module may import any one of them alone.
@pytest.fixture
def etcd_factory(tmp_path):
    """``start(members=1, tls=None, auth=None)`` starts an etcd on loopback; all are closed after
    the test. Skips the test when etcd is not installed."""
    with _factory(tmp_path) as start:
        yield start


@pytest.fixture
def etcd(tmp_path):
    """A running one-member etcd (plain http, no auth) on 127.0.0.1; closed after the test."""
    with _factory(tmp_path) as start:
        yield start(1)


@pytest.fixture
def etcd_cluster(tmp_path):
    """A running three-member etcd cluster on 127.0.0.1; closed after the test."""
    with _factory(tmp_path) as start:
        yield start(3)
