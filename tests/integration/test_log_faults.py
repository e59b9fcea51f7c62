"""Log files and the console under faults: unusable --log_dir, full and read-only file systems,
old logs cut mid-line, copytruncate, endless lines, a console nobody reads, closed or socket
standard streams. Every wait is bounded."""

import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import PROBE, REPO, WORKERS, launcher_cmd, run_launcher, wait_for

LINES = str(WORKERS / "console_lines.py")
MiB = 1 << 20
NUMBERED = re.compile(rb"^n(\d{12}) x+$")


# ---------------------------------------------------------------- helpers


# A log dir on a tmpfs of a few KiB is below the disk health check's floor, which would refuse the job first
# (tests/test_health.py): these tests look past it, at how the launcher writes its logs.
PAST_HEALTH = ("--skip_health_checks", "disk")


def refused(dumps: Path, *args, timeout=20):
    """Run the launcher (1 worker, --dump into ``dumps``); assert it refused to start: exit 2, one
    error line, no traceback, no worker. The error line."""
    dumps.mkdir(exist_ok=True)
    r = run_launcher("--nproc_per_node", 1, *args, PROBE, "--dump", dumps, timeout=timeout)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("launcher: error:")]
    assert len(errors) == 1, r.stderr
    assert not list(dumps.glob("env.*.json")), "a worker started"
    return errors[0]


def assert_names_value_and_fix(msg: str, log_dir) -> None:
    assert f"--log_dir {log_dir}" in msg, msg
    assert "choose another --log_dir" in msg or "choose a folder you can write to" in msg, msg


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size=64k, ro=False) -> a fresh tmpfs; every mount is undone at the end."""
    mounted = []

    def mount(size="64k", ro=False):
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        opts = f"size={size}" + (",ro" if ro else "")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            r = subprocess.run(["umount", str(where)], capture_output=True, timeout=10)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10)


def fill(folder: Path) -> None:
    """Fill a small file system up to its last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


class Reader(threading.Thread):
    """Reads a descriptor (pipe or socket) to its end, recording every line with when it came."""

    def __init__(self, fd, delay=0.0, chunk=65536):
        super().__init__(daemon=True)
        self.fd, self.delay, self.chunk = fd, delay, chunk
        self.data = bytearray()
        self.lines = []  # (monotonic time, line)
        self.lock = threading.Lock()

    def run(self):
        partial = b""
        while True:
            try:
                data = os.read(self.fd, self.chunk)
            except OSError:
                break
            if not data:
                break
            now = time.monotonic()
            with self.lock:
                self.data += data
                *whole, partial = (partial + data).split(b"\n")
                self.lines += [(now, line) for line in whole]
            if self.delay:
                time.sleep(self.delay)

    def numbers(self):
        with self.lock:
            return [int(m.group(1)) for _, line in self.lines if (m := NUMBERED.match(line))]


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"the launcher did not end within {timeout} s")


# ---------------------------------------------------------------- A: a --log_dir that cannot be used


@pytest.mark.parametrize("log_dir", ["/proc/launcher-logs", "/sys/launcher-logs", "/proc/self", "/sys/kernel"])
def test_log_dir_in_proc_or_sys_is_refused(tmp_path, log_dir):
    assert_names_value_and_fix(refused(tmp_path / "dumps", "--log_dir", log_dir), log_dir)
    assert not os.path.exists(os.path.join(log_dir, "workerlog.0"))


def test_dangling_symlink_as_log_dir_is_refused(tmp_path):
    link = tmp_path / "logs"
    link.symlink_to(tmp_path / "gone")
    msg = refused(tmp_path / "dumps", "--log_dir", link)
    assert_names_value_and_fix(msg, link)
    assert "symbolic link" in msg and str(tmp_path / "gone") in msg
    assert not (tmp_path / "gone").exists()


def test_over_long_log_dir_name_is_refused(tmp_path):
    log_dir = tmp_path / ("l" * 300)
    msg = refused(tmp_path / "dumps", "--log_dir", log_dir)
    assert_names_value_and_fix(msg, log_dir)
    assert "too long" in msg


def test_worker_log_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / "logs" / "workerlog.0").mkdir(parents=True)
    msg = refused(tmp_path / "dumps", "--log_dir", tmp_path / "logs")
    assert_names_value_and_fix(msg, tmp_path / "logs")
    assert "is a folder" in msg and str(tmp_path / "logs" / "workerlog.0") in msg


def test_worker_log_that_is_a_fifo_nobody_reads_is_refused_without_hanging(tmp_path):
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "logs" / "workerlog.0")
    # a launcher that opened the FIFO to write would wait for a reader forever: the timeout is a hang guard
    msg = refused(tmp_path / "dumps", "--log_dir", tmp_path / "logs", timeout=120)
    assert_names_value_and_fix(msg, tmp_path / "logs")
    assert "FIFO" in msg


def test_worker_log_that_links_to_dev_full_is_refused(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "workerlog.0").symlink_to("/dev/full")
    msg = refused(tmp_path / "dumps", "--log_dir", tmp_path / "logs")
    assert_names_value_and_fix(msg, tmp_path / "logs")
    assert "not a regular file" in msg


def test_full_file_system_is_refused_and_the_old_log_is_left_as_it_was(tmp_path, tmpfs):
    logs = tmpfs("64k")
    old = b"o" * 4095 + b"\n"  # one whole page: the header needs a new one
    (logs / "workerlog.0").write_bytes(old)
    fill(logs)
    msg = refused(tmp_path / "dumps", "--log_dir", logs, *PAST_HEALTH)
    assert_names_value_and_fix(msg, logs)
    assert "No space left on device" in msg and "free some space" in msg
    assert (logs / "workerlog.0").read_bytes() == old


def test_full_file_system_does_not_leave_half_a_header(tmp_path, tmpfs):
    logs = tmpfs("64k")
    old = b"o" * 4049 + b"\n"  # 46 bytes left in the page: the header starts there, and cannot end
    (logs / "workerlog.0").write_bytes(old)
    fill(logs)
    refused(tmp_path / "dumps", "--log_dir", logs, *PAST_HEALTH)
    assert (logs / "workerlog.0").read_bytes() == old


def test_read_only_file_system_is_refused(tmp_path, tmpfs):
    logs = tmpfs("64k", ro=True)
    assert_names_value_and_fix(refused(tmp_path / "dumps", "--log_dir", logs, *PAST_HEALTH), logs)
    msg = refused(tmp_path / "dumps", "--log_dir", logs / "sub", *PAST_HEALTH)
    assert_names_value_and_fix(msg, logs / "sub")
    assert "Read-only file system" in msg


# ---------------------------------------------------------------- B: headers


def test_header_starts_its_own_line_after_a_log_that_ended_mid_line(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"first\nold last line without newline")
    r = run_launcher("--nproc_per_node", 1, "--log_dir", tmp_path, PROBE, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "workerlog.0").read_text().splitlines()
    assert lines[:2] == ["first", "old last line without newline"]
    assert lines[2].startswith("===== ") and "launcher: rank 0 starts:" in lines[2]
    assert lines[3:] == ["worker rank 0 up", "worker rank 0 done"]
    assert "old last line" not in r.stdout  # the echo starts with this run


# ---------------------------------------------------------------- C: copytruncate


# numbered lines as console_lines.py writes them, one every 0.02 s, until the file argv[1] exists
UNTIL_TOLD = """
import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]):
    os.write(1, b"n%012d %s\\n" % (i, b"x" * 85))
    i += 1
    time.sleep(0.02)
"""


def test_console_echo_goes_on_after_the_log_is_truncated_in_place(tmp_path):
    log, stop, worker = tmp_path / "workerlog.0", tmp_path / "stop", tmp_path / "until_told.py"
    worker.write_text(UNTIL_TOLD)
    proc = subprocess.Popen(launcher_cmd("--nproc_per_node", 1, "--log_dir", tmp_path, worker, stop),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = Reader(proc.stdout.fileno()), Reader(proc.stderr.fileno())
    out.start()
    err.start()
    try:
        wait_for(lambda: len(out.numbers()) >= 40, 120, "40 lines on the console")
        os.truncate(log, 0)  # logrotate's copytruncate
        seen = max(out.numbers())
        # no stall: lines written after the truncation show up while the worker still writes (it writes
        # until told to stop, below), not at its end
        wait_for(lambda: max(out.numbers()) >= seen + 10, 120, "lines after the truncation on the console")
        stop.touch()
        assert finish(proc, 120) == 0, bytes(err.data)[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out.join(10)
    err.join(10)
    after = [int(m.group(1)) for line in log.read_bytes().splitlines() if (m := NUMBERED.match(line))]
    assert after and after[0] <= seen + 10 and after == list(range(after[0], after[-1] + 1))
    shown = out.numbers()
    assert shown[-len(after):] == after, "a line written after the truncation is missing from the console"


# ---------------------------------------------------------------- D: lines longer than 8 MiB


def long_line(size: int) -> bytes:
    pattern = b"0123456789abcdef"
    return pattern * (size // len(pattern)) + pattern[:size % len(pattern)]


def test_a_line_over_8_mib_is_whole_in_the_log_file_and_in_bounded_pieces_on_the_console(tmp_path):
    sizes = (7 * MiB, 20 * MiB)
    r = subprocess.run(launcher_cmd("--nproc_per_node", 1, "--log_dir", tmp_path, LINES,
                                    "--long", ",".join(map(str, sizes))),
                       cwd=REPO, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    file_lines = (tmp_path / "workerlog.0").read_bytes().split(b"\n")
    assert file_lines[1:] == [long_line(sizes[0]), long_line(sizes[1]), b"after long", b""]
    out = r.stdout.split(b"\n")
    assert out[0] == long_line(sizes[0])  # up to 8 MiB: whole on the console too
    pieces = out[1:-2]
    assert out[-2:] == [b"after long", b""]
    assert len(pieces) >= 2 and b"".join(pieces) == long_line(sizes[1])
    assert max(map(len, pieces)) <= 8 * MiB + (1 << 20)


def test_a_line_over_8_mib_reaches_the_console_without_log_dir_in_prefixed_pieces(tmp_path):
    sizes = (7 * MiB, 20 * MiB)
    r = subprocess.run(launcher_cmd("--nproc_per_node", 1, LINES, "--long", ",".join(map(str, sizes))),
                       cwd=REPO, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    prefix = b"[rank 0] "
    out = r.stdout.split(b"\n")
    assert out[-1] == b"" and all(line.startswith(prefix) for line in out[:-1])
    out = [line[len(prefix):] for line in out[:-1]]
    assert out[0] == long_line(sizes[0]) and out[-1] == b"after long"
    pieces = out[1:-1]
    assert len(pieces) >= 2 and b"".join(pieces) == long_line(sizes[1])
    assert max(map(len, pieces)) <= 8 * MiB + (1 << 20)


PEAK_RSS = ("import resource, subprocess, sys; "
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "echo"])
@pytest.mark.parametrize("kind", ["plain", "redrawn"])
def test_one_endless_line_does_not_grow_the_launcher(tmp_path, kind, log_dir):
    """A worker writes 100 MB and never a newline: as one plain line, or as a bar redrawn with \r.
    The launcher's peak memory (the largest process the wrapper waited for, workers included)
    stays far below that. Measured: 26 MB for a job that writes nothing."""
    script = tmp_path / "endless.py"
    piece = "b'z' * (1 << 20)" if kind == "plain" else "b'\\rstep 000000007' * (1 << 16)"
    script.write_text(
        "import os\n"
        f"piece = {piece}\n"
        "for _ in range(100):\n"
        "    view = memoryview(piece)\n"
        "    while view:\n"
        "        view = view[os.write(1, view):]\n")
    extra = ["--log_dir", tmp_path / "logs"] if log_dir else []
    r = subprocess.run([sys.executable, "-c", PEAK_RSS, *launcher_cmd("--nproc_per_node", 1, *extra, script)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    code, peak_kib = map(int, r.stdout.split())
    assert code == 0, r.stderr
    assert peak_kib < 90 * 1024, f"peak RSS {peak_kib >> 10} MB for a 100 MB line"


# ---------------------------------------------------------------- E: a console nobody reads
# (tests/integration/test_unread_console.py)


# ---------------------------------------------------------------- F: stdout or stderr closed


def run_with_closed(fds, *args, timeout=60):
    def close():
        for fd in fds:
            os.close(fd)

    keep = {1: None, 2: None}
    return subprocess.run(launcher_cmd(*args), cwd=REPO, timeout=timeout, preexec_fn=close,
                          stdout=subprocess.PIPE if 1 not in fds else keep[1],
                          stderr=subprocess.PIPE if 2 not in fds else keep[2])


def assert_complete_logs(logs: Path, ranks, count):
    for rank in ranks:
        text = (logs / f"workerlog.{rank}").read_text()
        numbered = [line for line in text.splitlines() if line.startswith(f"r{rank} n")]
        assert len(numbered) == count and f"worker rank {rank} done" in text


@pytest.mark.parametrize("closed", [(1,), (2,), (1, 2)], ids=["stdout", "stderr", "both"])
def test_closed_standard_streams_with_log_dir(tmp_path, closed):
    r = run_with_closed(closed, "--nproc_per_node", 2, "--log_dir", tmp_path, PROBE, "--lines", 2000)
    assert r.returncode == 0, r.stderr
    assert_complete_logs(tmp_path, (0, 1), 2000)
    for text in (r.stdout, r.stderr):
        if text is not None:
            assert b"Traceback" not in text and b"Error" not in text
    if 1 not in closed:
        assert r.stdout.count(b"\nr0 n") == 2000
    if 2 not in closed:
        assert b"all 2 worker(s) finished" in r.stderr
    for rank in (0, 1):  # nothing of the launcher's own went into a log file
        assert "launcher: " not in (tmp_path / f"workerlog.{rank}").read_text().replace("launcher: rank", "")


@pytest.mark.parametrize("closed", [(1,), (2,)], ids=["stdout", "stderr"])
def test_closed_standard_streams_keep_the_exit_code(tmp_path, closed):
    """Rank 1 fails once rank 0 has written its 500 lines (not before: the job's stop would cut them short)."""
    r = run_with_closed(closed, "--nproc_per_node", 2, PROBE, "--lines", 500, "--fail-rank", 1, "--code", 7,
                        "--lines-mark", tmp_path)
    assert r.returncode == 7
    text = r.stdout if r.stdout is not None else r.stderr
    assert b"Traceback" not in text
    if 2 not in closed:
        assert b"rank 1 (local rank 1" in r.stderr
    else:
        assert text.count(b"[rank 0] r0 n") == 500


# ---------------------------------------------------------------- G: stdout a socket


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "echo"])
def test_stdout_a_socket_read_slowly_gets_everything(tmp_path, log_dir):
    count = 20_000
    ours, theirs = socket.socketpair()
    args = ["--nproc_per_node", 2] + (["--log_dir", tmp_path] if log_dir else [])
    try:
        proc = subprocess.Popen(launcher_cmd(*args, PROBE, "--lines", count), cwd=REPO,
                                stdout=theirs.fileno(), stderr=subprocess.PIPE)
        theirs.close()
        reader = Reader(ours.fileno(), delay=0.002, chunk=16384)
        reader.start()
        err = Reader(proc.stderr.fileno())
        err.start()
        assert finish(proc, 60) == 0, bytes(err.data)[-2000:]
        reader.join(30)
        assert not reader.is_alive()
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines = bytes(reader.data).decode().splitlines()
    for rank in ((0,) if log_dir else (0, 1)):
        prefix = "" if log_dir else f"[rank {rank}] "
        mine = [l[len(prefix):] for l in lines if l.startswith(f"{prefix}r{rank} n")]
        assert [int(l.split()[1][1:]) for l in mine] == list(range(count))
    assert bytes(reader.data).endswith(b"\n")


# ---------------------------------------------------------------- a console that is slow, not stopped


def test_what_a_worker_left_in_its_pipe_is_read_at_once_and_the_console_bounded(tmp_path):
    """The launcher stops reading a worker's pipe while the console is behind. Here the worker
    fills that pipe and exits while nobody reads the console: the pipe is read at once (not after
    the 5 s given to pipes a process outside the job may hold), and the console gets its bound. The
    reader, who comes 2 s later, finds the launcher gone, and gets whole lines from the first;
    the note on stderr counts the rest."""
    r, w = os.pipe()
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen(launcher_cmd("--nproc_per_node", 1, LINES, "--lines", 30_000, "--until-full"),
                                cwd=REPO, stdout=w, stderr=f)
    os.close(w)
    reader = Reader(r)
    try:
        wait_for(lambda: "wrote" in err.read_text(), 120, "the worker to fill its pipe and end")
        assert finish(proc, 2.5) == 0  # the worker's end, then at most END_STALL for the console
        time.sleep(2.0)
        reader.start()
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(r)
    text = err.read_text()
    wrote = int(re.search(r"wrote (\d+) lines", text).group(1))
    dropped = int(re.search(r"the console dropped (\d+) line\(s\)", text).group(1))
    prefix = b"[rank 0] "
    numbers = [int(m.group(1)) for _, line in reader.lines
               if line.startswith(prefix) and (m := NUMBERED.match(line[len(prefix):]))]
    assert numbers == list(range(len(numbers))) and len(numbers) + dropped == wrote


# ---------------------------------------------------------------- stdout and stderr one pipe (2>&1 | tee)


def test_stdout_and_stderr_on_one_slow_pipe_never_cut_a_line(tmp_path):
    count = 20_000
    r, w = os.pipe()
    proc = subprocess.Popen(launcher_cmd("--nproc_per_node", 2, PROBE, "--lines", count, "--stderr-every", 1),
                            cwd=REPO, stdout=w, stderr=w)
    os.close(w)
    reader = Reader(r, delay=0.002, chunk=16384)
    reader.start()
    try:
        assert finish(proc, 60) == 0
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(r)
    good = re.compile(rb"^(\[rank (\d)\] ([re])\2 n\d{12} x+|\[rank \d\] worker rank \d (up|done)|launcher: .*|  .*)$")
    bad = [line for _, line in reader.lines if not good.match(line)]
    assert not bad, f"{len(bad)} cut or mixed line(s), e.g. {bad[0][:120]!r}"
    for rank in (0, 1):
        for kind in b"re":
            tag = b"[rank %d] %c%d n" % (rank, kind, rank)
            assert sum(1 for _, line in reader.lines if line.startswith(tag)) == count


# ---------------------------------------------------------------- H: a console that goes away


STEADY = str(WORKERS / "steady.py")
COUNT = 300
# How the console goes away, as a shell does it to the launcher (stderr not named: the test reads it)
GONE = {
    "stdout-head": "| head -2",
    "stdout-full": "> /dev/full",
    "stderr-full": "2> /dev/full",
    "both-full": "> /dev/full 2>&1",
    "stderr-head": "2>&1 > /dev/null | head -2",
    "stdout-head-stderr-full": "2> /dev/full | head -2",
}


def steady_job(tmp_path, log_dir: bool):
    """Arguments of a job of 2 workers that write COUNT lines each on stdout and stderr over about
    1.5 s; rank 1 then exits 7, 0.5 s after rank 0 has left its mark: the job's exit code is 7, and no
    worker is stopped. Each worker leaves tmp_path/marks/done.RANK when it got to its end."""
    marks = tmp_path / "marks"
    marks.mkdir()
    logs = ["--log_dir", tmp_path / "logs"] if log_dir else []
    return ["--nproc_per_node", 2, *logs, STEADY, "--lines", COUNT, "--interval", 0.005, "--marks", marks,
            "--code-rank", 1, "--code", 7, "--delay", 0.5]


def assert_the_job_ran_to_its_end(tmp_path, log_dir: bool, code: int, stderr: str = "") -> None:
    assert code == 7, stderr[-3000:]
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / "marks" / f"done.{rank}").read_text() == str(COUNT), f"rank {rank} was stopped"
        if log_dir:
            lines = (tmp_path / "logs" / f"workerlog.{rank}").read_text().splitlines()
            for kind in ("out", "err"):
                mine = [l for l in lines if l.startswith(f"r{rank} n") and l.endswith(kind)]
                assert [int(l.split()[1][1:]) for l in mine] == list(range(COUNT)), f"workerlog.{rank} lacks lines"
            assert lines[-1] == f"worker rank {rank} done"


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "log_dir"])
@pytest.mark.parametrize("how", GONE.values(), ids=GONE.keys())
def test_a_console_that_cannot_be_written_is_dropped_and_the_job_goes_on(tmp_path, how, log_dir):
    args = " ".join(shlex.quote(str(a)) for a in launcher_cmd(*steady_job(tmp_path, log_dir)))
    rc = tmp_path / "rc"
    r = subprocess.run(["bash", "-c", f"{args} {how}; echo ${{PIPESTATUS[0]}} > {rc}"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert_the_job_ran_to_its_end(tmp_path, log_dir, int(rc.read_text()), r.stderr)
    if how in ("| head -2", "> /dev/full"):  # stdout went away, stderr works: one note there
        notes = [l for l in r.stderr.splitlines() if "stdout cannot be written any more" in l]
        assert len(notes) == 1, r.stderr[-3000:]
    if "head" in how:
        assert len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "log_dir"])
@pytest.mark.parametrize("gone", [(1,), (2,), (1, 2)], ids=["stdout", "stderr", "both"])
def test_a_reader_that_goes_away_leaves_the_job_running(tmp_path, gone, log_dir):
    proc = subprocess.Popen(launcher_cmd(*steady_job(tmp_path, log_dir)), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pipes = {1: proc.stdout, 2: proc.stderr}
    readers = {fd: Reader(p.fileno()) for fd, p in pipes.items() if fd not in gone}
    try:
        for fd in gone:  # read a bit, then go away
            wait_for(lambda: select.select([pipes[fd]], [], [], 0)[0], 120, "some output")
            os.read(pipes[fd].fileno(), 100)
            pipes[fd].close()
        for reader in readers.values():
            reader.start()
        code = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for reader in readers.values():
        reader.join(10)
    stderr = bytes(readers[2].data).decode(errors="replace") if 2 in readers else ""
    assert_the_job_ran_to_its_end(tmp_path, log_dir, code, stderr)
    if gone == (1,):
        assert stderr.count("stdout cannot be written any more") == 1, stderr[-3000:]


def test_workers_get_the_default_sigpipe_as_from_a_shell(tmp_path):
    """The launcher (Python) ignores SIGPIPE; its workers must not inherit that: `worker | head`
    inside a job ends the writer as it would in a shell."""
    for extra in ([], ["--log_dir", tmp_path]):
        r = run_launcher("--nproc_per_node", 1, *extra, "--no_python", "grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status")
        assert r.returncode == 0, r.stderr
        text = r.stdout + ((tmp_path / "workerlog.0").read_text() if extra else "")
        masks = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"(SigIgn|SigBlk):\s+([0-9a-f]+)", text)}
        assert set(masks) == {"SigIgn", "SigBlk"}, text
        assert not masks["SigIgn"] & (1 << (signal.SIGPIPE - 1)) and masks["SigBlk"] == 0, masks


def test_a_log_dir_that_fills_up_while_the_job_runs_does_not_stop_it(tmp_path, tmpfs):
    """The workers write their logs themselves: a full disk is theirs to handle. One that skips the
    failed writes runs to its end; the launcher warns that its state file cannot be written, and
    the exit code is the workers'."""
    logs = tmpfs("128k")
    marks = tmp_path / "marks"
    marks.mkdir()
    r = run_launcher("--nproc_per_node", 2, "--log_dir", logs, *PAST_HEALTH, STEADY, "--lines", 3000, "--marks", marks,
                     "--ignore-write-errors", "--code-rank", 1, "--code", 7, "--delay", 0.5, timeout=60)
    assert r.returncode == 7, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert (marks / "done.0").exists() and (marks / "done.1").exists()
    assert (logs / "workerlog.0").stat().st_size > 0


# ---------------------------------------------------------------- I: the tools' output goes away


@pytest.fixture(scope="module")
def finished_log_dir(tmp_path_factory):
    """The log dir of a finished job, its logs bigger than a pipe holds."""
    folder = tmp_path_factory.mktemp("finished")
    r = run_launcher("--nproc_per_node", 2, "--log_dir", folder, PROBE, "--lines", 3000)
    assert r.returncode == 0, r.stderr
    return folder


TOOLS = ["--help", "--version", "status {}", "logs {}", "logs {} --ranks 1", "logs {} -f"]


def tool_cmd(tool: str, log_dir: Path) -> str:
    return " ".join(map(shlex.quote, launcher_cmd())) + " " + tool.format(shlex.quote(str(log_dir)))


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_whose_reader_has_what_it_wanted_ends_quietly(finished_log_dir, tool):
    cmd = tool_cmd(tool, finished_log_dir)
    r = subprocess.run(["bash", "-c", f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "") and len(r.stdout.splitlines()) == 1


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_whose_output_cannot_be_written_says_so_in_one_sentence(finished_log_dir, tool):
    cmd = tool_cmd(tool, finished_log_dir)
    r = subprocess.run(["bash", "-c", f"{cmd} > /dev/full"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr == ("launcher: error: cannot write to stdout (No space left on device); "
                        "send the output somewhere that takes it.\n")
    r = subprocess.run(["bash", "-c", f"{cmd} > /dev/full 2>&1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "")


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "log_dir"])
def test_a_terminal_that_hangs_up_is_dropped_and_the_job_goes_on(tmp_path, log_dir):
    """stdout a terminal whose other end goes away (an ssh session dropped; no SIGHUP here: it is
    not the launcher's controlling terminal): its writes fail with EIO."""
    master, slave = os.openpty()
    proc = subprocess.Popen(launcher_cmd(*steady_job(tmp_path, log_dir)), cwd=REPO, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    err = Reader(proc.stderr.fileno())
    err.start()
    try:
        wait_for(lambda: select.select([master], [], [], 0)[0], 120, "some output on the terminal")
        os.read(master, 100)
        os.close(master)
        code = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    err.join(10)
    stderr = bytes(err.data).decode(errors="replace")
    assert_the_job_ran_to_its_end(tmp_path, log_dir, code, stderr)
    assert stderr.count("stdout cannot be written any more (Input/output error)") == 1, stderr[-3000:]
