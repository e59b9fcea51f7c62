"""The job of the tests of survivors that keep their processes (``launcher.runtime.elastic``): launchers of an elastic
job on 127.0.0.1, with real gloo groups, on both membership backends (node 0's launcher, and a real etcd), their
workers' step lines, and the checks those tests share. What is promised, and tried there:
- test_inprocess_losses.py: when a node is lost (its processes killed, or all of them stopped), or two at once, the
  survivors' workers go on in the same processes at the next step, in the smaller world, with no step lost but the
  one in flight and the same parameters on every rank;
- test_inprocess_joiners.py: a launcher that joins gets the survivors' parameters, bit for bit; a node lost while
  the state is being sent, the sender's own included (etcd: any node may be lost), costs one more re-form, not the
  job;
- test_inprocess.py: the example the docs show does both.
Every wait is bounded by an event (a step line, a file), never by a duration. (Three files: xdist gives each file
to one process, and the tests of one file took six minutes together.)
"""

import json
import time

import pytest

from conftest import REPO, WORKERS, finish_all, free_ports, listening, read_until, start_launcher, wait_for
from test_elastic import stop_all

EXAMPLE = REPO / "examples" / "elastic_inprocess.py"

WORKER = str(WORKERS / "inprocess_train.py")
HOST = "127.0.0.1"
WAIT = 120  # seconds any one event may take on a busy machine
# a last call long enough for MAX launchers to start the first round together however busy the machine is; a job
# that starts with fewer (a join test's) sets ``last_call`` short
C10D_CONF = "heartbeat_timeout=3,keep_alive_interval=0.5"
ETCD_CONF = "heartbeat_timeout=4,keep_alive_interval=0.5,join_timeout=60"


class Job:
    """Launchers of one job, each with its log dir FOLDER/nodeN; their workers' steps read from those logs."""

    def __init__(self, folder, backend, endpoint, nnodes="2:3") -> None:
        self.folder, self.backend, self.endpoint, self.nnodes = folder, backend, endpoint, nnodes
        self.procs: list = []
        self.heads: dict = {}  # node -> what its launcher wrote before it joined (read to see it join), kept for its end
        self.job_id = "inprocess"
        self.last_call = 60
        self.started_port = free_ports(4) if backend == "etcd" else None  # every node's: rank 0's store is there

    def line(self, node: int) -> tuple:
        common = ("--nnodes", self.nnodes, "--nproc-per-node", 1, "--rdzv-id", self.job_id,
                  "--log_dir", self.folder / f"node{node}")
        if self.backend == "c10d":
            return (*common, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{self.endpoint}",
                    "--rdzv-conf", f"{C10D_CONF},last_call_timeout={self.last_call}", WORKER, self.folder)
        return (*common, "--rdzv-backend", "etcd", "--rdzv-endpoint", self.endpoint,
                "--rdzv-conf", f"{ETCD_CONF},last_call_timeout={self.last_call}",
                "--started_port", self.started_port, WORKER, self.folder)

    def start(self, count: int) -> list:
        started = []
        for _ in range(count):
            node = len(self.procs)
            self.procs.append(start_launcher(*self.line(node)))
            started.append(node)
            if node == 0 and self.backend == "c10d":  # the first one binds the endpoint: node 0, however busy the machine
                wait_for(lambda: listening(HOST, self.endpoint), WAIT, "node 0's launcher on the endpoint")
            elif self.backend == "etcd":  # the oldest key is node 0: each launcher's key is in etcd before the next starts
                # (not a sleep: on a busy machine a later one may get there first, and node 2 stopped would hold rank 0's port)
                self.heads[node] = read_until(self.procs[node], "elastic job: joined the job", WAIT)
            else:
                time.sleep(0.5)
        return started

    def steps(self, node: int) -> list:
        """Every step line of the node's workers, from each log it had (workerlog.RANK: a round may change its rank)."""
        lines = [line for path in sorted((self.folder / f"node{node}").glob("workerlog.*"))
                 for line in path.read_text(errors="replace").splitlines()]
        return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in lines
                if " step=" in f" {line}" and " world=" in line and " pid=" in line]

    def wait_world(self, nodes, world: int, after: int = 0) -> dict:
        """Each of ``nodes``'s step lines once it made a step in a world of ``world``: node -> its lines."""
        def made():
            return all(any(s["world"] == str(world) and int(s["step"]) > after for s in self.steps(n)) for n in nodes)
        self.wait(made, f"a step of world {world} on nodes {nodes}")
        return {n: self.steps(n) for n in nodes}

    def wait(self, predicate, what: str) -> None:
        """``wait_for``, and on a timeout the workers' logs and the launchers' last words in the failure."""
        try:
            wait_for(predicate, WAIT, what)
        except AssertionError:
            stop_all(self.procs)
            launchers = "\n".join(f"--- launcher of node {n}:\n{(self.heads.get(n, '') + p.stderr.read())[-3000:]}"
                                  for n, p in enumerate(self.procs))
            raise AssertionError(f"timed out waiting for {what}:\n{self.said()}\n{launchers}") from None

    def digests(self) -> list:
        path = self.folder / "digests.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def finish(self, nodes) -> list:
        """Every rank ends 10 steps past the furthest one now; (code, out, err) of ``nodes``'s launchers."""
        furthest = max(int(s["step"]) for n in nodes for s in self.steps(n))
        (self.folder / "finish.tmp").write_text(str(furthest + 10))
        (self.folder / "finish.tmp").rename(self.folder / "finish")
        try:
            results = finish_all([self.procs[n] for n in nodes], timeout=WAIT)
            return [(code, out, self.heads.get(n, "") + err) for n, (code, out, err) in zip(nodes, results)]
        finally:
            stop_all(self.procs)

    def said(self) -> str:
        return "\n".join(f"--- node {n}, {path.name}: {path.read_text(errors='replace')[-1500:]}"
                         for n in range(len(self.procs)) for path in sorted((self.folder / f"node{n}").glob("workerlog.*")))


@pytest.fixture(params=["c10d", "etcd"])
def job(request, tmp_path):
    """A Job of each backend (a module that uses it imports etcd_servers's fixture ``etcd`` too)."""
    if request.param == "c10d":
        made = Job(tmp_path, "c10d", free_ports(6))
    else:
        made = Job(tmp_path, "etcd", request.getfixturevalue("etcd").endpoints)
    yield made
    stop_all(made.procs)


def pids_in(lines, world: int) -> set:
    return {int(s["pid"]) for s in lines if s["world"] == str(world)}


def check_went_on(job: Job, survivors, before: int, after: int) -> None:
    """Each survivor made steps in the world of ``after`` in the process it had in the world of ``before``, the
    first of them right after the last step the new rank 0 made before; every rank of the round held the same
    parameters."""
    lines = {n: job.steps(n) for n in survivors}
    for n in survivors:
        assert pids_in(lines[n], after) == pids_in(lines[n], before), f"node {n} has new processes:\n{job.said()}"
    new_rank_0 = next(n for n in survivors if any(s["world"] == str(after) and s["rank"] == "0" for s in lines[n]))
    last_before = max(int(s["step"]) for s in lines[new_rank_0] if s["world"] == str(before))
    first_after = min(int(s["step"]) for n in survivors for s in lines[n] if s["world"] == str(after))
    assert first_after == last_before + 1, (last_before, first_after)
    round_ = [d for d in job.digests() if d["world"] == after and d["step"] == first_after - 1]
    assert len({d["rank"] for d in round_}) == after and len({d["digest"] for d in round_}) == 1, round_


def check_ended_well(results, kept=None) -> None:
    """Every launcher exited 0 with no traceback; those of ``kept`` (indexes in ``results``; all by default) kept
    their workers for a round."""
    for i, (code, out, err) in enumerate(results):
        assert code == 0 and "Traceback" not in err, err
        if kept is None or i in kept:
            assert "keeping the 1 worker(s) for the next round" in err, err
