"""A console nobody reads, or reads slowly, never holds the job's end, its exit code or its stop of
other nodes: real launchers, real pipes whose read end stays open and unread (as ``| sleep 12``
holds it), slow readers, Ctrl-C, two nodes, and the operator tools. Every wait is bounded.

The promise is a time: a job whose rank 1 fails after 1 s ends within 4 s, with the failing
worker's code, whatever the console does. These tests check its events on a busy machine: the
launcher ends, with that code, while a worker that would never end by itself (it writes without
end, or sleeps 600 s) still ran and the console was never read, or read too slowly to take it all;
each wait is bounded by HANG_GUARD only. How long the end waits for the console (0.5 s without
progress, 3 s in all) is checked on a fake clock (tests/test_console.py). What the console could not
take is dropped, counted, and said once: on stderr when stderr takes it, and in the state file
(--log_dir)."""

import json
import os
import re
import signal
import struct
import subprocess
import threading
import time

import pytest

from conftest import REPO, WORKERS, alive, free_ports, launcher_cmd, read_dumps, wait_for

# rank 0 writes 100-byte lines as fast as it can, without end; rank 1 fails with 3 after 1 s; the
# others wait (arguments given after these override them)
CHATTY = [WORKERS / "console_lines.py", "--lines", -1, "--fail-rank", 1, "--code", 3, "--delay", 1, "--sleep", 60]
HANG_GUARD = 120  # seconds: a launcher not ended by then is held (the promise, on a quiet machine: 4 s)
NOTE = re.compile(r"the console dropped (\d+) line\(s\) \(([^)]*)\) of (stdout|stderr|stdout and stderr) "
                  r"that were not read in time")
NUMBERED = re.compile(rb"^n(\d{12}) x+$")
# where the launcher's stdout and stderr go: an unread pipe, a file, or (stderr) stdout's own
SETUPS = {
    "stdout-unread": ("unread", "file", "out"),
    "stderr-unread": ("file", "unread", "err"),
    "both-on-one-unread-pipe": ("unread", "same", "both"),
    "both-on-two-unread-pipes": ("unread", "unread", "both"),
}


class Unread:
    """The standard streams of a launcher as SETUPS names them; the read ends held open, never read."""

    def __init__(self, tmp_path, stdout: str, stderr: str, name: str = "launcher") -> None:
        self.held, self.files = [], {}
        self.fds = {}
        for fd, how in ((1, stdout), (2, stderr)):
            if how == "unread":
                r, w = os.pipe()
                self.held.append(r)
                self.fds[fd] = w
            elif how == "file":
                self.files[fd] = tmp_path / f"{name}.fd{fd}"
                self.fds[fd] = os.open(self.files[fd], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            else:
                self.fds[fd] = self.fds[1]

    def start(self, *args) -> subprocess.Popen:
        try:
            return subprocess.Popen(launcher_cmd(*args), cwd=REPO, stdout=self.fds[1], stderr=self.fds[2])
        finally:
            for fd in set(self.fds.values()):
                os.close(fd)

    def text(self, fd: int) -> str:
        return self.files[fd].read_text(errors="replace") if fd in self.files else ""

    def close(self) -> None:
        for fd in self.held:
            os.close(fd)


def ended(proc: subprocess.Popen) -> int:
    """Its exit code; it is killed if it runs HANG_GUARD s."""
    try:
        return proc.wait(HANG_GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"still running after {HANG_GUARD} s: held") from None


def pipe_is_full(fd: int) -> bool:
    """Whether the pipe whose read end is ``fd`` is full: less room left than one write of PIPE_BUF bytes."""
    import fcntl
    import select
    import termios

    unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    return unread > fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) - select.PIPE_BUF


def assert_one_clean_note(err: str) -> int:
    """One note of what was dropped, no traceback; the lines it counts."""
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    notes = NOTE.findall(err)
    assert len(notes) == 1, err[-3000:]
    return int(notes[0][0])


# ---------------------------------------------------------------- the case and its siblings


@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS.keys())
def test_an_unread_console_never_holds_the_end_or_the_exit_code(tmp_path, setup):
    """Rank 0 writes as fast as it can to a console nobody reads (it fills the pipe, then waits on
    its write); rank 1 fails with 3 after 1 s. The launcher ends within 4 s with code 3, every
    worker gone; when stderr is a file, it says there once how many lines it dropped."""
    stdout, stderr, to = setup
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    streams = Unread(tmp_path, stdout, stderr)
    try:
        proc = streams.start("--nproc_per_node", 2, *CHATTY, "--to", to, "--dump", dumps)
        code = ended(proc)  # rank 0 writes without end to a console never read: it was stopped
    finally:
        streams.close()
    assert code == 3
    pids = [d["pid"] for d in read_dumps(dumps, 2).values()]
    wait_for(lambda: not any(alive(p) for p in pids), 30, "every worker to be gone")
    err = streams.text(2)
    assert "Traceback" not in err
    if stderr == "file":
        assert "rank 1 (local rank 1" in err and "exit code 3" in err
        assert assert_one_clean_note(err) > 0


@pytest.mark.parametrize("how", ["| head -1", "2>&1 | head -1", "> /dev/full", "> /dev/full 2>&1"])
def test_a_console_that_goes_away_or_is_full_never_holds_the_end(tmp_path, how):
    """As a shell does it: the reader leaves (EPIPE) or the disk is full (ENOSPC). Code 3 (rank 0, which
    writes without end, stopped), no traceback and no 'Exception ignored' line."""
    cmd = " ".join(map(str, launcher_cmd("--nproc_per_node", 2, *CHATTY)))
    script = f"{cmd} {how}; echo ${{PIPESTATUS[0]}}"
    r = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD)
    code = int(r.stdout.splitlines()[-1])
    assert code == 3, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout and "Exception ignored" not in r.stderr + r.stdout


def test_with_log_dir_the_files_have_every_line_and_the_state_file_says_what_the_console_dropped(tmp_path):
    """stdout and stderr one unread pipe (a terminal paused with Ctrl-S): nothing can be said there.
    The launcher ends in time with code 3; the log file has every line; ``status`` tells what the
    console dropped."""
    count = 200_000  # 20 MB: far more than the console and the pipe hold
    logs = tmp_path / "logs"
    streams = Unread(tmp_path, "unread", "same")
    try:  # rank 0 then sleeps 600 s: stopped, not waited for
        proc = streams.start("--nproc_per_node", 2, "--log_dir", logs, *CHATTY, "--lines", count, "--delay", 0.5,
                             "--after-writer", tmp_path, "--sleep", 600)  # rank 1 fails once rank 0 wrote them all
        code = ended(proc)
    finally:
        streams.close()
    assert code == 3
    numbers = [int(m.group(1)) for line in (logs / "workerlog.0").read_bytes().splitlines()
               if (m := NUMBERED.match(line))]
    assert numbers == list(range(count))
    state = json.loads((logs / "launcher.node0.json").read_text())
    assert state["phase"] == "ended" and state["exit_code"] == 3
    assert NOTE.match(state["console"]), state["console"]
    r = subprocess.run(launcher_cmd("status", logs), cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and f"  console: {state['console']}" in r.stdout.splitlines()


def test_a_successful_job_whose_summary_cannot_be_written_ends_at_once_with_0(tmp_path):
    """The workers' lines fill the one unread pipe of stdout and stderr, then they end well: 'all 2
    worker(s) finished' cannot be written. Exit code 0, soon after the workers."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    streams = Unread(tmp_path, "unread", "same")
    try:
        proc = streams.start("--nproc_per_node", 2, *CHATTY, "--lines", 30_000, "--fail-rank", 1, "--code", 0,
                             "--delay", 0.5, "--sleep", 0.5, "--dump", dumps)
        pids = [d["pid"] for d in read_dumps(dumps, 2).values()]
        wait_for(lambda: not any(alive(p) for p in pids), HANG_GUARD, "the workers to end")
        code = ended(proc)  # a summary waiting for the reader would wait for ever
    finally:
        streams.close()
    assert code == 0


def test_ctrl_c_while_the_console_is_blocked_ends_the_job_at_once(tmp_path):
    """Nobody fails; rank 0 is stuck on its write to the unread console. SIGINT: the workers are
    stopped and the launcher ends with 130 within the bound."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    streams = Unread(tmp_path, "unread", "file")
    try:  # rank 1 sleeps 600 s, rank 0 writes without end: both stopped, not waited for
        proc = streams.start("--nproc_per_node", 2, *CHATTY, "--fail-rank", -1, "--sleep", 600, "--dump", dumps)
        pids = [d["pid"] for d in read_dumps(dumps, 2).values()]
        wait_for(lambda: pipe_is_full(streams.held[0]), HANG_GUARD, "rank 0 to fill the console's pipe")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        code = ended(proc)
    finally:
        streams.close()
    assert code == 130
    assert not any(alive(p) for p in pids)
    launchers = [line for line in streams.text(2).splitlines() if not line.startswith("[rank ")]  # not the workers' own
    assert not [line for line in launchers if "Traceback" in line]


# ---------------------------------------------------------------- a reader that reads slowly


class SlowReader(threading.Thread):
    """Reads a pipe to its end, ``chunk`` bytes every ``delay`` seconds."""

    def __init__(self, fd: int, chunk: int, delay: float) -> None:
        super().__init__(daemon=True)
        self.fd, self.chunk, self.delay = fd, chunk, delay
        self.data = bytearray()

    def run(self) -> None:
        while True:
            data = os.read(self.fd, self.chunk)
            if not data:
                return
            self.data += data
            time.sleep(self.delay)


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "log_dir"])
def test_a_slow_reader_loses_lines_from_the_console_never_from_the_files_and_the_note_counts_them(tmp_path, log_dir):
    """stdout read at about 0.2 MB/s: 3 MB would take it 15 s. The launcher ends before the reader got
    them all (the console gave up: lines dropped); the reader got whole lines in order, from the first,
    and the note counts exactly the ones it did not get (a line cut where the console stopped counts as
    dropped); the log file has them all."""
    count = 30_000  # 3 MB: the console holds it all, so the worker is done at once
    logs = ["--log_dir", tmp_path / "logs"] if log_dir else []
    r, w = os.pipe()
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen(launcher_cmd("--nproc_per_node", 2, *logs, *CHATTY, "--lines", count, "--fail-rank", 1,
                                             "--code", 0, "--delay", 0, "--sleep", 0), cwd=REPO, stdout=w, stderr=f)
    os.close(w)
    reader = SlowReader(r, 4096, 0.02)
    reader.start()
    try:
        code = ended(proc)
        reader.join(HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(r)
    assert code == 0 and not reader.is_alive()
    prefix = b"" if log_dir else b"[rank 0] "
    lines = bytes(reader.data).split(b"\n")
    whole = [int(m.group(1)) for line in lines[:-1] if line.startswith(prefix)
             and (m := NUMBERED.match(line[len(prefix):]))]
    assert whole == list(range(len(whole)))
    dropped = assert_one_clean_note(err.read_text())
    assert dropped > 0 and len(whole) + dropped == count, (len(whole), dropped)
    if log_dir:
        numbers = [int(m.group(1)) for line in (tmp_path / "logs" / "workerlog.0").read_bytes().splitlines()
                   if (m := NUMBERED.match(line))]
        assert numbers == list(range(count))


# ---------------------------------------------------------------- two nodes


def test_a_follower_whose_console_is_unread_still_tells_node_0_and_both_end_in_time(tmp_path):
    """Node 1's console is one unread pipe; its rank 2 writes to it without end, its rank 3 fails
    with 3 after 1 s. Both launchers end within the bound with code 3, and node 0 names node 1's
    failure."""
    nodes = ["127.0.0.1", "127.0.0.2"]
    port = free_ports(5) + 1  # and the one below it, node 0's control port
    common = ["--cluster_node_ips", ",".join(nodes), "--started_port", port, "--nproc_per_node", 2,
              "--shutdown_timeout", 2]
    job = [*CHATTY, "--rank", 2, "--fail-rank", 3, "--sleep", 600]  # rank 2 writes without end, 0 and 1 sleep 600 s
    streams = Unread(tmp_path, "unread", "same")
    node0 = Unread(tmp_path, "file", "file", name="node0")
    procs = []
    try:  # node 1 first: rank 0's store listens on every address of this machine (see test_multinode)
        procs.append(streams.start(*common, "--node_ip", nodes[1], *job))
        procs.append(node0.start(*common, "--node_ip", nodes[0], *job))
        codes = [ended(p) for p in procs]
    finally:
        streams.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert codes == [3, 3]
    err = node0.text(2)
    assert "rank 3" in err and "node 1" in err, err[-3000:]


# ---------------------------------------------------------------- the tools


def test_logs_follow_into_an_unread_pipe_ends_with_the_job(tmp_path):
    """``launcher logs -f`` with stdout a pipe nobody reads: it waits for the reader while the job
    runs, and ends within the bound once the job has ended. ``status`` into such a pipe ends at once."""
    logs = tmp_path / "logs"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    job = subprocess.Popen(launcher_cmd("--nproc_per_node", 2, "--log_dir", logs, *CHATTY, "--lines", 100_000,
                                        "--delay", 3, "--dump", dumps), cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    streams = Unread(tmp_path, "unread", "file")
    try:
        wait_for(lambda: (logs / "launcher.node0.json").exists() and len(list(dumps.glob("env.*"))) == 2, HANG_GUARD,
                 "the job to run")
        follower = streams.start("logs", logs, "-f")
        status = Unread(tmp_path, "unread", "file", name="status")
        try:
            assert ended(status.start("status", logs)) == 0
        finally:
            status.close()
        assert job.wait(HANG_GUARD) == 3
        code = ended(follower)  # its reader never reads: it ends because the job did
    finally:
        streams.close()
        for p in (job, locals().get("follower")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    assert code == 0
    assert assert_one_clean_note(streams.text(2)) > 0


def test_logs_follow_whose_reader_leaves_ends_quietly_while_the_job_runs(tmp_path):
    logs = tmp_path / "logs"
    job = subprocess.Popen(launcher_cmd("--nproc_per_node", 2, "--log_dir", logs, *CHATTY, "--lines", 50_000,
                                        "--delay", 600), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (logs / "launcher.node0.json").exists(), HANG_GUARD, "the job to run")
        cmd = " ".join(map(str, launcher_cmd("logs", logs, "-f")))
        r = subprocess.run(["bash", "-c", f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}"], cwd=REPO,
                           capture_output=True, text=True, timeout=HANG_GUARD)
        assert job.poll() is None  # it ended before the job (rank 1 fails after 600 s)
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(30)
    assert (r.returncode, r.stderr) == (0, "") and len(r.stdout.splitlines()) == 1
