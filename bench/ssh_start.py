#!/usr/bin/env python3
"""A whole job started from one terminal over ssh: how long until every rank runs, and what the command costs.

    python bench/ssh_start.py [--hosts 2,8,32,128] [--runs 3] [--sides pdsh,serial,ours] [--fanout 1024]
                              [--idle 5] [--launcher_options "..."] [--json FILE] [--keep DIR]

Every host is a loopback address (127.0.0.1 ... 127.0.0.N) served by a real sshd of the bench's own
(tests/sshd.py: its keys, a free port, ``-F`` a client config of its own; never the machine's sshd or ~/.ssh),
each host one node of a static job with one worker (``--nproc_per_node 1``); the worker writes the time it
started, prints one line, and waits (no torch import) until the bench releases every worker at once, as a job runs
until all its ranks are done (a worker that exited at once would end node 0 before the last hosts joined). Three
ways to start it, each given the same hosts:

- pdsh, as DeepSpeed's launcher does it: ``pdsh -S -R ssh -f FANOUT -w 127.0.0.[1-N] "cd REPO && PYTHON -m
  launcher --cluster_node_ips ALL --node_ip %h --nproc_per_node 1 --started_port P worker.py ..."`` (pdsh puts the
  host in for ``%h``; ``PDSH_SSH_ARGS_APPEND="-F CONFIG"`` makes its ssh use the bench's config). FANOUT is
  DeepSpeed's, 1024, by default: with pdsh's own default, 32, the hosts past the 32nd start only once a session
  of the first 32 ends, so a job of more hosts never forms (its node 0 waits for them; ``--fanout 32`` shows it:
  the run ends in an error);
- serial: one ``ssh -F CONFIG HOST "echo connected; cd REPO && exec PYTHON -m launcher ... --node_ip HOST ..."`` a
  host, each started once the previous one said ``connected`` (its session runs);
- ours: ``python -m launcher --hostfile FILE --ssh_args "-F CONFIG" --nproc_per_node 1 worker.py ...`` (issue 52;
  skipped, with a line saying so, while the launcher has no ``--hostfile``).

A run's figure is from just before the command starts to the last rank's first line (the time its worker
wrote). Each side runs ``--runs`` times, the sides alternated (pdsh, serial, ours, pdsh, ...): min, median and
max. For each, also: the CPU seconds of the command side (the command and its ssh clients, reaped ones included)
and of the hosts' side (sshd's sessions, the launchers and the workers: every process under the sshd, reaped),
per host; and what was left running under the sshd after the command ended (then killed). With ``--idle S``,
one more run per side whose workers are released S + 1 seconds after every rank's first line: from 1 s after it,
for S seconds, the command side's processes grouped by name: their number, CPU (share of one core), RSS, open file
descriptors and TCP connections; and then the RSS of everything under the sshd (what 128 hosts on one machine
take: sessions, launchers, workers). ``--keep DIR`` keeps each run's folder (the command's output).
``--launcher_options`` go to every launcher of every side (at 128 hosts on 2 busy cores, the default heartbeat
timeout of 3 s loses a node still starting: ``--launcher_options "--heartbeat_timeout 30"``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(BENCH.parent / "tests"))
import harness  # noqa: E402
from sshd import SshHosts, start_sshd  # noqa: E402

REPO = harness.REPO
WORKER = """\
import os, sys, time
started = time.time()
folder = sys.argv[1]
rank = os.environ["RANK"]
print(f"rank {rank} up", flush=True)
with open(os.path.join(folder, f"first.{rank}.tmp"), "w") as f:
    f.write(repr(started))
os.rename(os.path.join(folder, f"first.{rank}.tmp"), os.path.join(folder, f"first.{rank}"))
deadline = started + 900  # a bound of its own: the bench releases every worker at once
while not os.path.exists(os.path.join(folder, "release")) and time.time() < deadline:
    time.sleep(0.2)
"""
END_BOUND_S = 120.0
CONNECT_TIMEOUT_S = 10


class Skipped(Exception):
    """A side that cannot run here; the message says why, in one line."""


@dataclass(frozen=True)
class Setup:
    """What every side of one host count is given."""
    servers: SshHosts
    worker: Path
    fanout: int
    options: tuple = ()  # given to every launcher

    @property
    def hosts(self) -> list:
        return self.servers.hosts

    def node_command(self, node_ip: str, port: int, folder: Path) -> str:
        """The remote shell's command of one node (pdsh's and serial's): a static job of every host."""
        launcher = [sys.executable, "-m", "launcher", "--cluster_node_ips", ",".join(self.hosts), "--node_ip",
                    node_ip, "--nproc_per_node", "1", "--started_port", str(port), *self.options, str(self.worker),
                    str(folder)]
        return f"cd {shlex.quote(str(REPO))} && exec {' '.join(map(shlex.quote, launcher))}"


# ---------------------------------------------------------------- the sides: each starts the job, its head's runs


def pdsh_side(setup: Setup, folder: Path, ports: harness.PortReservations) -> list:
    hosts = f"127.0.0.[1-{len(setup.hosts)}]" if setup.hosts[0] == "127.0.0.1" else ",".join(setup.hosts)
    port = ports.reserve_block(2) + 1  # node 0's control port is the first worker port minus one
    env = {**harness.bench_env(), "PDSH_SSH_ARGS_APPEND": " ".join(setup.servers.ssh_args),
           "PDSH_RCMD_TYPE": "ssh"}
    argv = ["pdsh", "-S", "-R", "ssh", "-f", str(setup.fanout), "-w", hosts,
            setup.node_command("%h", port, folder)]
    return [harness.Run(argv, folder, name="pdsh", env=env)]


def serial_side(setup: Setup, folder: Path, ports: harness.PortReservations) -> list:
    port = ports.reserve_block(2) + 1
    runs = []
    try:
        for n, host in enumerate(setup.hosts):
            command = f"echo connected; {setup.node_command(host, port, folder)}"
            runs.append(harness.Run(setup.servers.ssh_command(host, command, connect_timeout=CONNECT_TIMEOUT_S),
                                    folder, name=f"ssh{n}"))
            wait_until(lambda: runs[-1].stdout_path.read_bytes().startswith(b"connected\n"), END_BOUND_S,
                       f"{host}'s session", runs[-1])
    except BaseException:
        for run in runs:
            run.stop()
        raise
    return runs


def ours_side(setup: Setup, folder: Path, ports: harness.PortReservations) -> list:
    if not harness.ours_has_option("--hostfile"):
        raise Skipped("this launcher has no --hostfile yet (issue 52)")
    hostfile = setup.servers.hostfile(folder / "hostfile", slots=1)
    argv = [sys.executable, "-m", "launcher", "--hostfile", str(hostfile), "--ssh_args",
            " ".join(setup.servers.ssh_args), "--nproc_per_node", "1", *setup.options, str(setup.worker), str(folder)]
    return [harness.Run(argv, folder, name="ours")]


SIDES: dict = {"pdsh": pdsh_side, "serial": serial_side, "ours": ours_side}


# ---------------------------------------------------------------- one run


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, *runs: harness.Run) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if all(run.exited for run in runs) and runs and not predicate():
            raise harness.BenchError(f"the command ended ({[run.exit_code for run in runs]}) before {what}"
                                     f"{runs[-1].stderr_tail()}")
        if time.monotonic() > deadline:
            raise harness.BenchError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.005)


def under_sshd(servers: SshHosts) -> list:
    """Every process under the sshd listeners: the sessions and what they run."""
    found = []
    for pid in servers.pids:
        try:
            found += psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
    return found


def reaped_cpu(pids: list) -> float:
    """CPU seconds of the processes and of their reaped children (a Run's exited head is readable until reaped)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_once(side: Callable, setup: Setup, folder: Path, idle: float) -> dict:
    """One start of the job by ``side``: the figures, or ``{"skipped": why}``."""
    folder.mkdir(parents=True)
    hosts = len(setup.hosts)
    remote_before = reaped_cpu(setup.servers.pids)
    with harness.PortReservations() as ports:
        began = time.time()
        try:
            runs = side(setup, folder, ports)
        except Skipped as why:
            return {"skipped": str(why)}
        try:
            bound = 60 + hosts
            wait_until(lambda: len(list(folder.glob("first.*[0-9]"))) == hosts, bound, "first line of every rank",
                       *runs)
            result = {"first_lines_s": max(float(p.read_text()) for p in folder.glob("first.*[0-9]")) - began}
            if idle:
                time.sleep(1.0)
                result["cost"] = command_cost(runs, idle)
                result["hosts_rss_mib"] = hosts_rss(setup.servers)
            (folder / "release").touch()
            for run in runs:
                run.wait(END_BOUND_S)
            result["exit_codes"] = sorted({run.exit_code for run in runs})
            result["command_cpu_s"] = reaped_cpu([run.proc.pid for run in runs])
        finally:
            (folder / "release").touch()
            time.sleep(0.5)  # the remote launchers' own end
            left = under_sshd(setup.servers)
            harness.kill_all([p.pid for p in left])
            psutil.wait_procs(left, timeout=10)
            for run in runs:
                run.stop()
    result["left_under_sshd"] = len(left)
    result["hosts_cpu_s"] = reaped_cpu(setup.servers.pids) - remote_before
    return result


def run_or_error(side: Callable, setup: Setup, folder: Path, idle: float) -> dict:
    try:
        return run_once(side, setup, folder, idle)
    except harness.BenchError as error:
        return {"error": str(error)}


def hosts_rss(servers: SshHosts) -> dict:
    """The RSS of the hosts' side now (sshd's sessions, the launchers, the workers), MiB, summed by name."""
    found: dict = {}
    for p in under_sshd(servers):
        try:
            found[p.name()] = found.get(p.name(), 0.0) + p.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return found


def command_cost(runs: list, seconds: float) -> dict:
    """The command side's processes (the runs and their descendants) over ``seconds``, grouped by name."""
    procs = []
    for run in runs:
        try:
            head = psutil.Process(run.proc.pid)
            procs += [head, *head.children(recursive=True)]
        except psutil.Error:
            continue
    before = {p.pid: _cpu(p) for p in procs}
    time.sleep(seconds)
    groups: dict = {}
    for p in procs:
        try:
            with p.oneshot():
                row = groups.setdefault(p.name(), {"count": 0, "cpu_share": 0.0, "rss_mib": 0.0, "fds": 0,
                                                   "tcp": 0})
                row["count"] += 1
                row["cpu_share"] += (_cpu(p) - before[p.pid]) / seconds
                row["rss_mib"] += p.memory_info().rss / 2**20
                row["fds"] += p.num_fds()
                row["tcp"] += len(p.net_connections("tcp"))
        except psutil.Error:
            continue
    return groups


def _cpu(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system


# ---------------------------------------------------------------- the command line


def measure(hosts: int, sides: list, runs: int, fanout: int, idle: float, folder: Path, options: tuple) -> dict:
    """Every side at ``hosts`` hosts: {side: {"runs": [...], "cost": ... or "skipped": why}}."""
    servers = start_sshd(folder / "sshd", hosts, failures=False)
    try:
        worker = folder / "worker.py"
        worker.write_text(WORKER)
        setup = Setup(servers, worker, fanout, options)
        results: dict = {side: {"runs": []} for side in sides}
        for n in range(runs):
            for side in sides:
                if "skipped" not in results[side]:
                    done = run_or_error(SIDES[side], setup, folder / f"{side}.{n}", 0.0)
                    results[side].update(done) if "skipped" in done else results[side]["runs"].append(done)
        for side in sides:
            if idle and "skipped" not in results[side]:
                results[side]["cost_run"] = run_or_error(SIDES[side], setup, folder / f"{side}.cost", idle)
        return results
    finally:
        servers.close()


def report(hosts: int, results: dict) -> None:
    print(f"\n{hosts} hosts: from the command to every rank's first line (s), and CPU seconds per host")
    print(f"  {'side':8}{'min':>8}{'median':>8}{'max':>8}{'command':>10}{'hosts':>8}  exit codes, left under sshd")
    for side, result in results.items():
        if "skipped" in result:
            print(f"  {side:8}skipped: {result['skipped']}")
            continue
        done = [r for r in result["runs"] if "error" not in r]
        for run in result["runs"]:
            if "error" in run:
                print(f"  {side:8}a run failed: {run['error']}")
        if not done:
            continue
        times = [r["first_lines_s"] for r in done]
        command = statistics.median(r["command_cpu_s"] for r in done) / hosts
        remote = statistics.median(r["hosts_cpu_s"] for r in done) / hosts
        codes = sorted({c for r in done for c in r["exit_codes"]})
        left = sum(r["left_under_sshd"] for r in done)
        print(f"  {side:8}{min(times):8.2f}{statistics.median(times):8.2f}{max(times):8.2f}{command:10.3f}"
              f"{remote:8.3f}  {codes}, {left}")
    for side, result in results.items():
        if "error" in result.get("cost_run", {}):
            print(f"  while running, {side} side: the run failed: {result['cost_run']['error']}")
        if "hosts_rss_mib" in result.get("cost_run", {}):
            rss = result["cost_run"]["hosts_rss_mib"]
            print(f"  while running, {side}, the hosts' side: {sum(rss.values()):.0f} MiB RSS in all ("
                  + ", ".join(f"{name} {mib:.0f}" for name, mib in sorted(rss.items())) + ")")
        for name, row in result.get("cost_run", {}).get("cost", {}).items():
            print(f"  while running, {side} side: {row['count']} {name}: {100 * row['cpu_share']:.2f}% of a core, "
                  f"{row['rss_mib']:.1f} MiB RSS, {row['fds']} fds, {row['tcp']} TCP connections")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="2,8,32,128", help="host counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--fanout", type=int, default=1024, help="pdsh's -f (DeepSpeed's: 1024)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the cost run (0: none)")
    parser.add_argument("--launcher_options", default="", help="options given to every launcher")
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", default=None, help="a folder to keep every run's files in")
    args = parser.parse_args()
    sides = args.sides.split(",")
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"--sides {args.sides}: no side {sorted(unknown)}; the sides are {','.join(SIDES)}")
    everything = {}
    with tempfile.TemporaryDirectory() as scratch:
        for hosts in map(int, args.hosts.split(",")):
            folder = Path(args.keep or scratch) / f"hosts{hosts}"
            everything[hosts] = measure(hosts, sides, args.runs, args.fanout, args.idle, folder,
                                        tuple(shlex.split(args.launcher_options)))
            report(hosts, everything[hosts])
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
