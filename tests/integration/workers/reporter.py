"""A worker that reports its progress (launcher.runtime.report) and prints a line per step, for 100 s at most.

    reporter.py FOLDER

With REPORTER_TOTAL_STEPS=N its reports carry total_steps=N. It ends at FOLDER/stop; with REPORTER_SLOW_STOP=1, 20 s after SIGTERM. With FOLDER/stall.RANK present, that rank stops reporting (but goes on printing) from step 5 on; with
FOLDER/fail.RANK present, that rank exits 3 at step 3 of its first attempt (TORCHELASTIC_RESTART_COUNT 0), or at the step
after, when the file comes later.
FOLDER/fd.RANK: the descriptor number it was given for its progress page (or "none")."""

import os
import signal
import sys
import time
from pathlib import Path

from launcher.runtime import report

folder = Path(sys.argv[1])
rank = os.environ["RANK"]
(folder / f"fd.{rank}").write_text(os.environ.get("LAUNCHER_PROGRESS_FD", "none"))
first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
totals = {"total_steps": int(os.environ["REPORTER_TOTAL_STEPS"])} if os.environ.get("REPORTER_TOTAL_STEPS") else {}
if os.environ.get("REPORTER_SLOW_STOP"):  # a stop takes it 20 s: the page shows the others meanwhile
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(20), sys.exit(143)))
for step in range(500):
    if (folder / "stop").exists():
        break
    if step >= 3 and first and (folder / f"fail.{rank}").exists():
        sys.exit(3)
    if not (step >= 5 and (folder / f"stall.{rank}").exists()):
        report(step=step, loss=1.0 / (step + 1), lr=0.1, **totals)
    print(f"step {step}", flush=True)
    time.sleep(0.2)
