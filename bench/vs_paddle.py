#!/usr/bin/env python3
"""Our launcher against Paddle's own (``python -m paddle.distributed.launch``), side by side, as against torchrun.

    python bench/vs_paddle.py [--runs N] [--json FILE] [--python PADDLES_PYTHON]

Both start 2 CPU workers of ``paddle_worker.py``, which reads only Paddle's variables, so Paddle itself is not
imported by the workers; Paddle must be installed for its launcher (else: nothing is measured, exit 0, saying so).
Figures, medians of N runs (default 5), ours / Paddle's:

- start-up: wall time of a job whose 2 workers exit 0 at once;
- teardown: from rank 1's exit 7 (its own time stamp) to the launcher's exit, and the launcher's exit code;
- left after ``kill -9`` of the launcher: worker processes still running 3 s later (then killed);
- log throughput: MB/s of 2 workers writing 20 MB each to ``--log_dir``;
- idle memory: resident memory of the launcher and its helpers (not the workers) while the workers sleep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "paddle_worker.py")
NAMES = ("ours", "paddle")


def launchers(python: str) -> dict:
    """Each launcher's command, both run by ``python`` (an interpreter that has paddle)."""
    return {"ours": [python, "-m", "launcher", "--nproc_per_node", "2", "--print_config", "false"],
            "paddle": [python, "-m", "paddle.distributed.launch", "--nproc_per_node", "2"]}
SPEW_MB = 20


def paddle_installed(python: str = sys.executable) -> bool:
    return subprocess.run([python, "-c", "import paddle.distributed.launch"], capture_output=True).returncode == 0


def start(launcher: list, folder: Path, *worker_args) -> subprocess.Popen:
    cmd = [*launcher, "--log_dir", str(folder / "log"), WORKER, *map(str, worker_args)]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def workers_of(folder: Path) -> list:
    """Every process running paddle_worker.py for this run's folder."""
    mine = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if WORKER in cmd and str(folder) in cmd:
            mine.append(p)
    return mine


def wait_ready(folder: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("*.ready"))) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready in {folder}")
        time.sleep(0.01)


def cleanup(proc: subprocess.Popen, folder: Path) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    leftovers = workers_of(folder)
    for p in leftovers:
        p.kill()
    psutil.wait_procs(leftovers, timeout=10)


def startup(launcher: list, folder: Path) -> dict:
    began = time.perf_counter()
    proc = start(launcher, folder, "exit", folder)
    code = proc.wait(timeout=120)
    return {"startup_s": time.perf_counter() - began, "startup_exit": code}


def teardown(launcher: list, folder: Path) -> dict:
    proc = start(launcher, folder, "fail", folder)
    try:
        code = proc.wait(timeout=120)
        ended = time.time()
        return {"teardown_s": ended - float((folder / "stamp").read_text()), "teardown_exit": code}
    finally:
        cleanup(proc, folder)


def killed(launcher: list, folder: Path) -> dict:
    proc = start(launcher, folder, "sleep", folder, 60)
    try:
        wait_ready(folder, 2)
        time.sleep(0.5)
        idle = _helpers_rss(proc, folder)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        time.sleep(3)
        return {"left_after_kill9": len(workers_of(folder)), "idle_mib": idle}
    finally:
        cleanup(proc, folder)


def _helpers_rss(proc: subprocess.Popen, folder: Path) -> float:
    """MiB resident of the launcher and its descendants that are not workers."""
    workers = {p.pid for p in workers_of(folder)}
    me = psutil.Process(proc.pid)
    procs = [me] + [c for c in me.children(recursive=True) if c.pid not in workers]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def throughput(launcher: list, folder: Path) -> dict:
    began = time.perf_counter()
    proc = start(launcher, folder, "spew", folder, SPEW_MB)
    code = proc.wait(timeout=300)
    elapsed = time.perf_counter() - began
    written = sum(f.stat().st_size for f in (folder / "log").glob("workerlog.*"))
    return {"log_mb_s": 2 * SPEW_MB / elapsed, "log_complete": written >= 2 * SPEW_MB * 10**6, "log_exit": code}


MEASURES = (startup, teardown, killed, throughput)


def measure(runs: int, python: str = sys.executable) -> dict:
    samples = {name: {} for name in NAMES}
    commands = launchers(python)
    root = Path(tempfile.mkdtemp(prefix="vs-paddle-"))
    try:
        for i in range(runs):
            for fn in MEASURES:
                for name in NAMES:  # ours, Paddle's, in turn
                    folder = root / f"{name}-{fn.__name__}-{i}"
                    folder.mkdir()
                    for key, value in fn(commands[name], folder).items():
                        samples[name].setdefault(key, []).append(value)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return samples


def summary(samples: dict) -> list:
    rows = []
    for key in samples["ours"]:
        ours, paddle = samples["ours"][key], samples["paddle"][key]
        if isinstance(ours[0], bool) or key.endswith("_exit"):
            rows.append((key, sorted(set(ours)), sorted(set(paddle)), ""))
            continue
        a, b = statistics.median(ours), statistics.median(paddle)
        rows.append((key, round(a, 3), round(b, 3), round(a / b, 2) if b else ""))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs both launchers and their workers (one with paddlepaddle)")
    args = parser.parse_args()
    if not paddle_installed(args.python):
        print(f"paddlepaddle is not installed for {args.python}: nothing to compare with (pip install paddlepaddle, "
              "or give --python)")
        return 0
    samples = measure(args.runs, args.python)
    print(f"{'figure':<18}{'ours':>14}{'Paddle':>14}{'ours/Paddle':>13}   (medians of {args.runs} runs)")
    for key, a, b, ratio in summary(samples):
        print(f"{key:<18}{str(a):>14}{str(b):>14}{str(ratio):>13}")
    if args.json:
        Path(args.json).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
