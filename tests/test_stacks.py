"""Stacks of workers: which frame names the place (on real py-spy dumps of small real scripts),
how each failure of py-spy reads, and how the stacks are shown and written.

The scripts block at a line marked ``# HERE`` after printing "ready"; a fake library in a
``site-packages`` folder stands in for torch (a decorated public function over a private one).
"""

import os
import select
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import types

import pytest

from launcher.output import reports
from launcher.run import stacks
from launcher.run.stacks import Stack
from tests.conftest import wait_for

needs_py_spy = pytest.mark.skipif(stacks.find_py_spy() is None, reason="py-spy is not installed")

FAKE_LIB = '''
import functools, time

def _exception_logger(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper

def _wait(seconds):
    time.sleep(seconds)

@_exception_logger
def all_reduce(seconds):
    _wait(seconds)
'''


def marked_line(path, marker="# HERE"):
    return next(i for i, line in enumerate(open(path), 1) if line.rstrip().endswith(marker))


def start(tmp_path, source, name, started):
    """Start ``source`` as ``name`` (the fake library importable), into ``started``; its path, once it printed "ready"."""
    lib = tmp_path / "site-packages" / "fakelib"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "__init__.py").write_text(FAKE_LIB)
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site-packages")}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    started.append(proc)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready and proc.stdout.readline() == b"ready\n", "the script did not start"
    return proc, str(script)


def settled(pid, line_tag, timeout=20.0):
    """take() until the dump shows ``line_tag`` (the script may still be between print and the call)."""
    deadline = time.monotonic() + timeout
    while True:
        (stack,) = stacks.take({0: pid})
        if (stack.text and line_tag in stack.text) or time.monotonic() > deadline:
            return stack
        time.sleep(0.05)


@pytest.fixture
def scripts(tmp_path):
    started = []

    def run(source, name="train.py"):
        return start(tmp_path, source, name, started)

    yield run
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


@needs_py_spy
def test_a_hung_collective_names_the_public_library_call_and_the_users_line(scripts):
    proc, path = scripts('''
        import fakelib
        def step():
            print("ready", flush=True)
            fakelib.all_reduce(60)  # HERE
        step()
    ''')
    line = marked_line(path)
    stack = settled(proc.pid, "fakelib/__init__.py")
    # the dump: _wait, wrapper and all_reduce in the library, then step: the private helper and the
    # decorator's wrapper are passed over for the function the user called
    assert [f.name.rsplit(".", 1)[-1] for f in stacks.parse(stack.text)[0][1]][:4] == ["_wait", "all_reduce", "wrapper", "step"]
    assert stack.where == f"all_reduce (train.py:{line})"
    assert stack.note is None and f"Process {proc.pid}" in stack.text


@needs_py_spy
def test_a_wait_in_the_standard_library_names_the_innermost_public_call(scripts):
    proc, path = scripts('''
        import queue
        def main():
            print("ready", flush=True)
            queue.Queue().get()  # HERE
        main()
    ''', name="loader.py")
    stack = settled(proc.pid, "queue.py")
    assert stack.where == f"wait (loader.py:{marked_line(path)})"  # threading.Condition.wait under Queue.get


@needs_py_spy
def test_a_call_into_c_names_the_users_own_function_and_line(scripts):
    proc, path = scripts('''
        import time
        def inner():
            print("ready", flush=True)
            time.sleep(60)  # HERE
        def outer():
            inner()
        outer()
    ''')
    stack = settled(proc.pid, f"train.py:{marked_line(path)}")
    assert stack.where == f"inner (train.py:{marked_line(path)})"


@needs_py_spy
def test_the_main_thread_is_chosen_over_other_threads(scripts):
    proc, path = scripts('''
        import threading, time
        def background():
            time.sleep(60)  # BACKGROUND
        threading.Thread(target=background, daemon=True).start()
        def main():
            time.sleep(0.2)
            print("ready", flush=True)
            time.sleep(60)  # HERE
        main()
    ''')
    stack = settled(proc.pid, f"train.py:{marked_line(path)}")
    threads = stacks.parse(stack.text)
    assert len(threads) == 2 and "MainThread" in [name for name, _ in threads]
    assert any(f.line == marked_line(path, "# BACKGROUND") for _, frames in threads for f in frames)
    assert stack.where == f"main (train.py:{marked_line(path)})"


@needs_py_spy
def test_only_library_frames_name_the_innermost_one(scripts):
    proc, _ = scripts('''
        import fakelib
        print("ready", flush=True)
        fakelib.all_reduce(60)
    ''', name="site-packages/fakelib/entry.py")
    stack = settled(proc.pid, "_wait")
    assert stack.where.startswith("_wait (__init__.py:")


def test_library_files_are_pythons_packages_and_the_launchers():
    for path in ("/usr/lib/python3.10/threading.py", "/opt/venv/lib/python3.13t/queue.py",
                 "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
                 "/root/.local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                 "<frozen importlib._bootstrap>", stacks.__file__, reports.__file__):
        assert stacks.is_library(path), path
    for path in ("/home/me/train.py", "train.py", "/work/python3/train.py", "/srv/launcher_jobs/train.py"):
        assert not stacks.is_library(path), path


def test_an_empty_dump_has_no_place():
    assert stacks.where(stacks.parse("")) is None
    assert stacks.where(stacks.parse('Thread 7 (idle): "MainThread"\n')) is None


# ---------------------------------------------------------------- when py-spy gives no stack


def fake_py_spy(tmp_path, monkeypatch, body):
    """A ``py-spy`` of a shell ``body``, first on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "py-spy"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    return exe


def test_a_py_spy_that_hangs_is_killed_at_the_shared_deadline(tmp_path, monkeypatch):
    fake_py_spy(tmp_path, monkeypatch, f'echo $$ >> {tmp_path}/pids; exec sleep 60')
    pids_file = tmp_path / "pids"
    # on a fake clock: each wait for a py-spy (they all hang) lasts its whole timeout
    now, waits, real_wait = [0.0], [], subprocess.Popen.wait
    monkeypatch.setattr(stacks, "time", types.SimpleNamespace(monotonic=lambda: now[0]))

    def wait(proc, timeout=None):
        if timeout is None:
            return real_wait(proc)
        waits.append(timeout)
        wait_for(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 3, timeout=120,
                 what="the three py-spy to run")
        now[0] += timeout
        return real_wait(proc, timeout=0)

    monkeypatch.setattr(subprocess.Popen, "wait", wait)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        taken = stacks.take({r: p.pid for r, p in enumerate(sleepers)}, timeout=1.0)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    assert waits == [1.0, 0.0, 0.0], "one deadline for all, not one each"
    assert [s.note for s in taken] == ["py-spy gave no stack within 1 s (the process may be stuck in the kernel)"] * 3
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 3 and not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_a_main_thread_read_with_no_frame_is_read_once_more(tmp_path, monkeypatch):
    """py-spy read rank 0 between two frames ("active+gil", no frame: seen once under load, in a hung job's
    report): a second dump, within the same deadline, gives its place."""
    count = tmp_path / "count"
    fake_py_spy(tmp_path, monkeypatch, f"""echo x >> {count}
if [ "$(wc -l < {count})" = 1 ]; then printf 'Thread 7 (active+gil): "MainThread"\\n'
else printf 'Thread 7 (idle): "MainThread"\\n    step (/job/train.py:43)\\n'; fi""")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (stack,) = stacks.take({0: sleeper.pid})
    finally:
        sleeper.kill()
        sleeper.wait()
    assert stack.where == "step (train.py:43)" and count.read_text().count("x") == 2


@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_ptrace_refused_says_what_to_do(tmp_path, monkeypatch):
    """The real refusal: py-spy as user nobody on a process of root."""
    real = stacks.find_py_spy()
    fake_py_spy(tmp_path, monkeypatch, f'exec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups {real} "$@"')
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (stack,) = stacks.take({3: victim.pid})
    finally:
        victim.kill()
        victim.wait()
    assert stack == Stack(3, victim.pid, None, stacks.NOT_PERMITTED, None)
    assert "kernel.yama.ptrace_scope" in stack.note and "CAP_SYS_PTRACE" in stack.note


@needs_py_spy
def test_a_process_that_is_not_python_and_one_that_exited_unreaped(tmp_path):
    shell = subprocess.Popen(["sleep", "60"])
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while stacks._running(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        taken = stacks.take({0: shell.pid, 1: zombie.pid})
    finally:
        shell.kill()
        shell.wait()
        zombie.wait()
    assert [s.note for s in taken] == [stacks.NOT_PYTHON, stacks.EXITED]
    assert all(s.text is None and s.where is None for s in taken)


# ---------------------------------------------------------------- console and stacks.txt


STACKS = [
    Stack(0, 101, "Process 101: python train.py\n\nThread 101 (idle): \"MainThread\"\n    all_reduce (/x/site-packages/torch/distributed/distributed_c10d.py:3252)\n    step (/job/train.py:42)\n",
          None, "all_reduce (train.py:42)"),
    Stack(1, 102, "Process 102: python train.py\n", None, None),
    Stack(2, 103, None, stacks.EXITED, None),
]


def test_the_console_gets_one_line_per_rank():
    assert reports.format_stacks(STACKS, "node 1 (10.0.0.2)") == (
        "launcher: where each rank of node 1 (10.0.0.2) was:\n"
        "  rank 0 (pid 101): all_reduce (train.py:42)\n"
        "  rank 1 (pid 102): no Python frame found in the dump\n"
        "  rank 2 (pid 103): no stack: the process had already exited")


def test_one_reason_for_every_rank_is_said_once():
    missing = [Stack(r, 100 + r, None, stacks.NOT_INSTALLED, None) for r in range(8)]
    assert reports.format_stacks(missing, "node 0 (127.0.0.1)") == (
        "launcher: no stacks of the 8 worker(s) of node 0 (127.0.0.1): py-spy is not installed: pip install py-spy")


def test_the_full_dumps_are_appended_under_a_header(tmp_path):
    path = tmp_path / "stacks.txt"
    reports.write_stacks(str(path), STACKS, "node 1 (10.0.0.2): rank 3 failed")
    reports.write_stacks(str(path), STACKS[2:], "node 1 (10.0.0.2): again")
    text = path.read_text()
    assert text.count("launcher: node 1 (10.0.0.2): rank 3 failed\n") == 1 and text.rstrip().endswith(
        "--- rank 2 (pid 103): no stack: the process had already exited")
    first = text.split("=====")[1]
    assert "--- rank 0 (pid 101): all_reduce (train.py:42)\nProcess 101: python train.py\n" in first
    assert "    step (/job/train.py:42)\n--- rank 1 (pid 102)" in first


def test_a_stacks_file_that_cannot_be_written_is_a_warning_not_an_error(tmp_path):
    reports.write_stacks(str(tmp_path / "missing" / "stacks.txt"), STACKS, "header")
    assert not (tmp_path / "missing").exists()
