"""launcher.run.warm and the worker's side of it (launcher.runtime.channel.await_first_round), with real child
processes on real socket pairs: a warm worker gets the job's and its local variables only; once it says ready it is
woken with its round's variables and output; one that says anything else, ends, or stays silent is let go (ended,
saying why); a worker given a broken wake ends with exit code 1 rather than running with a half environment."""

import os
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import psutil
import pytest

from launcher import envvars as ev
from launcher.run import warm as warm_module
from launcher.run.starter import SubprocessStarter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a worker that waits as elastic.run does, then says what it got
WAITS = textwrap.dedent("""
    import os, sys
    from launcher.runtime.channel import await_first_round
    await_first_round()
    print("rank", os.environ.get("RANK"), "local", os.environ.get("LOCAL_RANK"), "fd", os.environ.get("LAUNCHER_WARM_FD"),
          flush=True)
    print("to stderr", file=sys.stderr, flush=True)
""")


def spec(code: str, local_rank: int = 0, env=None):
    return SimpleNamespace(cmd=(sys.executable, "-u", "-c", code), local_rank=local_rank, label=f"rank {local_rank}",
                           cpus=None, env={ev.LOCAL_RANK: str(local_rank), ev.RANK: "7", ev.WORLD_SIZE: "9",
                                           ev.MASTER_ADDR: "10.0.0.1", **(env or {})})


def plan(*specs):
    return SimpleNamespace(workers=specs, base_env={**os.environ, "PYTHONPATH": REPO, "JOB_VAR": "1"})


@pytest.fixture
def warm():
    made = warm_module.WarmWorkers(SubprocessStarter())
    yield made
    made.close()


def test_a_warm_worker_starts_with_the_job_and_its_place_only():
    env = warm_module.warm_env(plan(), spec("", 1, {ev.SELECTED_GPUS: "3"}), 42)
    assert env["JOB_VAR"] == "1" and env[ev.LOCAL_RANK] == "1" and env[ev.SELECTED_GPUS] == "3"
    assert env[ev.WARM_FD] == "42"
    assert not {ev.RANK, ev.WORLD_SIZE, ev.MASTER_ADDR} & set(env)


def test_a_ready_worker_is_woken_with_its_round(warm):
    warm.start(plan(spec(WAITS)))
    warm.await_ready(60)
    one = warm.take(0)
    assert one is not None and one.ready
    r, w = os.pipe()
    try:
        assert warm_module.wake(one, {"RANK": "5", "LOCAL_RANK": "0", "PYTHONPATH": REPO}, (w, w), False) is None
    finally:
        os.close(w)
    with os.fdopen(r) as out:
        said = out.read()
    assert one.proc.wait(60) == 0
    assert said == "rank 5 local 0 fd None\nto stderr\n"  # the round's whole environment, its fds, no trace of the wait


@pytest.mark.parametrize("code, why", [
    ("import sys; sys.exit(3)", "it ended (exit code 3) before it waited in launcher.runtime.elastic.run"),
    ("import os, time; os.write(int(os.environ['LAUNCHER_WARM_FD']), b'hello there\\n'); time.sleep(600)",
     "it said something else than ready"),
])
def test_a_worker_that_does_not_wait_is_let_go_saying_why(warm, caplog, code, why):
    warm.start(plan(spec(code)))
    pid = warm.by_local[0].proc.pid
    with caplog.at_level("WARNING", logger="launcher"):
        warm.await_ready(60)
    assert warm.take(0) is None
    assert f"rank 0 not kept warm: {why}; it starts with its round" in caplog.text
    assert not psutil.pid_exists(pid)


def test_a_silent_worker_is_ended_at_the_wait_s_end(warm, caplog):
    warm.start(plan(spec("import time; time.sleep(600)")))
    pid = warm.by_local[0].proc.pid
    with caplog.at_level("WARNING", logger="launcher"):
        warm.await_ready(0.5)
    assert "did not wait in launcher.runtime.elastic.run within 0.5 s" in caplog.text
    assert warm.take(0) is None and not psutil.pid_exists(pid)


def test_close_ends_the_workers_never_woken(warm):
    warm.start(plan(spec(WAITS), spec(WAITS, 1)))
    warm.await_ready(60)
    pids = [w.proc.pid for w in warm.by_local.values()]
    warm.close()
    assert len(pids) == 2 and not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.parametrize("sent", [b"", b"not json\n", b'{"t": "round", "env": [1, 2]}\n', b'{"t": "stop"}\n'])
def test_a_broken_wake_ends_the_worker_with_code_1(sent):
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": REPO, ev.WARM_FD: str(theirs.fileno())}
    proc = subprocess.Popen([sys.executable, "-c", WAITS], env=env, pass_fds=(theirs.fileno(),),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    theirs.close()
    try:
        assert ours.recv(6) == b"ready\n"
        ours.sendall(sent)
        ours.close()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1 and b"rank" not in out


class FakeClock:
    """Time that moves only as the warm workers wait on it: a wait of any length takes no real time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def select(self, selector, timeout):
        ready = selector.select(0)
        if not ready:
            self.now += timeout
        return ready


class NeverEnds:
    """A starter whose processes never end and never speak; ``holds``: each keeps its end of the socket open (else
    it is closed as soon as the process is started, as a worker's that closed it)."""

    def __init__(self, holds: bool) -> None:
        self.holds = holds
        self.ends: list = []
        self.killed: list = []

    def start(self, cmd, env, stdout, stderr, pass_fds=(), cpus=None):
        if self.holds:
            self.ends += [os.dup(fd) for fd in pass_fds]
        return SimpleNamespace(pid=4242)

    def exit_status(self, pid):
        return None

    def signal_group(self, pid, sig):
        self.killed.append(pid)

    def reap(self, pid, wait=False):
        return 0


@pytest.mark.parametrize("holds, why, waited", [
    (True, "it did not wait in launcher.runtime.elastic.run within 3600 s", 3600),
    (False, "it closed its socket before it waited in launcher.runtime.elastic.run", warm_module.ENDING),
])
def test_the_waits_are_on_the_clock(caplog, holds, why, waited):
    """The wait for ready, and the look for the exit code of a worker whose socket closed, run on the given clock:
    an hour passes at once on a fake one."""
    starter, clock = NeverEnds(holds), FakeClock()
    warm = warm_module.WarmWorkers(starter, clock)
    warm.start(plan(spec("")))
    try:
        with caplog.at_level("WARNING", logger="launcher"):
            warm.await_ready(3600)
    finally:
        for fd in starter.ends:
            os.close(fd)
    assert f"rank 0 not kept warm: {why}; it starts with its round" in caplog.text
    assert waited <= clock.now - 1000.0 < waited + 1 and starter.killed == [4242] and warm.take(0) is None
