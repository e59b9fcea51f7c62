"""Spares that keep the job whole, on both membership backends (node 0's launcher, and a real etcd), launchers on
127.0.0.1. What is promised, and tried here: any number of launchers past MAX wait as standbys (MAX + 3 of them here),
none refused and none ended by their count, a standby of etcd past join_timeout and read_timeout too; each member
lost is replaced by the first standby in line, at the lost one's node rank, the job at full size again; a standby
started with ``--warm_start`` holds its workers while it waits and runs its first round in those very processes (their
pids), while the survivors keep theirs. Every wait is bounded by an event, never by a duration.
"""

import subprocess
import time

import psutil
import pytest

from conftest import REPO, WORKERS, assert_all_gone, free_ports, launcher_cmd, listening, wait_for
from etcd_servers import etcd  # noqa: F401 - the fixture
from test_elastic import power_off, ready, records, stop_all, wait_ready

HOST = "127.0.0.1"
WAIT = 120  # seconds any one event may take on a busy machine
HOLD = str(WORKERS / "elastic_worker.py")  # each worker writes FOLDER/ready.RANK and holds until FOLDER/go
INPROCESS = str(WORKERS / "inprocess_train.py")  # re-enters in place (launcher.runtime.elastic.run)
SPARES = 3  # standbys past MAX
# short join and read timeouts: a standby waits past them (etcd's bounded its wait by them, then ended it)
CONF = "heartbeat_timeout=3,keep_alive_interval=0.5,last_call_timeout=60,join_timeout=4,read_timeout=1"
# a warm worker has join_timeout to wait ready in elastic.run: import torch takes more than 4 s on a loaded machine
WARM_CONF = "heartbeat_timeout=3,keep_alive_interval=0.5,last_call_timeout=60,join_timeout=120"


class Launchers:
    """Launchers of one job, each with its stderr in FOLDER/nodeN.err (read while it runs) and its log dir FOLDER/nodeN."""

    def __init__(self, folder, backend: str, endpoint, nnodes: str = "1:2") -> None:
        self.folder, self.backend, self.endpoint, self.nnodes = folder, backend, endpoint, nnodes
        self.procs: list = []
        self.conf = CONF
        self.started_port = free_ports(8) if backend == "etcd" else None  # every node's: rank 0's store is there

    def line(self, node: int, *extra) -> tuple:
        if self.backend == "c10d":
            rendezvous = ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{self.endpoint}")
        else:
            rendezvous = ("--rdzv-backend", "etcd", "--rdzv-endpoint", self.endpoint, "--started_port", self.started_port)
        return ("--nnodes", self.nnodes, "--nproc-per-node", 1, *rendezvous, "--rdzv-id", "spares", "--rdzv-conf", self.conf,
                "--log_dir", self.folder / f"node{len(self.procs)}", *extra)

    def start(self, *args) -> subprocess.Popen:
        node = len(self.procs)
        with open(self.err(node), "w") as err:
            proc = subprocess.Popen(launcher_cmd(*self.line(node), *args), cwd=REPO, stdout=subprocess.DEVNULL,
                                    stderr=err, text=True)
        self.procs.append(proc)
        if node == 0 and self.backend == "c10d":  # the first one binds the endpoint: node 0, however busy the machine
            wait_for(lambda: listening(HOST, self.endpoint), WAIT, "node 0's launcher on the endpoint")
        elif node == 0:  # with etcd, the oldest key is node 0: its key is in etcd before the next launcher starts
            self.wait(lambda: "elastic job: joined the job" in self.said(0), "node 0's key in etcd")
        return proc

    def err(self, node: int):
        return self.folder / f"node{node}.err"

    def said(self, node: int) -> str:
        return self.err(node).read_text(errors="replace")

    def standby(self, *args) -> int:
        """One more launcher, once it says that it waits as a standby; its index."""
        self.start(*args)
        node = len(self.procs) - 1
        self.wait(lambda: "this launcher waits as a standby" in self.said(node), f"node {node} to wait as a standby")
        return node

    def wait(self, predicate, what: str) -> None:
        try:
            wait_for(predicate, WAIT, what)
        except AssertionError:
            stop_all(self.procs)
            raise AssertionError(f"timed out waiting for {what}:\n{self.all_said()}") from None

    def all_said(self) -> str:
        return "\n".join(f"--- launcher {n}:\n{self.said(n)[-3000:]}" for n in range(len(self.procs)))

    def finish(self, nodes) -> dict:
        """node -> exit code of each of ``nodes``, each awaited (bounded)."""
        codes = {}
        for n in nodes:
            try:
                codes[n] = self.procs[n].wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                stop_all(self.procs)
                raise AssertionError(f"launcher {n} did not end:\n{self.all_said()}") from None
        return codes

    def node_of(self, worker_pid: int) -> int:
        parent = psutil.Process(worker_pid).parent().pid
        return next(n for n, p in enumerate(self.procs) if p.pid == parent)


@pytest.fixture(params=["c10d", "etcd"])
def launchers(request, tmp_path):
    if request.param == "c10d":
        made = Launchers(tmp_path, "c10d", free_ports(6))
    else:
        made = Launchers(tmp_path, "etcd", request.getfixturevalue("etcd").endpoints)
    yield made
    stop_all(made.procs)


@pytest.mark.usefixtures("workers_without_torch")
def test_max_plus_three_launchers_all_wait_and_each_loss_promotes_the_first_in_line(launchers):
    """--nnodes 1:2 and five launchers: two members, three standbys in the order they came; a member powered off is
    replaced by the first standby, at its node rank (world size 2 again), the next loss by the next one; nobody is
    refused or ends before the job does, the standby left over exits 0 with it."""
    folder = launchers.folder
    for _ in range(2):
        launchers.start(HOLD, folder, 3, "hold")
    first = wait_ready(folder, 2, launchers.procs)
    spares = [launchers.standby(HOLD, folder, 3, "hold") for _ in range(SPARES)]
    time.sleep(max(0.0, 6.0 - (time.monotonic() - spare_began(launchers, spares[-1]))))  # past join + read timeouts
    assert ready(folder).keys() == {0, 1}  # the standbys stay out of the running round
    assert all(launchers.procs[n].poll() is None for n in spares), launchers.all_said()
    old = {pid for pid, _ in first.values()}
    lost = [launchers.node_of(first[1][0])]  # rank 1's node: never node 0 (c10d's keeper; its loss ends the job)
    gone = power_off(launchers.procs[lost[0]])
    now = wait_ready(folder, 2, launchers.procs, WAIT, old)
    assert launchers.node_of(now[1][0]) == spares[0] and "this launcher is node 1" in launchers.said(spares[0])
    lost.append(spares[0])
    gone += power_off(launchers.procs[spares[0]])
    old |= {pid for pid, _ in now.values()}
    now = wait_ready(folder, 2, launchers.procs, WAIT, old)
    assert launchers.node_of(now[1][0]) == spares[1], launchers.all_said()
    assert launchers.procs[spares[2]].poll() is None  # still in line
    (folder / "go").touch()
    staying = [n for n in range(len(launchers.procs)) if n not in lost]
    codes = launchers.finish(staying)
    assert codes == {n: 0 for n in staying}, launchers.all_said()
    assert "the job ended without this launcher" in launchers.said(spares[2])
    assert all("Traceback" not in launchers.said(n) and "did not take this launcher" not in launchers.said(n)
               for n in range(len(launchers.procs)))
    assert sorted(r["rank"] for r in records(folder)) == [0, 1] and {r["world"] for r in records(folder)} == {2}
    assert_all_gone([p.pid for p in launchers.procs] + gone + [r["pid"] for r in records(folder)])


def spare_began(launchers: Launchers, node: int) -> float:
    """When launcher ``node`` started, on the monotonic clock (its process's creation time, moved over)."""
    return time.monotonic() - (time.time() - psutil.Process(launchers.procs[node].pid).create_time())


def steps(launchers: Launchers, node: int) -> list:
    """Every step line of the node's workers (inprocess_train.py's ``step=N world=W rank=R pid=P``)."""
    lines = [line for path in sorted((launchers.folder / f"node{node}").glob("workerlog.*"))
             for line in path.read_text(errors="replace").splitlines()]
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in lines
            if " step=" in f" {line}" and " world=" in line and " pid=" in line]


def pids_at(launchers: Launchers, node: int, after: int = -1) -> set:
    return {int(s["pid"]) for s in steps(launchers, node) if int(s["step"]) > after}


def workers_of(launchers: Launchers, node: int) -> set:
    """The pids of the worker processes under launcher ``node`` now."""
    return {c.pid for c in psutil.Process(launchers.procs[node].pid).children()
            if INPROCESS in " ".join(c.cmdline())}


@pytest.mark.real_torch
def test_a_warm_standby_is_promoted_with_the_workers_it_held(launchers):
    """A standby started with --warm_start holds its worker while it waits; a member powered off, it takes the place
    in that very process (the pid it held is the one whose steps run at world size 2), and the survivor keeps its
    own."""
    launchers.conf = WARM_CONF
    for _ in range(2):
        launchers.start(INPROCESS, launchers.folder)
    launchers.wait(lambda: all(any(s["world"] == "2" for s in steps(launchers, n)) for n in (0, 1)), "a round of 2")
    spare = launchers.standby("--warm_start", INPROCESS, launchers.folder)
    held = workers_of(launchers, spare)
    assert len(held) == 1 and "1 worker(s) started warm" in launchers.said(spare), launchers.said(spare)
    survivor, lost = 0, 1  # never node 0 lost: c10d's keeper (its loss ends the job)
    kept = pids_at(launchers, survivor)
    last = max(int(s["step"]) for s in steps(launchers, survivor))
    gone = power_off(launchers.procs[lost])
    launchers.wait(lambda: pids_at(launchers, spare) and pids_at(launchers, survivor, last + 1), "the spare's steps")
    assert pids_at(launchers, spare) == held, launchers.all_said()
    assert all(s["world"] == "2" for s in steps(launchers, spare))
    assert pids_at(launchers, survivor) == kept, "the survivor has new processes"
    events = (launchers.folder / f"node{spare}" / "events.jsonl").read_text()
    assert '"warm": true' in events
    furthest = max(int(s["step"]) for n in (survivor, spare) for s in steps(launchers, n))
    (launchers.folder / "finish.tmp").write_text(str(furthest + 5))
    (launchers.folder / "finish.tmp").rename(launchers.folder / "finish")
    codes = launchers.finish([survivor, spare])
    assert codes == {survivor: 0, spare: 0}, launchers.all_said()
    assert "Traceback" not in launchers.said(spare)
    assert_all_gone(gone + list(held))
