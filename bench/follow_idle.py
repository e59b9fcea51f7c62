#!/usr/bin/env python3
"""``launcher logs -f`` on a log dir of many files: its CPU while nothing is written, and how soon a line shows.

    python bench/follow_idle.py [--files 10000] [--idle 10] [--probes 20] [--poll] [--code DIR] [--json FILE]

Makes a log dir of FILES logs (``workerlog.N``, a header line and one line each; no state file, so the
follower runs until it is stopped), starts ``python -m launcher logs DIR -f`` on it and waits for its
first output (every line). Then:

- idle: the follower's CPU time (user + system, psutil) over IDLE seconds in which nothing is written,
  as a fraction of one core;
- a line shown: PROBES lines appended, one at a time, to files spread over the dir; for each, the time
  from just before its write to its arrival on the follower's stdout (median and largest);
- a new file (``workerlog.FILES``) and a file truncated and rewritten (``workerlog.0``): the time until
  their line shows (each must show, once).

``--poll`` runs the follower where inotify cannot be had (a user namespace whose
``/proc/sys/user/max_inotify_instances`` is 0, through ``unshare -Ur``), so that it follows by polling.
``--code DIR`` takes the launcher from DIR instead of this repository (to measure another version).
Prints a small table; ``--json FILE`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
HEADER = "===== 2026-01-01 00:00:00 launcher: rank {} starts: python train.py\n"
NO_INOTIFY = "echo 0 > /proc/sys/user/max_inotify_instances && exec \"$@\""
WAIT_S = 120  # the most any one step waits for the follower


def make_logs(folder: Path, files: int) -> None:
    for rank in range(files):
        (folder / f"workerlog.{rank}").write_text(HEADER.format(rank) + f"started {rank}\n")


def follower_cmd(folder: Path, poll: bool) -> list:
    cmd = [sys.executable, "-m", "launcher", "logs", str(folder), "-f"]
    return ["unshare", "-Ur", "sh", "-c", NO_INOTIFY, "sh", *cmd] if poll else cmd


class Reader:
    """The follower's stdout, line by line, each with the time it arrived (a thread of its own)."""

    def __init__(self, stream) -> None:
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put((time.monotonic(), line.rstrip("\n")))
        self.lines.put((time.monotonic(), None))

    def until(self, wanted: str, wait: float) -> float:
        """The arrival time of the line ``wanted`` (queue.Empty after ``wait`` seconds without it)."""
        deadline = time.monotonic() + wait
        while True:
            at, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"the follower ended before {wanted!r}")
            if line == wanted:
                return at

    def count(self, n: int) -> None:
        for _ in range(n):
            if self.lines.get(timeout=WAIT_S)[1] is None:
                raise RuntimeError("the follower ended during its first output")

    def extra(self) -> list:
        out = []
        while not self.lines.empty():
            line = self.lines.get_nowait()[1]
            if line is not None:
                out.append(line)
        return out


def shown_after(reader: Reader, path: Path, text: str, label: str, mode: str = "a", wait: float = WAIT_S):
    """Seconds from writing ``text`` to ``path`` to its line shown; None if not shown within ``wait``."""
    start = time.monotonic()
    with open(path, mode) as f:
        f.write(text + "\n")
    try:
        return reader.until(f"[{label}] {text}", wait) - start
    except queue.Empty:
        return None


def measure(folder: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(args.code)}
    follower = subprocess.Popen(follower_cmd(folder, args.poll), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=folder)
    try:
        reader = Reader(follower.stdout)
        started = time.monotonic()
        reader.count(2 * args.files)
        first_output = time.monotonic() - started
        time.sleep(1.0)  # the end of its start-up
        proc = psutil.Process(follower.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(args.idle)
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        latencies = []
        for k in range(args.probes):
            rank = k * args.files // args.probes
            latencies.append(shown_after(reader, folder / f"workerlog.{rank}", f"probe {k}", f"rank {rank}"))
            time.sleep(0.05)
        new = shown_after(reader, folder / f"workerlog.{args.files}", "a new file", f"rank {args.files}", wait=10)
        truncated = shown_after(reader, folder / "workerlog.0", "truncated", "rank 0", mode="w", wait=10)
        time.sleep(0.5)
        extra = reader.extra()
    finally:
        follower.send_signal(signal.SIGINT)
        try:
            _, err = follower.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            follower.kill()
            _, err = follower.communicate()
    return {"files": args.files, "mode": "poll" if args.poll else "default", "first_output_s": first_output,
            "idle_core": (cpu1 - cpu0) / (t1 - t0), "idle_s": t1 - t0,
            "line_median_s": statistics.median(latencies), "line_max_s": max(latencies),
            "new_file_s": new, "truncated_s": truncated, "lines_shown_twice_or_unexpected": extra,
            "stderr": err.strip()}


def table(r: dict) -> str:
    def seconds(value):
        return "not shown in 10 s" if value is None else f"{value:.4f}"

    rows = [("idle CPU (fraction of a core)", f"{r['idle_core']:.3f}"),
            ("line written -> shown, median (s)", f"{r['line_median_s']:.4f}"),
            ("line written -> shown, largest (s)", f"{r['line_max_s']:.4f}"),
            ("new file -> its line shown (s)", seconds(r["new_file_s"])),
            ("file truncated -> its line shown (s)", seconds(r["truncated_s"])),
            ("start -> every line shown (s)", f"{r['first_output_s']:.2f}"),
            ("lines shown that were not written", str(len(r["lines_shown_twice_or_unexpected"])))]
    width = max(len(name) for name, _ in rows)
    head = f"launcher logs -f, {r['files']} files, {r['mode']}, idle {r['idle_s']:.1f} s"
    return "\n".join([head] + [f"  {name:<{width}}  {value}" for name, value in rows]
                     + ([f"  stderr: {r['stderr']}"] if r["stderr"] else []))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=10000)
    p.add_argument("--idle", type=float, default=10.0)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--poll", action="store_true", help="follow without inotify (a user namespace that has none)")
    p.add_argument("--code", type=Path, default=REPO, help="the folder the launcher package is taken from")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.poll and shutil.which("unshare") is None:
        sys.exit("--poll needs unshare (util-linux) and user namespaces")
    folder = Path(tempfile.mkdtemp(prefix="follow-bench-"))
    try:
        make_logs(folder, args.files)
        result = measure(folder, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
