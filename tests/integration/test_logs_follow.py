"""``launcher logs -f`` on a log dir of 10,000 logs, as real processes: what it follows (a line
appended, a new log, a log truncated), what it costs while nothing is written, the same where
inotify cannot be had (a user namespace without it: it polls), and a reader that leaves."""

import os
import queue
import signal
import subprocess
import threading
import time

import psutil
import pytest

from conftest import REPO, launcher_cmd

LOGS = 10_000
SHOWN_WITHIN_S = 10  # generous, for 2 loaded cores: inotify shows a line in milliseconds, polling in about 0.5 s
IDLE_S = 3.0
NO_INOTIFY = {"instances": "max_inotify_instances", "watches": "max_inotify_watches"}


def many_logs(folder, n=LOGS):
    folder.mkdir()
    for rank in range(n):
        (folder / f"workerlog.{rank}").write_text(f"hello {rank}\n")
    return folder


def userns_works() -> bool:
    try:
        r = subprocess.run(["unshare", "-Ur", "sh", "-c", "echo 0 > /proc/sys/user/max_inotify_instances"],
                           capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


class Follower:
    """``launcher logs DIR -f`` (``without`` inotify: in a user namespace whose limit of it is 0),
    its stdout read by a thread, each line with the time it came."""

    def __init__(self, log_dir, without=None) -> None:
        cmd = launcher_cmd("logs", log_dir, "-f")
        if without:
            cmd = ["unshare", "-Ur", "sh", "-c", f'echo 0 > /proc/sys/user/{NO_INOTIFY[without]} && exec "$@"',
                   "sh", *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        self.lines: queue.Queue = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, wanted: str, within: float = SHOWN_WITHIN_S) -> float:
        """Seconds until the line ``wanted`` shows (it must, within ``within``)."""
        start = deadline = time.monotonic()
        deadline += within
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{wanted!r} not shown within {within} s") from None
            assert line is not None, f"the follower ended before {wanted!r}: {self.stop()[1]}"
            self.seen.append(line)
            if line == wanted:
                return time.monotonic() - start

    def idle_cpu(self, seconds: float) -> float:
        """The follower's CPU time over ``seconds`` of nothing written, per second: a fraction of a core."""
        proc = psutil.Process(self.proc.pid)
        before, start = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        return (sum(proc.cpu_times()[:2]) - before) / (time.monotonic() - start)

    def stop(self):
        """Ctrl-C; (exit code, stderr), every line shown counted in ``seen``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            err = self.proc.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = self.proc.communicate()[1]
        while True:
            line = self.lines.get(timeout=10)
            if line is None:
                return self.proc.returncode, err
            self.seen.append(line)


def follows_every_change(f: Follower, log_dir) -> None:
    """A line appended, a new log, a log truncated and written anew, a partial line finished: each
    shown once, whole."""
    f.expect(f"[rank {LOGS - 1}] hello {LOGS - 1}", within=60)  # the logs as they were, merged
    with open(log_dir / "workerlog.5000", "a") as log:
        log.write("appended\n")
    f.expect("[rank 5000] appended")
    (log_dir / f"workerlog.{LOGS}").write_text("a new rank\n")
    f.expect(f"[rank {LOGS}] a new rank")
    (log_dir / "workerlog.7").write_text("truncated, then this\n")
    f.expect("[rank 7] truncated, then this")
    with open(log_dir / "workerlog.9", "a") as log:
        log.write("half of ")
        log.flush()
        time.sleep(0.5)
        log.write("a line\n")
    f.expect("[rank 9] half of a line")


@pytest.fixture
def big_dir(tmp_path):
    return many_logs(tmp_path / "logs")


def test_follows_a_line_a_new_log_and_a_truncated_one_among_10000_logs(big_dir):
    f = Follower(big_dir)
    try:
        follows_every_change(f, big_dir)
    finally:
        code, err = f.stop()
    assert code == 130 and err.strip() == "", err  # click writes a newline on Ctrl-C
    assert len(f.seen) == len(set(f.seen)) == LOGS + 4  # nothing twice, nothing else


def test_the_follower_of_10000_logs_takes_under_half_a_core_while_nothing_is_written(big_dir):
    f = Follower(big_dir)
    try:
        f.expect(f"[rank {LOGS - 1}] hello {LOGS - 1}", within=60)
        time.sleep(0.5)  # its start-up done
        used = f.idle_cpu(IDLE_S)
    finally:
        f.stop()
    assert used < 0.5, f"{used:.2f} of a core while nothing was written"


needs_userns = pytest.mark.skipif(not userns_works(), reason="needs unshare -Ur (unprivileged user namespaces)")


@needs_userns
@pytest.mark.parametrize("without", sorted(NO_INOTIFY))
def test_without_inotify_it_polls_says_so_once_and_follows_the_same(big_dir, without):
    f = Follower(big_dir, without=without)
    try:
        follows_every_change(f, big_dir)
        used = f.idle_cpu(IDLE_S)
    finally:
        code, err = f.stop()
    assert code == 130 and len(f.seen) == len(set(f.seen)) == LOGS + 4
    limit = {"instances": "fs.inotify.max_user_instances", "watches": "fs.inotify.max_user_watches"}[without]
    said = err.strip().splitlines()  # (click adds an empty line on Ctrl-C)
    assert len(said) == 1 and said[0].startswith(f"launcher: warning: logs -f: cannot watch {big_dir}") and limit in err
    assert used < 0.5, f"{used:.2f} of a core while polling and nothing was written"


def append_until_it_ends(proc, log, within=30):
    """Lines appended to ``log`` until the follower ``proc`` exits (killed after ``within`` s); its stderr."""
    try:
        deadline = time.monotonic() + within
        while proc.poll() is None and time.monotonic() < deadline:
            with open(log, "a") as f:
                f.write("a line\n")
            time.sleep(0.2)
        return proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_follower_whose_reader_leaves_ends_quietly(tmp_path):
    """As under ``| head -3``: the reader takes the lines it wanted and closes its end of the pipe."""
    log_dir = many_logs(tmp_path / "logs", n=3)
    proc = subprocess.Popen(launcher_cmd("logs", log_dir, "-f"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    guard = threading.Timer(60, proc.kill)  # bounds the readlines
    guard.start()
    try:
        first = [proc.stdout.readline() for _ in range(3)]
    finally:
        guard.cancel()
    assert first == [b"[rank %d] hello %d\n" % (r, r) for r in range(3)]
    proc.stdout.close()
    err = append_until_it_ends(proc, log_dir / "workerlog.1")  # a new line: its write fails
    assert (proc.returncode, err) == (0, b"")


def test_a_follower_whose_output_cannot_be_written_says_so_in_one_sentence(tmp_path):
    """Its logs empty at first: the first write that fails is of a line it followed."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "workerlog.0").write_bytes(b"")
    with open(os.devnull, "rb") as nothing, open("/dev/full", "wb") as full:
        proc = subprocess.Popen(launcher_cmd("logs", log_dir, "-f"), cwd=REPO, stdin=nothing, stdout=full,
                                stderr=subprocess.PIPE, text=True)
    err = append_until_it_ends(proc, log_dir / "workerlog.0")
    assert proc.returncode == 1
    assert err == "launcher: error: cannot write to stdout (No space left on device); send the output somewhere that takes it.\n"
