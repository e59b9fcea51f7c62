"""A short GPU timing, side by side with torchrun (for bench/gpu_check.sh; about a minute).

    python bench/gpu_timing.py [--runs 3] [--steps 300]

1. Start-up to a finished NCCL job: wall time of examples/hello_allreduce.py on every GPU under
   `python -m launcher` and under `torchrun --nproc_per_node N` (median of --runs).
2. Training speed on the GPUs: steps/s of the Fleet tutorial's MLP (batch 1024) with our
   fleet.distributed_optimizer and fleet.distributed_model, against DistributedDataParallel under torchrun.
Prints one JSON object; without CUDA it says so and exits 0.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HELLO = REPO / "examples" / "hello_allreduce.py"
STEPS = REPO / "bench" / "gpu_steps.py"


def gpus() -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"],
                         capture_output=True, text=True, timeout=120)
    return int(out.stdout.strip() or 0)


def timed(cmd) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}: {r.stderr[-2000:]}")
    return time.perf_counter() - start


def launchers(n: int) -> dict:
    torchrun = shutil.which("torchrun")
    ours = [sys.executable, "-m", "launcher", "--print_config", "false", "--selected_gpus", ",".join(map(str, range(n)))]
    theirs = [torchrun, "--nproc_per_node", str(n)] if torchrun else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n)]
    return {"launcher": ours, "torchrun": theirs}


def startup(n: int, runs: int) -> dict:
    out = {}
    for name, cmd in launchers(n).items():
        out[name] = statistics.median(timed(cmd + [str(HELLO)]) for _ in range(runs))
    out["ratio"] = out["launcher"] / out["torchrun"]
    return out


def speed(n: int, steps: int) -> dict:
    out = {}
    cases = [("launcher", "optimizer"), ("launcher", "model"), ("torchrun", "ddp")]
    for who, api in cases:
        with tempfile.TemporaryDirectory() as d:
            timed(launchers(n)[who] + [str(STEPS), api, str(steps), d])
            rates = [json.loads(p.read_text())["steps_per_s"] for p in Path(d).glob("gpu_steps.*.json")]
            out[f"{api} ({who})"] = min(rates)
    base = out["ddp (torchrun)"]
    out["ratios_vs_ddp"] = {k: v / base for k, v in out.items() if k != "ddp (torchrun)"}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    n = gpus()
    if not n:
        print(json.dumps({"gpus": 0, "skipped": "torch sees no CUDA GPU here"}))
        return
    print(json.dumps({"gpus": n, "startup_s": startup(n, args.runs), "steps_per_s": speed(n, args.steps)}, indent=1))


if __name__ == "__main__":
    main()
