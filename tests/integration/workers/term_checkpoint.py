"""Records the signals it gets, in order, in DIR/signals.RANK: ignores SIGINT (as a script that
catches KeyboardInterrupt and goes on would), saves a 'checkpoint' and exits 0 on SIGTERM."""

import os
import signal
import sys
import time

folder = sys.argv[1]
rank = os.environ["RANK"]
path = os.path.join(folder, f"signals.{rank}")


def note(signum, frame):
    with open(path, "a") as f:
        f.write(f"{signal.Signals(signum).name} {time.time():.3f}\n")
    if signum == signal.SIGTERM:
        with open(os.path.join(folder, f"checkpoint.{rank}"), "w") as f:
            f.write("saved")
        sys.exit(0)


signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
open(os.path.join(folder, f"ready.{rank}"), "w").close()
while True:
    time.sleep(0.05)
