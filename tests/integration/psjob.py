"""Start a parameter-server job's processes by hand, with the variables the launcher gives them
(until the launcher's --server_num lands), and make sure none outlives the test."""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from conftest import free_ports as consecutive_free_ports
from launcher.host.preflight import reserve_port

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"


def free_ports(count):
    """COUNT free ports below the kernel's ephemeral range (conftest.free_ports)."""
    first = consecutive_free_ports(count)
    return list(range(first, first + count))


def ps_variables(servers, trainers):
    """{("server", i) or ("trainer", j): the variables the launcher sets for it}."""
    ports = free_ports(servers + trainers)
    server_eps = [f"127.0.0.1:{p}" for p in ports[:servers]]
    trainer_eps = [f"127.0.0.1:{p}" for p in ports[servers:]]
    common = {"PADDLE_PSERVERS_IP_PORT_LIST": ",".join(server_eps), "PADDLE_TRAINERS_NUM": str(trainers),
              "PADDLE_TRAINER_ENDPOINTS": ",".join(trainer_eps), "OMP_NUM_THREADS": "1", "FLAGS_rpc_deadline": "30000"}
    out = {}
    for i, ep in enumerate(server_eps):
        out[("server", i)] = dict(common, TRAINING_ROLE="PSERVER", PADDLE_PSERVER_ID=str(i), PADDLE_PORT=ep.split(":")[1],
                                  POD_IP="127.0.0.1", PADDLE_CURRENT_ENDPOINT=ep)
    for j, ep in enumerate(trainer_eps):
        out[("trainer", j)] = dict(common, TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID=str(j), PADDLE_CURRENT_ENDPOINT=ep)
    return out


def base_env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PADDLE_TRAINER_ID", "TRAINING_ROLE"):
        env.pop(name, None)
    return env


@dataclass
class Job:
    out: Path
    procs: dict  # ("server", i) / ("trainer", j) -> Popen
    held: Optional[socket.socket] = None  # server 0's port, kept from other binds until its store takes it

    def wait(self, timeout):
        """{key: exit code}, waiting at most ``timeout`` seconds in all (None: still running)."""
        deadline = time.monotonic() + timeout
        codes = {}
        for key, p in self.procs.items():
            try:
                codes[key] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[key] = None
        return codes

    def log(self, key):
        return (self.out / f"{key[0]}.{key[1]}.log").read_text(errors="replace")

    def logs(self):
        return "\n".join(f"--- {k}\n{self.log(k)[-3000:]}" for k in self.procs)

    def kill(self):
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs.values():
            p.wait()
        if self.held is not None:
            self.held.close()


def start(out, servers, trainers, script, *args, extra_env=None, cwd=REPO):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    procs = {}
    jobs_variables = ps_variables(servers, trainers)
    # as the launcher does: without it, the RPC listener or a connection of another job started at the same
    # time can take the port first (then that job's processes get this one's store traffic)
    held = reserve_port("127.0.0.1", int(jobs_variables[("server", 0)]["PADDLE_PORT"]))
    for key, variables in jobs_variables.items():
        log = open(out / f"{key[0]}.{key[1]}.log", "w")
        cmd = [sys.executable, str(WORKERS / script), *map(str, args)]
        procs[key] = subprocess.Popen(cmd, cwd=cwd, env={**base_env(), **variables, **(extra_env or {})},
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
    return Job(out, procs, held)


def run(out, servers, trainers, script, *args, timeout=60, extra_env=None):
    """Start the job, wait for it, kill what is left; (job, exit codes)."""
    job = start(out, servers, trainers, script, *args, extra_env=extra_env)
    try:
        return job, job.wait(timeout)
    finally:
        job.kill()
