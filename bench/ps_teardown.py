#!/usr/bin/env python3
"""Teardown of a parameter-server job under our launcher, with fake servers and trainers (no torch):

    python bench/ps_teardown.py [RUNS]

(a) the last trainer exits 0 -> servers stopped, launcher exits 0; (b) trainer 1 exits 3 -> everything
stopped, launcher exits 3. Each time is from the trainer's own record, just before it exits, to the
launcher's exit; 2 servers and 2 trainers (tests/integration/workers/ps_role.py).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROLE = str(REPO / "tests" / "integration" / "workers" / "ps_role.py")


def once(env: dict) -> tuple:
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "launcher", "--server_num", "2", "--worker_num", "2",
                            "--print_config", "false", ROLE, d], env={**os.environ, **env}, cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        end = time.time()
        ends = [json.loads(p.read_text())["time"] for p in Path(d).glob("trainer.*.end.json")]
        return r.returncode, end - max(ends)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for name, env in (("trainers done -> exit 0", {}), ("trainer 1 exits 3 -> exit 3", {"TRAINER_CODE_1": "3"})):
        results = [once(env) for _ in range(runs)]
        times = [t for _, t in results]
        print(f"{name}: exit codes {sorted({c for c, _ in results})}, median {statistics.median(times) * 1000:.0f} ms, "
              f"max {max(times) * 1000:.0f} ms ({runs} runs)")


if __name__ == "__main__":
    main()
