"""Node 0's launcher serves the workers' rendezvous store itself (--agent_store): across nodes a late
rank 0 costs no wait, no process is added for it, a restart meets in an empty store, and a hostile
client of the store does not hurt the job; on one node ``auto`` leaves the store to rank 0."""

import json
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import PROBE, REPO, WORKERS, finish_all, free_ports, launcher_cmd, read_dumps, run_launcher, \
    start_launcher, wait_for

LATE = WORKERS / "late_rank0.py"
TOGETHER = 0.1  # seconds from rank 0's arrival to every rank past the first barrier, one node
TOGETHER_ACROSS_NODES = 1.0  # the same with 2 launchers and 4 workers on 2 shared cores
NODES = ["127.0.0.1", "127.0.0.2"]
PADDLE26 = Path(os.environ.get("LAUNCHER_PADDLE26_VENV") or Path.home() / ".cache" / "launcher-tests" / "paddle26")


def late_records(folder, attempt=0):
    return {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in Path(folder).glob(f"late.*.{attempt}.json")}


def together_after(records) -> float:
    return max(r["passed"] for r in records.values()) - records[0]["arrived"]


def run_late(folder, late, *args, env=None):
    return run_launcher("--print_config", "false", "--nproc_per_node", 3, *args, LATE, folder, late, env=env,
                        timeout=180)


def start_two_nodes(folder, late, *args, env=None):
    """Node 1 (127.0.0.2), then node 0 (127.0.0.1), 2 workers each: [node 0's launcher, node 1's]."""
    port = free_ports(3)
    full_env = {**os.environ, **(env or {})}
    procs = [subprocess.Popen(launcher_cmd("--cluster_node_ips", ",".join(NODES), "--node_ip", ip, "--started_port",
                                           port, "--nproc_per_node", 2, "--print_config", "false", *args,
                                           LATE, folder, late),
                              cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for ip in reversed(NODES)]
    return procs[::-1], port


def finish_two_nodes(procs):
    """Wait for both (node 1 first); (code, stdout, stderr) of node 0, then of node 1, both 0."""
    results = finish_all(procs[::-1], timeout=180)[::-1]
    for code, out, err in results:
        assert code == 0, err
    return results


def helpers_of(launcher_pid, script=LATE):
    """The launcher's children that are not workers. A worker runs ``script`` or has RANK in its
    environment: one read as it execs may show its new command line with its old environment."""
    found = []
    for child in psutil.Process(launcher_pid).children():
        try:
            cmdline = " ".join(child.cmdline())
            if "RANK" not in child.environ() and str(script) not in cmdline:
                found.append(cmdline)
        except psutil.Error:
            continue
    return found


def is_watchdog(cmdline: str) -> bool:
    return "from launcher.run import watchdog" in cmdline


def listens_on(pid, port) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.Process(pid).net_connections())


# ---------------------------------------------------------------- across nodes (auto)


def test_two_nodes_node_0s_launcher_serves_the_store_itself_and_a_late_rank_0_costs_no_wait(tmp_path):
    """Rank 0 starts 5 s late; the other ranks, connected to node 0's launcher long before, are past the
    first barrier within 1 s of its arrival. The store is the launcher's own socket: no process is added."""
    for attempt in range(2):  # one second try: the CPUs are shared
        folder = tmp_path / f"try{attempt}"
        folder.mkdir()
        procs, port = start_two_nodes(folder, 5)
        try:
            wait_for(lambda: len(list(folder.glob("late.*"))) or listens_on(procs[0].pid, port), timeout=60,
                     what="node 0's store")
            assert listens_on(procs[0].pid, port) and not listens_on(procs[1].pid, port)
            # the store's port listens from the plan on, before the launch starts its watchdog: wait for it
            wait_for(lambda: helpers_of(procs[0].pid), timeout=30, what="node 0's watchdog")
            helpers = helpers_of(procs[0].pid)
            assert helpers and all(is_watchdog(h) for h in helpers), helpers
        finally:
            finish_two_nodes(procs)
        records = late_records(folder)
        assert sorted(records) == [0, 1, 2, 3]
        assert {rec["agent_store"] for rec in records.values()} == {"True"}
        assert all(rec["launched"] for rec in records.values())
        if together_after(records) < TOGETHER_ACROSS_NODES:
            return
    pytest.fail(f"rank 0 5 s late: together {together_after(records):.3f} s after its arrival")


def test_two_nodes_a_restart_meets_in_an_empty_store(tmp_path):
    procs, _ = start_two_nodes(tmp_path, 0, "--max_restarts", 1, env={"FAIL_FIRST": "1"})
    (_, _, err0), _ = finish_two_nodes(procs)
    assert "restarting the job, attempt 2 of 2" in err0, err0
    first, second = late_records(tmp_path, 0), late_records(tmp_path, 1)
    assert sorted(first) == sorted(second) == [0, 1, 2, 3]
    assert {r["agent_store"] for r in second.values()} == {"True"}
    assert not any(r["stale"] for r in second.values())  # attempt 0's keys are gone


def hostile_clients(port):
    """Clients that break torch's protocol each their own way, and 300 that connect and say nothing."""
    validate = bytes([0]) + struct.pack("<I", 0x3C85F7CE)
    payloads = [b"GET / HTTP/1.1\r\n\r\n", validate + bytes([1]) + struct.pack("<Q", 2 ** 63),
                validate + bytes([99]), validate + bytes([1]) + struct.pack("<Q", 3) + b"/k",  # then silence
                validate + (bytes([3]) + struct.pack("<Q", 2) + b"/k") * 20000]  # asks, never reads
    socks = []
    for data in payloads:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(data)
        socks.append(s)
    for _ in range(300):
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return socks


def test_two_nodes_hostile_clients_of_the_store_do_not_hurt_the_job(tmp_path):
    procs, port = start_two_nodes(tmp_path, 2)
    socks = []
    try:
        wait_for(lambda: listens_on(procs[0].pid, port), timeout=60, what="node 0's store")
        socks = hostile_clients(port)
        # connected through every rank's use of the store; then let go: node 0's launcher would otherwise serve
        # them up to its drain bound (60 s) after the job, a bound tests/test_store.py proves on a fake clock
        wait_for(lambda: len(late_records(tmp_path)) == 4, timeout=180, what="every rank's record")
    finally:
        for s in socks:
            s.close()
        (_, _, err0), (_, _, err1) = finish_two_nodes(procs)
    assert "Traceback" not in err0 + err1
    records = late_records(tmp_path)
    assert sorted(records) == [0, 1, 2, 3]


# ---------------------------------------------------------------- one node


def workers_of(launcher_pid):
    found = []
    for child in psutil.Process(launcher_pid).children():
        try:
            found += [child.pid] if "RANK" in child.environ() else []
        except psutil.Error:
            continue
    return found


def test_one_node_auto_leaves_the_store_to_rank_0_and_adds_no_process(tmp_path):
    port = free_ports(2)
    launcher = start_launcher("--nproc_per_node", 2, "--started_port", port, "--print_config", "false", LATE,
                              tmp_path, 3)
    try:
        wait_for(lambda: len(workers_of(launcher.pid)) == 2, timeout=60, what="the workers")
        helpers = helpers_of(launcher.pid)
        assert len(helpers) == 1 and is_watchdog(helpers[0]), helpers
        assert not listens_on(launcher.pid, port)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 0, err
    assert {rec["agent_store"] for rec in late_records(tmp_path).values()} == {"False"}


def assert_together(tmp_path, late, *args):
    """Every rank past the barrier within TOGETHER of rank 0's arrival; one second try, since the CPUs are shared."""
    for attempt in range(2):
        folder = tmp_path / f"try{attempt}"
        folder.mkdir()
        r = run_late(folder, late, "--agent_store", "on", *args)
        assert r.returncode == 0, r.stderr
        records = late_records(folder)
        assert {rec["agent_store"] for rec in records.values()} == {"True"}
        assert all(rec["launched"] for rec in records.values())  # torch's is_torchelastic_launched()
        if together_after(records) < TOGETHER:
            return
    pytest.fail(f"rank 0 {late} s late: together {together_after(records):.3f} s after its arrival")


def test_on_one_node_a_rank_0_3_s_late_finds_every_rank_waiting(tmp_path):
    assert_together(tmp_path, 3)


def test_on_one_node_a_restart_meets_in_an_empty_store(tmp_path):
    r = run_late(tmp_path, 0, "--agent_store", "on", "--max_restarts", 1, env={"FAIL_FIRST": "1"})
    assert r.returncode == 0, r.stderr
    assert "restart" in r.stderr
    assert len(late_records(tmp_path, 0)) == len(late_records(tmp_path, 1)) == 3
    assert not any(rec["stale"] for rec in late_records(tmp_path, 1).values())


def test_opt_out_leaves_the_store_to_rank_0(tmp_path):
    r = run_late(tmp_path, 0, "--agent_store", "off")
    assert r.returncode == 0, r.stderr
    assert {rec["agent_store"] for rec in late_records(tmp_path).values()} == {"False"}


def test_a_store_port_in_use_is_refused_in_one_sentence():
    port = free_ports(2)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        r = run_launcher("--agent_store", "on", "--nproc_per_node", 2, "--started_port", port, PROBE, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is already in use" in lines[0], r.stderr


def test_on_with_a_torch_older_than_the_protocol_served_is_refused_with_exit_2(tmp_path):
    """A torch 2.4.0 first on the path of the launcher's own Python (a package and its metadata, never imported)."""
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (fake / "torch-2.4.0.dist-info").mkdir()
    (fake / "torch-2.4.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.0\n")
    path = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", str(REPO))])
    r = run_launcher("--agent_store", "on", "--nproc_per_node", 2, PROBE, env={"PYTHONPATH": path}, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "launcher: error: --agent_store on, but the workers' torch 2.4.0 is older than 2.5, whose store protocol the "
        "launcher serves; give --agent_store off."]


def test_the_store_ends_with_the_launcher_even_after_kill_9(tmp_path):
    port = free_ports(2)
    launcher = start_launcher("--agent_store", "on", "--nproc_per_node", 2, "--started_port", port,
                              "--shutdown_timeout", 1, PROBE, "--dump", tmp_path, "--sleep", 120)
    try:
        read_dumps(tmp_path, 2)
        assert listens_on(launcher.pid, port)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    with socket.socket() as s:  # nobody listens there any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


def _no_torch_python():
    python = PADDLE26 / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"no interpreter without torch at {python} (tests/integration/test_real_paddle.py makes one)")
    return str(python)


@pytest.mark.parametrize("choice, told", [("auto", "False"), ("on", "True")])
def test_a_worker_python_without_torch_is_unaffected(tmp_path, choice, told):
    python = _no_torch_python()
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\n"
                      "rank = os.environ['RANK']\n"
                      "json.dump(dict(os.environ), open(os.path.join(sys.argv[1], f'env.{rank}.json'), 'w'))\n")
    r = run_launcher("--agent_store", choice, "--nproc_per_node", 2, "--print_config", "false", script, tmp_path,
                     env={"PYTHON_EXEC": python}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [line.rpartition(" in ")[0] for line in r.stderr.splitlines()] == ["launcher: all 2 worker(s) finished"]
    assert {d["TORCHELASTIC_USE_AGENT_STORE"] for d in read_dumps(tmp_path, 2).values()} == {told}
