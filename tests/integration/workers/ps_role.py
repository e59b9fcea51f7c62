"""A fake parameter-server process: no torch, just what the launcher sees of one.

argv[1]: a folder for its records. Servers record their start, wait, and record the SIGTERM that
stops them; trainers record their variables, print a few lines and exit. Knobs (variables):
TRAINER_SECONDS (0.3) or TRAINER_SECONDS_<id>, TRAINER_CODE_<id> (0), SERVER_KILL_<id> (seconds until it kills itself),
SERVER_SECONDS (60: how long a server waits before it exits 0 by itself), TRAINER_FAIL_FIRST (trainer 0 exits 9 on
the first attempt), TRAINER_WAITS_FOR_SERVERS (1: a trainer starts its steps once every server of the job has recorded
its start, as a real trainer first connects to them; a server records its start only once its SIGTERM handler is set,
so a test may then expect a "term" record from each server that the launcher stops).
"""

import json
import os
import signal
import sys
import time

out = sys.argv[1]
env = os.environ
role = env["TRAINING_ROLE"]
me = env["PADDLE_PSERVER_ID"] if role == "PSERVER" else env["PADDLE_TRAINER_ID"]
name = f"{'server' if role == 'PSERVER' else 'trainer'}.{me}"


def record(what: str, **extra) -> None:
    with open(os.path.join(out, f"{name}.{what}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "time": time.time(), **extra}, f)


def on_term(sig, frame):
    record("term")
    sys.exit(0)


def wait_for_servers() -> None:
    servers = len(env["PADDLE_PSERVERS_IP_PORT_LIST"].split(","))
    deadline = time.monotonic() + 60  # a hang guard: the test fails on the missing records
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out, f"server.{i}.start.json")) for i in range(servers)):
        time.sleep(0.02)


if role == "PSERVER":
    signal.signal(signal.SIGTERM, on_term)
record("start", env={k: v for k, v in env.items() if k.startswith(("PADDLE_", "TRAINING_", "POD_", "RANK", "MASTER_"))})
if role == "PSERVER":
    print(f"server {me} listening on {env['PADDLE_CURRENT_ENDPOINT']}", flush=True)
    kill_after = env.get(f"SERVER_KILL_{me}")
    began = time.monotonic()
    deadline = began + float(env.get("SERVER_SECONDS", "60"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if kill_after and time.monotonic() > began + float(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)

if env.get("TRAINER_WAITS_FOR_SERVERS"):
    wait_for_servers()
for step in range(3):
    print(f"trainer {me} step {step}", flush=True)
    time.sleep(float(env.get(f"TRAINER_SECONDS_{me}", env.get("TRAINER_SECONDS", "0.3"))) / 3)
if env.get("TRAINER_FAIL_FIRST") and me == "0" and env["PADDLE_RESTART_COUNT"] == "0":
    sys.exit(9)
record("end")
sys.exit(int(env.get(f"TRAINER_CODE_{me}", "0")))
