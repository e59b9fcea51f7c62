"""Leaves COUNT orphans behind (each a background `true` whose shell exits at once), which come
back to the launcher as their subreaper; then writes DONE_FILE and sleeps."""

import subprocess
import sys
import time

count, done_file = int(sys.argv[1]), sys.argv[2]
for _ in range(count):
    subprocess.run(["sh", "-c", "true & exit 0"], check=True)
with open(done_file, "w") as f:
    f.write("done")
time.sleep(60)
