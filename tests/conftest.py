import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
WORKERS = REPO / "tests" / "integration" / "workers"
PROBE = str(WORKERS / "probe.py")


INHERITED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _keep_ignoring(signum, frame):
    """pytest itself still ignores the signal; a handler (unlike SIG_IGN) is reset to the default on exec."""


@pytest.fixture(scope="session", autouse=True)
def default_signal_dispositions():
    """A suite started with signals ignored (``nohup``, ``cmd &`` in a script, some CI runners)
    would pass SIG_IGN on to every launcher, worker and tool it starts, and the tests that send
    them SIGINT would fail: every process the tests start gets the default dispositions instead."""
    for sig in INHERITED_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else _keep_ignoring)
    yield


@pytest.fixture(autouse=True)
def launcher_output_restored():
    """The launcher's output is set up once for its process; a test that runs its code in this one
    leaves none of it to the next test. The ``launch`` command (CliRunner) gives the "launcher"
    logger one handler, to the console, and stops it propagating: caplog in every later test would
    see none of its messages. ``attempts.run`` makes the console's streams for descriptors 1 and 2:
    with ``pytest -s`` and stderr on a pipe, the stream reopens the pipe, and capfd in a later test
    would not see the messages written there."""
    from launcher.output.console import console
    from launcher.output.messages import log

    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    yield
    log.handlers[:] = handlers
    log.propagate = propagate
    log.setLevel(level)  # also forgets the levels the logger cached
    console.reset()


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items):
    """A benchmark's run end to end (marked ``bench``) and training checked number for number (``training``) are slow
    too: out of the quick loop (``-m 'not slow'``); CI runs them after it (``-m 'bench or training'``), and ``-m slow``
    runs every long test."""
    for item in items:
        if item.get_closest_marker("bench") is not None or item.get_closest_marker("training") is not None:
            item.add_marker(pytest.mark.slow)


def netns_available():
    """Whether this test run may create network namespaces (root and `ip netns`)."""
    import shutil
    import uuid

    if os.geteuid() != 0 or not shutil.which("ip"):
        return False
    name = f"lnprobe{uuid.uuid4().hex[:6]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return True


@pytest.fixture
def workers_without_torch(request, monkeypatch):
    """The workers that take WORKER_GROUP (integration/workers/elastic_worker.py, allreduce_dump.py) make
    their group without torch (store_group.py: 2 s of CPU less per worker start), except in a test marked
    ``real_torch``: those, one per path, run real gloo groups."""
    if request.node.get_closest_marker("real_torch") is None:
        monkeypatch.setenv("WORKER_GROUP", "store")


@pytest.fixture
def veth_namespaces():
    """Two network namespaces joined by a veth pair, each with one address that exists only in it:
    (namespaces, links, addresses). Always removed."""
    import uuid

    if not netns_available():
        pytest.skip("cannot create network namespaces (needs root and ip netns)")
    tag = uuid.uuid4().hex[:6]
    names, links, addrs = [f"lna{tag}", f"lnb{tag}"], [f"va{tag}", f"vb{tag}"], ["10.231.7.1", "10.231.7.2"]
    steps = [["ip", "netns", "add", names[0]], ["ip", "netns", "add", names[1]],
             ["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]]]
    for ns, link, addr in zip(names, links, addrs):
        steps += [["ip", "link", "set", link, "netns", ns],
                  ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", link],
                  ["ip", "-n", ns, "link", "set", link, "up"],
                  ["ip", "-n", ns, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=20)
        yield names, links, addrs
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", links[0]], capture_output=True, timeout=20)  # gone with its namespace


def launcher_cmd(*args):
    return [sys.executable, "-m", "launcher", *map(str, args)]


def run_launcher(*args, env=None, timeout=60, cwd=None):
    """Run `python -m launcher ARGS` to the end; the CompletedProcess, output as text."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(launcher_cmd(*args), capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=cwd or REPO)


def assert_refused_in_one_line(folder, args, sentence):
    """``python -m launcher ARGS train.py`` in ``folder`` (an empty train.py there), with no PADDLE_* or
    LAUNCHER_ETCD* variable of this environment: exit 2, one line on stderr that starts with ``sentence``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "LAUNCHER_ETCD"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    (folder / "train.py").write_text("")
    done = subprocess.run(launcher_cmd(*args, "train.py"), cwd=folder, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"launcher: error: {sentence}") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def start_launcher(*args, env=None, **kwargs):
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(launcher_cmd(*args), env=full_env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def spares_of(launcher_pid):
    """The launcher's spare interpreters (woken ones among them: they keep the environment they
    were started with in /proc/PID/environ)."""
    from launcher.run import spare

    found = []
    for child in psutil.Process(launcher_pid).children():
        try:
            if spare.FD_VAR in child.environ():
                found.append(child)
        except psutil.Error:  # ended meanwhile
            continue
    return found


def start_stubborn(folder, *args):
    """workers/stubborn.py under a launcher allowed one restart (``args`` added to its options),
    its first attempt held until ``folder``/go exists: (the launcher, its two spares), once there."""
    launcher = start_launcher("--nproc_per_node", 2, "--max_restarts", 1, "--shutdown_timeout", 0.3, *args,
                              WORKERS / "stubborn.py", folder, "go")
    spares = []

    def two_spares():
        spares[:] = spares_of(launcher.pid)
        return len(spares) == 2

    try:
        wait_for((folder / "ignoring").exists, timeout=30, what="the first attempt")
        wait_for(two_spares, timeout=30, what="the spares")
    except BaseException:
        launcher.kill()
        launcher.communicate()
        raise
    return launcher, spares


def release_stubborn(launcher, folder):
    """Let start_stubborn's first attempt fail, and wait for the launcher's end: its stderr."""
    try:
        (folder / "go").touch()
        return launcher.communicate(timeout=60)[1]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()


def wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def read_until(proc, text, timeout=20.0):
    """Read the launcher's stderr until ``text`` appears; what was read. Bounded by ``timeout``."""
    import select

    fd = proc.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {text!r} in: {seen.decode(errors='replace')[-2000:]}")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"{text!r} never came: {seen.decode(errors='replace')[-2000:]}")
            seen += chunk
    return seen.decode(errors="replace")


def read_dumps(folder, count):
    """The workers' ``env.RANK.json`` files in ``folder`` by rank, once ``count`` of them are there and whole
    (a worker's ``json.dump`` may be half-way through when the file is first seen)."""
    dumps = {}

    def all_whole() -> bool:
        dumps.clear()
        for path in Path(folder).glob("env.*.json"):
            try:
                record = json.loads(path.read_text())
            except ValueError:  # still being written: read again
                return False
            dumps[int(path.name.split(".")[1])] = record
        return len(dumps) >= count

    wait_for(all_whole, 120, what=f"{count} whole env dumps")  # a generous bound: a busy machine starts slowly
    return dumps


def dumps_of_one_node(folder, count, *args, env=None):
    """Run one node of a job of several nodes (it would wait for the others to join), read its
    workers' dumps, then stop it."""
    import signal

    launcher = start_launcher(*args, env=env)
    try:
        return read_dumps(folder, count)
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=30)


def pids_of(dumps):
    pids = []
    for record in dumps.values():
        pids.append(record["pid"])
        pids.extend(record["children"])
    return pids


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(pids, timeout=10.0):
    wait_for(lambda: not any(alive(p) for p in pids), timeout, what=f"processes {pids} to end")


PORTS_BELOW_EPHEMERAL = (20000, 32768)  # under Linux's ip_local_port_range (32768-60999 by default)


def free_ports(count, host="127.0.0.1"):
    """A port P such that P to P+count-1 are free on host right now, below the kernel's ephemeral range: a port
    from that range (what binding to port 0 gives) can be taken meanwhile as the local port of any connection,
    the test's own launchers' included (a worker's port taken so: 1 run in 11 of test_elastic.py beside
    the etcd tests)."""
    low, high = ports_of_this_process()
    for _ in range(200):
        port = random.randrange(low, high - count)
        socks = [socket.socket() for _ in range(count)]
        try:
            for i, sock in enumerate(socks):
                sock.bind((host, port + i))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports from {low} to {high}")


def ports_of_this_process() -> tuple:
    """This pytest process's share of PORTS_BELOW_EPHEMERAL: with pytest-xdist, each worker its own slice, so
    that two tests running at once never pick the same port (a test picks its ports free, but its launchers bind
    them a moment later: another worker's test picking one meanwhile got it too)."""
    low, high = PORTS_BELOW_EPHEMERAL
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit()):
        return low, high
    size = (high - low) // int(workers)
    return low + int(worker[2:]) * size, low + (int(worker[2:]) + 1) * size


def free_port(host="127.0.0.1") -> int:
    return free_ports(1, host)


@pytest.fixture
def probe():
    return PROBE


def finish_all(procs, timeout=120):
    """Wait for every process (Popen with pipes) in turn, bounded; (returncode, stdout, stderr) of each.
    Whatever still runs at the end is killed. When one overruns, the failure shows what every process
    wrote (a hang of one node is most often explained by another's output)."""
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    except subprocess.TimeoutExpired as late:
        raise AssertionError(f"{shlex.join(map(str, late.cmd))} still ran after {timeout:g} s; what each process "
                             f"wrote:\n{_outputs_of(procs, results)}") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _outputs_of(procs, results, tail=3000) -> str:
    """Each process (killed if it still runs): its command, exit code and the tails of its stdout and stderr;
    ``results`` holds those of the first processes, read already."""
    parts = []
    for i, p in enumerate(procs):
        if i < len(results):
            _, out, err = results[i]
        else:
            if p.poll() is None:
                p.kill()
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a grandchild still holds its pipes
                out, err = "", "(not readable: a child of it holds its pipes)"
        text = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (out, err)]
        parts.append(f"--- {shlex.join(map(str, p.args))} (exit code {p.returncode})\n"
                     f"stdout: ...{text[0][-tail:]}\nstderr: ...{text[1][-tail:]}")
    return "\n".join(parts)


def pose_as_node_0(port, answer: bytes, connections=3, timeout=30.0) -> list:
    """A stranger holding node 0's port (control channel or MPI gathering): each of ``connections``
    connections in turn gets a challenge, is read once, then gets ``answer``; what each one said."""
    import struct

    challenge = json.dumps({"type": "challenge", "nonce": "ab" * 16}).encode()
    said = []
    with socket.create_server(("127.0.0.1", port)) as listener:
        listener.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while len(said) < connections and time.monotonic() < deadline:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.sendall(struct.pack("!I", len(challenge)) + challenge)
                    said.append(conn.recv(65536))
                    conn.sendall(answer)
                    time.sleep(0.1)
                except OSError:
                    pass
    return said


def listening(host: str, port: int) -> bool:
    """Whether something accepts connections on host:port (one probe connection, closed at once)."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False
