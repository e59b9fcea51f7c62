"""launcher.runtime.elastic.run in real worker processes (tests/integration/workers/reform_probe.py, real torch
gloo groups), with this test as their launcher: the local channel (WorkerChannel, served here) and the workers
as this process's own children. Every wait is bounded (WAIT); every worker is killed at the end. A fleet program's
rounds are test_runtime_elastic_fleet.py's (a file of its own, which xdist runs beside this one)."""

import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, free_port
from launcher.run.worker_channel import WorkerChannel

WORKER = str(REPO / "tests" / "integration" / "workers" / "reform_probe.py")
WAIT = 60.0
REFORMS = 50


def env_of(rank, world_size, port) -> dict:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


class Launcher:
    """The launcher's part: the channel, served while a test waits, and the workers it started."""

    def __init__(self, folder, reform_wait=30.0):
        self.folder = folder
        self.channel = WorkerChannel("reform-test", lambda: {"round": 0, "reform_wait": reform_wait},
                                     lambda pid: any(w.pid == pid for w in self.workers))
        self.channel.listen()
        self.workers = []
        self.may_end = set()  # pids of the workers a test lets end (the others ending fails the wait at once)
        self.parked = set()
        self.round = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for w in self.workers:
            if w.poll() is None:
                w.kill()  # SIGKILL ends a SIGSTOPped worker too
            w.wait()
        self.channel.close()

    def start(self, rank, world_size, port, **extra) -> subprocess.Popen:
        n = len(self.workers)
        out, err = self.folder / f"worker{n}.jsonl", self.folder / f"worker{n}.err"
        env = {**os.environ, **self.channel.env(), **env_of(rank, world_size, port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO), **extra}
        with open(err, "wb") as errors:
            w = subprocess.Popen([sys.executable, WORKER, str(out)], env=env, cwd=REPO, stdout=errors,
                                 stderr=subprocess.STDOUT)
        w.out, w.err = out, err
        self.workers.append(w)
        self.serve(lambda: self.channel.connected(w.pid), f"the hello of worker {n}")
        return w

    def serve(self, done, what) -> None:
        """Serve the channel until ``done()``; fails after WAIT seconds, or at once when a worker ends unbidden."""
        deadline = time.monotonic() + WAIT
        while not done():
            ended = [w for w in self.workers if w.pid not in self.may_end and w.poll() is not None]
            if ended or time.monotonic() > deadline:
                tails = "\n".join(f"--- worker {w.pid} (exit {w.poll()}):\n{w.err.read_text()[-3000:]}"
                                  for w in self.workers)
                raise AssertionError(f"{'a worker ended' if ended else 'timed out'} waiting for {what}\n{tails}")
            with selectors.DefaultSelector() as selector:
                for fd, mask in self.channel.registrations().items():
                    selector.register(fd, mask)
                for key, mask in selector.select(0.05):
                    for said in self.channel.ready(key.fd, mask):
                        if said.message["t"] == "parked":
                            self.parked.add(said.pid)

    def stop(self, workers) -> None:
        """Say the round is over to each of ``workers``, and wait until each parked."""
        self.round += 1
        for w in workers:
            self.parked.discard(w.pid)
            assert self.channel.send(w.pid, {"t": "stop", "round": self.round, "reason": "test"})
        self.serve(lambda: all(w.pid in self.parked for w in workers), f"parked after stop {self.round}")

    def go(self, envs: dict) -> None:
        """Give each worker (key) its next round's variables (value), and wait for each to enter ``train``."""
        entered = {w: len(entries(w)) for w in envs}
        for w, env in envs.items():
            assert self.channel.send(w.pid, {"t": "round", "round": self.round, "env": env})
        self.serve(lambda: all(len(entries(w)) > n for w, n in entered.items()), "the next round's train")


def lines(worker) -> list:
    text = worker.out.read_text() if worker.out.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]  # whole lines


def entries(worker) -> list:
    return [r for r in lines(worker) if r["event"] == "enter"]


def test_fifty_reforms_in_one_process_leak_nothing(tmp_path):
    port = free_port()  # the same port every round: rank 0's store of the last round must have let it go
    with Launcher(tmp_path) as launcher:
        workers = [launcher.start(rank, 2, port) for rank in range(2)]
        launcher.serve(lambda: all(entries(w) for w in workers), "the first round's train")
        for _ in range(REFORMS):
            launcher.stop(workers)
            launcher.go({w: env_of(rank, 2, port) for rank, w in enumerate(workers)})
        rounds = [entries(w) for w in workers]

    for w, seen in zip(workers, rounds):
        assert [r["round"] for r in seen] == list(range(REFORMS + 1))
        assert {r["pid"] for r in seen} == {w.pid}
        first, last = seen[0], seen[-1]
        for what in ("fds", "threads", "tasks"):
            assert last[what] == first[what], (what, [r[what] for r in seen])
        # round 0's RSS is read before the first step (the first steps add some MB, later rounds nothing)
        assert abs(last["rss"] - first["rss"]) <= 0.1 * first["rss"], [r["rss"] for r in seen]
    for r0, r1 in zip(*rounds):
        assert (r0["rank"], r1["rank"], r0["world_size"], r1["world_size"]) == (0, 1, 2, 2)
        assert (r0["digest"], r0["step"]) == (r1["digest"], r1["step"])


@pytest.mark.parametrize("env", [{}, {"REFORM_FLEET": "optimizer", "REFORM_COMM_NUM": "2"}], ids=["plain", "fleet"])
def test_a_collective_blocked_on_a_frozen_peer_is_interrupted(tmp_path, env):
    """fleet with nccl_comm_num=2: the all-reduce blocks in a process group fleet made in the round, not the round's."""
    with Launcher(tmp_path) as launcher:
        rank0 = go_on_past_a_frozen_peer(launcher, env)
        steps = entries(rank0)[-1]["step"]
        launcher.serve(lambda: lines(rank0)[-1]["step"] > steps, "rank 0's steps alone")


def go_on_past_a_frozen_peer(launcher, env) -> subprocess.Popen:
    """Two ranks step; rank 1 is frozen (SIGSTOP) while rank 0 waits in an all-reduce, the round is over for rank 0,
    rank 1 is killed: rank 0 enters the next round alone, in the same process. Rank 0."""
    port = free_port()
    rank0, rank1 = (launcher.start(rank, 2, port, **env) for rank in range(2))
    launcher.serve(lambda: all(any(r["event"] == "step" for r in lines(w)) for w in (rank0, rank1)), "steps of both ranks")
    launcher.may_end.add(rank1.pid)
    os.kill(rank1.pid, signal.SIGSTOP)
    time.sleep(0.5)  # rank 0 reaches its next all-reduce and blocks there
    launcher.stop([rank0])
    rank1.kill()
    launcher.go({rank0: env_of(0, 1, port)})
    last = entries(rank0)[-1]
    assert (last["round"], last["rank"], last["world_size"], last["pid"]) == (1, 0, 1, rank0.pid)
    return rank0


def test_an_exception_without_a_stop_is_raised_after_reform_wait(tmp_path):
    with Launcher(tmp_path, reform_wait=1) as launcher:
        worker = launcher.start(0, 1, free_port(), REFORM_RAISE_AT="5")
        launcher.may_end.add(worker.pid)
        launcher.serve(lambda: worker.poll() is not None, "the worker's end")
        assert worker.returncode != 0
        assert "RuntimeError: reform_probe: raised at step 5" in worker.err.read_text()
        assert worker.pid not in launcher.parked


def test_a_joiner_takes_the_state_of_the_survivor(tmp_path):
    port = free_port()
    with Launcher(tmp_path) as launcher:
        rank0 = launcher.start(0, 1, port)
        launcher.serve(lambda: any(r["event"] == "step" for r in lines(rank0)), "steps of rank 0 alone")
        launcher.stop([rank0])
        rank1 = launcher.start(1, 2, port)
        launcher.go({rank0: env_of(0, 2, port)})
        launcher.serve(lambda: entries(rank1), "the joiner's train")
        survivor, joiner = entries(rank0)[-1], entries(rank1)[-1]

    assert (survivor["round"], survivor["world_size"], joiner["round"], joiner["world_size"]) == (1, 2, 0, 2)
    assert survivor["source"] == joiner["source"] == 0
    assert survivor["step"] > 0
    assert (joiner["digest"], joiner["step"]) == (survivor["digest"], survivor["step"])


def test_what_the_program_held_when_run_began_is_left_out_of_the_round_end_collections_until_it_returns():
    """The collection at each round's end (every launcher waits for it before the next round) looks only at what was
    made since ``run`` began: a cycle made in a round is collected, one made before is left alone until ``run``
    returns, and then every object is the collector's again. A program that froze objects itself is left as it is."""
    import gc
    import weakref

    from launcher.runtime.elastic import _frozen

    if gc.get_freeze_count():
        pytest.skip("this test process froze objects before")

    class Node:
        pass

    before = Node()
    before.me = before
    held = weakref.ref(before)
    with _frozen():
        assert gc.get_freeze_count() > 0
        made = Node()
        made.me = made
        gone = weakref.ref(made)
        del made, before
        gc.collect()
        assert gone() is None
        assert held() is not None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert held() is None

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _frozen():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
