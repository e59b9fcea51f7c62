"""Jobs of several nodes, one real launcher process per node, on loopback addresses (any 127.x is
this machine) or in network namespaces the test creates and removes.

What is promised: a failure anywhere stops every node at once, with one root cause and one exit
code everywhere; a node that is killed, frozen, cut off or never started is named and the job
stops; --max_restarts restarts every node. Every wait is bounded, and every process a test starts
(launchers, watchdogs, workers) is gone at its end. Their jobs and checks (``Cluster``) serve the
files of the same jobs' other promises too: test_many_nodes_strangers.py (strangers at node 0's
control port are dropped and change nothing) and test_many_nodes_hangs.py (a hung job shows where
each rank of each node was), each a file of its own so that xdist runs them beside this one.
"""

import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, WORKERS, alive, free_ports, launcher_cmd, wait_for

WORKER = str(WORKERS / "node_worker.py")
LOOPBACK = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
GRACE = 2  # --shutdown_timeout of every launcher here


# ---------------------------------------------------------------- one launcher per node


class Node:
    """One node's launcher; its stdout and stderr are read as they come (no pipe ever fills)."""

    def __init__(self, index: int, ip: str, cmd: list, env: dict) -> None:
        self.index, self.ip = index, ip
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started = time.monotonic()
        self.ended = None  # time.monotonic() at its exit
        self._out, self._err = [], []
        self._done = threading.Event()
        self._readers = [threading.Thread(target=self._drain, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self._out), (self.proc.stderr, self._err))]
        for t in self._readers:
            t.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _drain(self, stream, chunks) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            chunks.append(chunk)

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()
        self._done.set()

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode(errors="replace")

    @property
    def stdout(self) -> str:
        return b"".join(self._out).decode(errors="replace")

    @property
    def code(self):
        return self.proc.returncode

    def wait_text(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stderr:
            if time.monotonic() > deadline:
                raise AssertionError(f"node {self.index} never said {text!r}; its stderr:\n{self.stderr[-3000:]}")
            time.sleep(0.02)

    def wait_end(self, timeout: float) -> int:
        if not self._done.wait(timeout):
            raise AssertionError(f"node {self.index} ({self.ip}) still runs after {timeout} s; "
                                 f"its stderr:\n{self.stderr[-3000:]}")
        for t in self._readers:
            t.join(5)
        return self.proc.returncode

    def running(self) -> bool:
        return not self._done.is_set()


class Cluster:
    """The launchers of one test; at the end, whatever still runs is stopped, and every process
    ever seen below a launcher must be gone."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.pids: set = set()

    def start(self, node_ips, index, *args, prefix=(), env=None) -> Node:
        ip = node_ips[index]
        cmd = [*prefix, *launcher_cmd("--cluster_node_ips", ",".join(node_ips), "--node_ip", ip, *args)]
        node = Node(index, ip, cmd, {**os.environ, **(env or {})})
        self.nodes.append(node)
        self.pids.add(node.proc.pid)
        return node

    def snapshot(self) -> None:
        """Remember every process now below a launcher (its watchdog, its workers)."""
        for node in self.nodes:
            try:
                root = psutil.Process(node.proc.pid)
                self.pids.update(p.pid for p in root.children(recursive=True))
            except psutil.Error:
                pass

    def watchdog(self, node: Node) -> int:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for p in psutil.Process(node.proc.pid).children(recursive=True):
                try:
                    if "launcher.run import watchdog" in " ".join(p.cmdline()):
                        self.pids.add(p.pid)
                        return p.pid
                except psutil.Error:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"no watchdog below the launcher of node {node.index}")

    def finish(self, timeout: float) -> list:
        """Every launcher's exit code (bounded); no launcher crashed."""
        deadline = time.monotonic() + timeout
        codes = [n.wait_end(max(0.0, deadline - time.monotonic())) for n in self.nodes]
        for n in self.nodes:
            assert not launcher_crashed(n.stdout + n.stderr), n.stderr
        return codes

    def cleanup(self) -> None:
        self.snapshot()
        for node in self.nodes:
            if node.running():
                try:
                    node.proc.send_signal(signal.SIGCONT)
                    node.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for node in self.nodes:
            if not node._done.wait(GRACE + 15):
                node.proc.kill()
                node._done.wait(10)
        assert_gone(self.pids)


def launcher_crashed(output: str) -> bool:
    """A traceback through the launcher's own code (a worker's traceback may be echoed: not this)."""
    return re.search(r'File "[^"]*/launcher/[^/"]+\.py", line', output) is not None


def assert_gone(pids, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            left = [p for p in pids if alive(p)]
            raise AssertionError(f"processes still running: {left}")
        time.sleep(0.05)


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        c.cleanup()


def job_args(port: int, nproc: int, *extra) -> list:
    """The options every node of one job shares: control port ``port``, workers from ``port + 1``."""
    return ["--started_port", port + 1, "--nproc_per_node", nproc, "--shutdown_timeout", GRACE, *extra]


def read_attempt(folder: Path, world: int, attempt: int, timeout: float = 30.0) -> dict:
    """{rank: dump} of one attempt's workers, once all ``world`` have written theirs."""
    deadline = time.monotonic() + timeout
    while len(list(folder.glob(f"env.*.{attempt}.json"))) < world:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {sorted(p.name for p in folder.glob('env.*'))} of {world} ranks "
                                 f"of attempt {attempt} started")
        time.sleep(0.02)
    dumps = {}
    for path in folder.glob(f"env.*.{attempt}.json"):
        record = json.loads(path.read_text())
        dumps[record["rank"]] = record
    return dumps


def exit_times(pids, timeout: float) -> dict:
    """{pid: time.time() when it exited}, watched through pidfds; None: gone before the watch."""
    times, fds = {}, {}
    poller = select.poll()
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            times[pid] = None
            continue
        fds[fd] = pid
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    try:
        while fds and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                now = time.time()
                times[fds.pop(fd)] = now
                poller.unregister(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    assert not fds, f"processes {sorted(fds.values())} still run after {timeout} s"
    return times


def stopped_line(cause: str, code: int) -> str:
    return f"launcher: the job stopped: {cause}; exit code {code}"


def assert_none_done(*nodes: Node) -> None:
    """No worker of these nodes got to the end of its sleep (60 s): they were stopped, not waited for."""
    for node in nodes:
        assert not re.search(r"attempt \d+ done", node.stdout), node.stdout[-3000:]


HANG_GUARD = 120  # seconds: the bound of every wait for a launcher's end (the workers that sleep 60 s print
# "done" at their end: assert_none_done tells a stop from a wait)


def root_cause(node: Node) -> str:
    """The one "the job stopped" line of a node (there must be exactly one)."""
    lines = [line for line in node.stderr.splitlines() if line.startswith("launcher: the job stopped: ")]
    assert len(lines) == 1, node.stderr
    return lines[0]


# ---------------------------------------------------------------- 1. a failure stops every node


@pytest.mark.parametrize("count,nproc", [(2, 2), (3, 1), (3, 2)])
def test_a_failing_worker_stops_every_node_within_a_second(cluster, tmp_path, count, nproc):
    nodes = LOOPBACK[:count]
    port = free_ports(nproc + 1)
    world = count * nproc
    failing, where = world - 1, count - 1  # the last rank, on the last node
    for i in reversed(range(count)):
        cluster.start(nodes, i, *job_args(port, nproc), WORKER, "--dump", tmp_path, "--fail-rank", failing,
                      "--world", world, "--delay", 1.0, "--sleep", 60)
    dumps = read_attempt(tmp_path, world, 0)
    cluster.snapshot()
    others = {d["pid"]: r for r, d in dumps.items() if r // nproc != where}
    same_node = {d["pid"]: r for r, d in dumps.items() if r // nproc == where and r != failing}
    gone = exit_times([*others, *same_node], timeout=HANG_GUARD)
    failed_at = float((tmp_path / f"exit.{failing}.0").read_text())
    codes = cluster.finish(HANG_GUARD)

    assert None not in gone.values(), "a worker was gone before the failure"
    delay = max(gone[p] for p in others) - failed_at
    print(f"\n{count} nodes x {nproc}: rank {failing} exit -> last worker of the other nodes gone: "
          f"{delay * 1000:.0f} ms; per rank: "
          + ", ".join(f"rank {others[p]} {(t - failed_at) * 1000:.0f} ms" for p, t in sorted(gone.items(), key=lambda x: x[1]) if p in others)
          + (f"; on the failing node: {max(gone[p] for p in same_node) - failed_at:.3f} s" if same_node else ""))
    # how fast (goal 0.1 s): bench/run.py workload 9, cross-node teardown (docs/performance.md)
    assert_none_done(*cluster.nodes)
    assert codes == [7] * count
    root = stopped_line(f"rank {failing} on node {where} ({nodes[where]}) failed (exit code 7)", 7)
    for node in cluster.nodes:
        assert root in node.stderr, node.stderr
        assert f"launcher: last lines of rank {failing}:" in node.stderr
        assert f"  | rank {failing} fails with 7 on attempt 0" in node.stderr
    assert_gone(cluster.pids)


def test_a_node_started_before_node_0_starts_nothing_until_node_0_answers_then_its_failure_reaches_every_node(
        cluster, tmp_path):
    """Node 1 starts first: no worker of it runs before node 0 has judged every node (docs/elastic.md, the health
    checks of a fixed job); then its worker fails, and both nodes end with its code."""
    nodes = LOOPBACK[:2]
    port = free_ports(2)
    early = cluster.start(nodes, 1, *job_args(port, 1), WORKER, "--dump", tmp_path, "--fail-rank", 1, "--sleep", 60)
    early.wait_text("launcher: node 1 of 2 (127.0.0.2)", 30)
    time.sleep(1.0)  # a worker that did not wait would have written its dump by now
    assert not list(tmp_path.glob("env.*.json"))
    late = cluster.start(nodes, 0, *job_args(port, 1), WORKER, "--dump", tmp_path, "--fail-rank", 1, "--sleep", 60)
    assert cluster.finish(30) == [7, 7], late.stderr
    root = stopped_line("rank 1 on node 1 (127.0.0.2) failed (exit code 7)", 7)
    assert root in early.stderr and root in late.stderr
    assert "  | rank 1 fails with 7 on attempt 0" in late.stderr
    cluster.pids.update(json.loads(p.read_text())["pid"] for p in tmp_path.glob("env.*.json"))
    assert_gone(cluster.pids)


def test_a_failure_after_long_lines_of_junk_stops_every_node(cluster, tmp_path):
    """The cause, with the worker's last lines, once took more than one control message: node 1
    crashed (ValueError) and node 0 never heard of the failure."""
    nodes = LOOPBACK[:2]
    port = free_ports(2)
    script = tmp_path / "junk.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    for _ in range(20):\n"
                      "        sys.stdout.buffer.write(b'\\xff' * 3000 + b'\\n')\n"
                      "    sys.exit(3)\n"
                      "time.sleep(60)\n")
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 1), script)
    assert cluster.finish(40) == [3, 3], cluster.nodes[0].stderr[-2000:] + cluster.nodes[1].stderr[-2000:]
    root = stopped_line("rank 1 on node 1 (127.0.0.2) failed (exit code 3)", 3)
    assert all(root in node.stderr for node in cluster.nodes)


# ---------------------------------------------------------------- 2. a node killed or frozen


def test_a_node_killed_with_its_watchdog_is_named_by_the_others(cluster, tmp_path):
    nodes = LOOPBACK
    port = free_ports(2)
    for i in reversed(range(3)):
        cluster.start(nodes, i, *job_args(port, 1, "--heartbeat_timeout", 2, "--log_level", "DEBUG"), WORKER,
                      "--dump", tmp_path, "--sleep", 60)
    dumps = read_attempt(tmp_path, 3, 0)
    for node in cluster.nodes[:2]:  # nodes 2 and 1 have joined: a node not yet joined waits for the join timeout
        node.wait_text("control: joined node 0 at", 20)
    cluster.snapshot()
    victim = cluster.nodes[1]  # started second: node 1
    assert victim.ip == "127.0.0.2"
    watchdog = cluster.watchdog(victim)
    os.kill(watchdog, signal.SIGKILL)
    os.kill(victim.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    codes = cluster.finish(HANG_GUARD)
    took = max(n.ended for n in cluster.nodes if n is not victim) - killed
    print(f"\nkill -9 of node 1's launcher and watchdog -> the other launchers gone: {took:.2f} s")
    said = "\n".join(f"--- node {n.ip}:\n{n.stderr}" for n in cluster.nodes if n is not victim)
    assert codes == [1, -signal.SIGKILL, 1], said  # in the order started: nodes 2, 1, 0
    assert_none_done(cluster.nodes[0], cluster.nodes[2])
    for node in (cluster.nodes[0], cluster.nodes[2]):
        line = root_cause(node)
        assert line.startswith("launcher: the job stopped: node 1 (127.0.0.2) lost: ") and line.endswith("; exit code 1"), said
    assert_gone([d["pid"] for d in dumps.values()])  # node 1's worker too: PR_SET_PDEATHSIG
    assert_gone(cluster.pids)


def test_node_0_killed_with_its_watchdog_is_named_while_the_workers_stop(cluster, tmp_path):
    """Node 1 goes on turning its loop after node 0 is gone (its workers take a second to stop):
    it must not try node 0 again (it once did, and crashed on the socket number taken over)."""
    nodes = LOOPBACK[:2]
    port = free_ports(2)
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 1, "--heartbeat_timeout", 2, "--log_level", "DEBUG"), WORKER,
                      "--dump", tmp_path, "--sleep", 60, "--term-delay", 1.5)
    survivor, victim = cluster.nodes
    dumps = read_attempt(tmp_path, 2, 0)
    survivor.wait_text("control: joined node 0 at", 20)  # not yet joined, it would wait for the join timeout
    cluster.snapshot()
    watchdog = cluster.watchdog(victim)
    os.kill(watchdog, signal.SIGKILL)
    os.kill(victim.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert cluster.finish(HANG_GUARD) == [1, -signal.SIGKILL], survivor.stderr
    print(f"\nkill -9 of node 0's launcher and watchdog -> node 1 gone: {survivor.ended - killed:.2f} s "
          f"(its worker takes 1.5 s to stop)")
    assert_none_done(survivor)
    line = root_cause(survivor)
    assert line.startswith("launcher: the job stopped: node 0 (127.0.0.1) lost: ") and line.endswith("; exit code 1")
    assert_gone([d["pid"] for d in dumps.values()])  # node 0's worker too: PR_SET_PDEATHSIG
    assert_gone(cluster.pids)


def test_a_frozen_node_is_lost_for_want_of_heartbeats(cluster, tmp_path):
    nodes = LOOPBACK[:2]
    port = free_ports(2)
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 1, "--heartbeat_timeout", 2, "--log_level", "DEBUG"), WORKER,
                      "--dump", tmp_path, "--sleep", 60)
    frozen, leader = cluster.nodes
    read_attempt(tmp_path, 2, 0)
    frozen.wait_text("control: joined node 0 at", 20)  # heartbeats flow
    cluster.snapshot()
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert leader.wait_end(HANG_GUARD) == 1
        took = leader.ended - stopped
        print(f"\nSIGSTOP of node 1's launcher -> node 0 gone: {took:.2f} s (--heartbeat_timeout 2)")
        line = root_cause(leader)
        assert line.startswith("launcher: the job stopped: node 1 (127.0.0.2) lost: no heartbeat for ")
        assert line.endswith("; exit code 1")
        # not before the timeout: the silence it names is on node 0's own clock, which its lag does not count
        assert float(line.split("no heartbeat for ")[1].split(" s")[0]) >= 2, line
        assert_none_done(leader)
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    assert frozen.wait_end(HANG_GUARD) == 1  # back, it finds node 0 gone
    assert root_cause(frozen).startswith("launcher: the job stopped: node 0 (127.0.0.1) lost: ")
    assert not launcher_crashed(leader.stderr + frozen.stderr)
    assert_gone(cluster.pids)


# ---------------------------------------------------------------- 3. a node that never starts


def test_node_0_names_a_node_that_never_joins(cluster, tmp_path):
    port = free_ports(2)
    node = cluster.start(LOOPBACK[:2], 0, *job_args(port, 1, "--join_timeout", 2), WORKER, "--dump", tmp_path,
                         "--sleep", 60)
    cluster.snapshot()
    assert cluster.finish(HANG_GUARD) == [1]
    assert stopped_line(f"node 1 (127.0.0.2) never joined within 2 s (node 0 listens on port {port})", 1) in node.stderr
    assert not list(tmp_path.glob("env.*.json"))  # no worker started: node 0 waited for every node
    assert_gone(cluster.pids)


def test_node_0_done_waits_for_a_joined_node_that_still_runs(cluster, tmp_path):
    port = free_ports(2)
    args = (*job_args(port, 1, "--log_level", "DEBUG"), WORKER, "--dump", tmp_path, "--sleep", 60,
            "--until", tmp_path / "done.{node}")
    other = cluster.start(LOOPBACK[:2], 1, *args)
    node = cluster.start(LOOPBACK[:2], 0, *args)
    node.wait_text("control: node 1 (127.0.0.2) joined", 30)
    read_attempt(tmp_path, 2, 0)
    (tmp_path / "done.0").touch()
    wait_for(lambda: "rank 0 attempt 0 done" in node.stdout, 30, "rank 0 to finish")
    time.sleep(1.5)
    assert node.running() and other.running()  # node 0 waits for node 1's workers
    (tmp_path / "done.1").touch()
    assert cluster.finish(30) == [0, 0]
    assert "never joined" not in node.stderr + other.stderr
    assert_gone(cluster.pids)


def test_node_0_alone_whose_worker_fails_ends_at_once_with_that_failure(cluster, tmp_path):
    port = free_ports(3)
    node = cluster.start(LOOPBACK[:2], 0, *job_args(port, 2), WORKER, "--dump", tmp_path, "--sleep", 60,
                         "--fail-rank", 1, "--code", 7)
    assert cluster.finish(60) == [7]  # the join timeout is 300 s
    assert "rank 1 failed (exit code 7)" in node.stderr
    assert "exit code 0" not in node.stderr
    assert_gone(cluster.pids)


def test_a_node_names_node_0_when_it_never_answers(cluster, tmp_path):
    port = free_ports(2)
    node = cluster.start(LOOPBACK[:2], 1, *job_args(port, 1, "--join_timeout", 2), WORKER, "--dump", tmp_path,
                         "--sleep", 60)
    cluster.snapshot()
    assert cluster.finish(HANG_GUARD) == [1]
    assert f"node 0 (127.0.0.1) never answered on port {port} within 2 s (" in node.stderr
    assert not list(tmp_path.glob("env.*.json"))  # no worker started: node 0 never said so
    assert root_cause(node).startswith("launcher: the job stopped: node 0 (127.0.0.1) never answered")
    assert_gone(cluster.pids)


@pytest.mark.parametrize("timeout", [1, 127, 128, 86400])
def test_every_accepted_heartbeat_timeout_runs_a_job(cluster, tmp_path, timeout):
    """TCP_KEEPCNT takes at most 127: --heartbeat_timeout 128 once crashed every node (EINVAL)."""
    nodes = LOOPBACK[:2]
    port = free_ports(3)
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 1, "--heartbeat_timeout", timeout), WORKER, "--dump", tmp_path,
                      "--sleep", 1)
    assert cluster.finish(60) == [0, 0], cluster.nodes[0].stderr + cluster.nodes[1].stderr
    for node in cluster.nodes:  # no LAUNCHER_JOB_TOKEN: said once at start
        assert node.stderr.count("launcher: warning: control: no LAUNCHER_JOB_TOKEN is set") == 1, node.stderr


# ---------------------------------------------------------------- 4. a partition


def test_a_partition_is_noticed_on_both_sides(cluster, tmp_path, veth_namespaces):
    names, links, nodes = veth_namespaces
    port = 6069  # each namespace has ports of its own
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 1, "--heartbeat_timeout", 2, "--log_level", "DEBUG"), WORKER,
                      "--dump", tmp_path, "--sleep", 60, prefix=("ip", "netns", "exec", names[i]))
    follower, leader = cluster.nodes
    read_attempt(tmp_path, 2, 0)
    follower.wait_text("control: joined node 0 at", 20)
    cluster.snapshot()
    time.sleep(0.5)
    subprocess.run(["ip", "-n", names[0], "link", "set", links[0], "down"], check=True, timeout=20)
    cut = time.monotonic()
    codes = cluster.finish(HANG_GUARD)
    took = [n.ended - cut for n in (leader, follower)]
    print(f"\nveth down -> node 0 gone {took[0]:.2f} s, node 1 gone {took[1]:.2f} s (--heartbeat_timeout 2)")
    assert codes == [1, 1]
    assert_none_done(leader, follower)
    assert root_cause(leader).startswith(f"launcher: the job stopped: node 1 ({nodes[1]}) lost: ")
    assert root_cause(follower).startswith(f"launcher: the job stopped: node 0 ({nodes[0]}) lost: ")
    print(f"  node 0: {root_cause(leader)}\n  node 1: {root_cause(follower)}")
    assert_gone(cluster.pids)


# ---------------------------------------------------------------- 5. restarts


def log_sections(path: Path) -> list:
    """The sections of a worker log: [(header, [lines])]."""
    sections = []
    for line in path.read_text().splitlines():
        if line.startswith("===== "):
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def test_a_worker_that_fails_once_is_restarted_on_every_node(cluster, tmp_path):
    nodes = LOOPBACK[:2]
    port = free_ports(3)
    marker = tmp_path / "failed-once"
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 2, "--max_restarts", 1, "--log_dir", tmp_path / f"log{i}"),
                      WORKER, "--dump", tmp_path, "--fail-rank", 3, "--fail-once", marker, "--world", 4,
                      "--delay", 0.3, "--sleep", 60, "--sleep-restarted", 1)
    first = read_attempt(tmp_path, 4, 0)
    cluster.snapshot()
    second = read_attempt(tmp_path, 4, 1)
    cluster.snapshot()
    follower, leader = cluster.nodes
    assert cluster.finish(30) == [0, 0], leader.stderr + follower.stderr

    for rank in range(4):
        assert first[rank]["env"]["PADDLE_RESTART_COUNT"] == first[rank]["env"]["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert second[rank]["env"]["PADDLE_RESTART_COUNT"] == second[rank]["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert first[rank]["pid"] != second[rank]["pid"]
        sections = log_sections(tmp_path / f"log{rank // 2}" / f"workerlog.{rank}")
        assert len(sections) == 2, sections
        assert "(attempt" not in sections[0][0] and f"rank {rank} starts:" in sections[0][0]
        assert f"rank {rank} starts (attempt 2, restart 1):" in sections[1][0]
        assert f"rank {rank} attempt 0 up" in sections[0][1]
        assert sections[1][1][0] == f"rank {rank} attempt 1 up" and sections[1][1][-1] == f"rank {rank} attempt 1 done"
    assert not list(tmp_path.glob("env.*.2.json"))
    assert "rank 3 on node 1 (127.0.0.2) failed (exit code 7): restarting the job, attempt 2 of 2" in leader.stderr
    assert "node 0 restarts the job: attempt 2 of 2" in follower.stderr
    for node in cluster.nodes:
        assert "launcher: all 2 worker(s) finished in " in node.stderr
        assert "the job stopped" not in node.stderr
    assert_gone(cluster.pids)


def test_when_the_restarts_run_out_every_node_ends_with_the_failing_code(cluster, tmp_path):
    nodes = LOOPBACK[:2]
    port = free_ports(2)
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 1, "--max_restarts", 2), WORKER, "--dump", tmp_path,
                      "--fail-rank", 1, "--code", 5, "--world", 2, "--delay", 0.3, "--sleep", 60)
    for attempt in range(3):
        dumps = read_attempt(tmp_path, 2, attempt)
        assert {r: d["env"]["PADDLE_RESTART_COUNT"] for r, d in dumps.items()} == {0: str(attempt), 1: str(attempt)}
        cluster.snapshot()
    assert cluster.finish(30) == [5, 5]
    assert sorted(p.name for p in tmp_path.glob("exit.*")) == ["exit.1.0", "exit.1.1", "exit.1.2"]
    assert not list(tmp_path.glob("env.*.3.json"))
    for node in cluster.nodes:
        assert stopped_line("rank 1 on node 1 (127.0.0.2) failed (exit code 5)", 5) in node.stderr
        assert "  | rank 1 fails with 5 on attempt 2" in node.stderr
    assert_gone(cluster.pids)


@pytest.mark.parametrize("once,code,attempts", [(True, 0, 2), (False, 7, 2)])
def test_one_node_alone_restarts_too(cluster, tmp_path, once, code, attempts):
    args = ["--fail-once", tmp_path / "marker"] if once else []
    node = cluster.start(["127.0.0.1"], 0, "--nproc_per_node", 2, "--shutdown_timeout", GRACE, "--max_restarts", 1,
                         WORKER, "--dump", tmp_path, "--fail-rank", 1, "--world", 2, "--sleep", 60,
                         "--sleep-restarted", 0.5, *args)
    for attempt in range(attempts):
        dumps = read_attempt(tmp_path, 2, attempt)
        assert {d["env"]["TORCHELASTIC_RESTART_COUNT"] for d in dumps.values()} == {str(attempt)}
        cluster.snapshot()
    assert cluster.finish(30) == [code]
    assert not list(tmp_path.glob(f"env.*.{attempts}.json"))
    assert "restarting the job, attempt 2 of 2" in node.stderr
    if once:
        assert "launcher: all 2 worker(s) finished in " in node.stderr
    else:
        assert "launcher: rank 1 (local rank 1, pid " in node.stderr and "failed: exit code 7 after" in node.stderr
    assert_gone(cluster.pids)
