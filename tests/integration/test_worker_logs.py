"""Log files, console echo and rank prefixes."""

import fcntl
import os
import re
import struct
import subprocess
import termios
import time

import pytest

from conftest import PROBE, REPO, WORKERS, launcher_cmd, run_launcher

LINE = re.compile(r"^r(\d) n(\d{12}) x+$")


def test_log_files_by_rank_appended_with_a_header_per_run(tmp_path):
    log = tmp_path / "mylog"
    for _ in range(2):
        r = run_launcher("--nproc_per_node", 2, "--log_dir", log, PROBE, "--lr", "0.1")
        assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        text = (log / f"workerlog.{rank}").read_text()
        headers = [line for line in text.splitlines() if line.startswith("=====")]
        assert len(headers) == 2
        assert all(f"rank {rank} starts:" in h and "probe.py --lr 0.1" in h for h in headers)
        assert text.count(f"worker rank {rank} done") == 2


def test_first_worker_is_echoed_to_the_console_and_the_others_are_not(tmp_path):
    r = run_launcher("--nproc_per_node", 2, "--log_dir", tmp_path, PROBE, "--sleep", 0.3)
    assert r.returncode == 0
    assert "worker rank 0 up" in r.stdout and "worker rank 0 done" in r.stdout
    assert "rank 1" not in r.stdout
    assert "=====" not in r.stdout  # the header is for the file only


def test_without_log_dir_every_line_is_prefixed_with_its_rank(tmp_path):
    r = run_launcher("--nproc_per_node", 2, PROBE, "--lines", 3, "--stderr-every", 1)
    assert r.returncode == 0
    out = r.stdout.splitlines()
    assert "[rank 0] worker rank 0 up" in out and "[rank 1] worker rank 1 done" in out
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in out)
    err = [line for line in r.stderr.splitlines() if not line.startswith("launcher")]
    assert err and all(re.match(r"^\[rank (\d)\] e\1 n", line) for line in err if not line.startswith("  "))


def check_burst(lines, rank, count):
    numbers = []
    for line in lines:
        m = LINE.match(line)
        assert m and m.group(1) == str(rank), f"cut or foreign line: {line[:80]!r}"
        numbers.append(int(m.group(2)))
    assert numbers == list(range(count))


COUNT = 200_000  # 200,000 lines of 100 bytes: 20 MB per worker


def test_burst_to_log_files_is_whole_and_in_order(tmp_path):
    r = run_launcher("--nproc_per_node", 2, "--log_dir", tmp_path, PROBE, "--lines", COUNT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for rank in (0, 1):
        lines = (tmp_path / f"workerlog.{rank}").read_text().splitlines()
        check_burst([l for l in lines if l.startswith("r")], rank, COUNT)
    echoed = [l for l in r.stdout.splitlines() if l.startswith("r")]
    check_burst(echoed, 0, COUNT)


def test_burst_to_the_console_is_whole_prefixed_and_in_order(tmp_path):
    r = run_launcher("--nproc_per_node", 2, PROBE, "--lines", COUNT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for rank in (0, 1):
        prefix = f"[rank {rank}] "
        mine = [l[len(prefix):] for l in r.stdout.splitlines() if l.startswith(prefix)]
        check_burst([l for l in mine if l.startswith("r")], rank, COUNT)


def test_unfinished_last_line_of_a_crashing_worker_is_kept(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import os, sys\nsys.stdout.write('partial line without newline')\nsys.stdout.flush()\nos._exit(4)\n")
    r = run_launcher("--nproc_per_node", 1, script)
    assert r.returncode == 4
    assert "[rank 0] partial line without newline\n" in r.stdout
    r = run_launcher("--nproc_per_node", 1, "--log_dir", tmp_path / "log", script)
    assert r.returncode == 4
    assert "partial line without newline\n" in r.stdout
    assert (tmp_path / "log" / "workerlog.0").read_text().endswith("partial line without newline")


def test_a_flooding_first_worker_does_not_hide_a_failure(tmp_path):
    script = tmp_path / "flood.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(0.5)\n"
        "    sys.exit(5)\n"
        "line = 'y' * 99 + '\\n'\n"
        "for _ in range(3000):  # 300 MB as fast as it goes, then quiet\n"
        "    sys.stdout.write(line * 1000)\n"
        "time.sleep(60)\n")
    r = run_launcher("--nproc_per_node", 2, "--log_dir", tmp_path / "log", script, timeout=60)
    assert r.returncode == 5
    assert "rank 1 (local rank 1" in r.stderr
    # every line whole, but the last: the worker itself was stopped in the middle of writing it,
    # and the console shows it as the file has it
    lines = r.stdout.splitlines()
    assert set(r.stdout) <= {"y", "\n"} and all(len(line) == 99 for line in lines[:-1])
    with open(tmp_path / "log" / "workerlog.0", "rb") as f:
        f.seek(-300, 2)
        tail = f.read()
    last = b"\n" + lines[-1].encode()
    assert tail.endswith(last) or tail.endswith(last + b"\n")
    if "skipping to its latest lines" in r.stderr:  # the console could not keep up; the file did
        assert (tmp_path / "log" / "workerlog.0").stat().st_size > len(r.stdout)


# ---------------------------------------------------------------- progress bars (\r without newline)

STEADY = str(WORKERS / "steady.py")
BAR = ["--progress", 20, "--interval", 0.1]  # rank 0: "\rstep K/20" every 0.1 s, then lines


def on_a_terminal(args, columns=200):
    """Run the launcher with stdout a terminal (a pty of ``columns``), stderr a pipe; (exit code,
    [(when, bytes)] read from the terminal, stderr)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(launcher_cmd(*args), cwd=REPO, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            chunks.append((time.monotonic(), data))
        err = proc.stderr.read().decode(errors="replace")
        return proc.wait(30), chunks, err
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def screen(chunks):
    """A minimal terminal (\\r, \\n, erase to the end of the line): the lines that scrolled up, and
    (when, text) for each state of the last line seen at the end of a read."""
    lines, live, cur, col = [], [], bytearray(), 0
    for when, data in chunks:
        for token in re.findall(rb"\r|\n|\x1b\[K|[^\r\n\x1b]+|\x1b", data):
            if token == b"\r":
                col = 0
            elif token == b"\n":
                lines.append(bytes(cur).decode(errors="replace"))
                cur, col = bytearray(), 0
            elif token == b"\x1b[K":
                del cur[col:]
            else:
                cur[col:col + len(token)] = token
                col += len(token)
        if cur:
            live.append((when, bytes(cur).decode(errors="replace")))
    return lines, live


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "log_dir"])
def test_a_progress_bar_is_drawn_live_on_a_terminal_and_lines_stay_whole(tmp_path, log_dir):
    prefix = "" if log_dir else "[rank 0] "
    extra = ["--log_dir", tmp_path / "logs"] if log_dir else []
    code, chunks, err = on_a_terminal(["--nproc_per_node", 2, *extra, STEADY, *BAR, "--lines", 20, "--interval", 0.1])
    assert code == 0, err
    lines, live = screen(chunks)
    bar = [(t, s) for t, s in live if re.fullmatch(re.escape(prefix) + r"step \d+/20", s)]
    assert len({s for _, s in bar}) >= 5, f"the bar was not drawn as it went: {live[:20]}"
    ended = [t for t, data in chunks if re.search(rb"step 20/20\r?\n", data)]  # the terminal adds \r
    assert ended and ended[0] - bar[0][0] > 0.5, "the first state came only at the end"
    # what scrolled up: whole lines, each with its prefix; of the bar, its last state only
    assert [l for l in lines if "step" in l] == [f"{prefix}step 20/20"]
    ranks = (0,) if log_dir else (0, 1)
    for rank in ranks:
        pre = "" if log_dir else f"[rank {rank}] "
        mine = [l for l in lines if l.startswith(f"{pre}r{rank} n") and l.endswith("out")]
        assert [int(l.split()[-2][1:]) for l in mine] == list(range(20)), lines
        assert f"{pre}worker rank {rank} done" in lines
    bad = [l for l in lines if not re.fullmatch(r"(\[rank [01]\] )?(r\d n\d{12} (out|err)|worker rank \d done|step 20/20)", l)]
    assert not bad, bad


def test_a_progress_bar_wider_than_the_terminal_is_drawn_cut_to_its_width(tmp_path):
    code, chunks, err = on_a_terminal(["--nproc_per_node", 1, STEADY, *BAR, "--bar-width", 150], columns=60)
    assert code == 0, err
    lines, live = screen(chunks)
    bar = [s for _, s in live if s.startswith("[rank 0] step")]
    assert bar and all(len(s) < 60 for s in bar)
    assert [l for l in lines if "step" in l] == ["[rank 0] step 20/20 " + "#" * 150]  # the line itself is whole


@pytest.mark.parametrize("log_dir", [False, True], ids=["relay", "log_dir"])
def test_a_progress_bar_on_a_pipe_is_its_last_state_when_its_line_ends(tmp_path, log_dir):
    extra = ["--log_dir", tmp_path / "logs"] if log_dir else []
    r = subprocess.run(launcher_cmd("--nproc_per_node", 1, *extra, STEADY, "--progress", 50, "--lines", 2),
                       cwd=REPO, capture_output=True, timeout=60)  # bytes: text mode would turn \r into \n
    assert r.returncode == 0, r.stderr
    prefix = b"" if log_dir else b"[rank 0] "
    assert r.stdout.split(b"\n")[:2] == [prefix + b"step 50/50", prefix + b"r0 n000000000000 out"]
    assert b"\r" not in r.stdout
    if log_dir:  # the file has every state
        assert (tmp_path / "logs" / "workerlog.0").read_bytes().count(b"\rstep ") == 50
