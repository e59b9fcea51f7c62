"""Starts processes that try to outlive the launcher, then writes DONE_FILE and sleeps.

    escapers.py TOKEN DONE_FILE

- a grandchild in a session of its own with an empty environment (no LAUNCHER_RUN_ID):
  ``setsid env -i sleep 300 TOKEN`` (the token only marks it);
- a daemon that re-forks into a new session every 10 ms, each generation exiting after forking the
  next, with an empty environment.
"""

import subprocess
import sys
import time

token, done_file = sys.argv[1], sys.argv[2]
subprocess.Popen(["setsid", "env", "-i", "sh", "-c", f"exec sleep 300 # {token}"])
DAEMON = f"""
import os, time
while True:
    time.sleep(0.01)
    if os.fork():
        os._exit(0)
    os.setsid()  # {token}
"""
subprocess.Popen(["setsid", "env", "-i", sys.executable, "-c", DAEMON])
with open(done_file, "w") as f:
    f.write("done")
time.sleep(300)
