"""Rank ABSENT never joins (it sleeps); the others call fleet.init with a short timeout.

    fleet_missing.py ABSENT TIMEOUT_S
"""

import os
import sys
import time

if os.environ["RANK"] == sys.argv[1]:
    time.sleep(60)
    sys.exit(0)

from launcher import fleet  # noqa: E402

print("endpoints:", os.environ["PADDLE_TRAINER_ENDPOINTS"], flush=True)

fleet.init(timeout=float(sys.argv[2]))
print("joined: unexpected", flush=True)
