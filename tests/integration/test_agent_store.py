"""Node 0's launcher hosts the workers' rendezvous store (--agent_store, issue 17): a late rank 0 costs no wait."""

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from conftest import PROBE, REPO, WORKERS, assert_all_gone, finish_all, free_ports, launcher_cmd, read_dumps, \
    run_launcher, start_launcher, wait_for

LATE = WORKERS / "late_rank0.py"
TOGETHER = 0.1  # seconds from rank 0's arrival to every rank past the first barrier
PADDLE26 = Path(os.environ.get("LAUNCHER_PADDLE26_VENV") or Path.home() / ".cache" / "launcher-tests" / "paddle26")


def late_records(folder, attempt=0):
    records = {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in Path(folder).glob(f"late.*.{attempt}.json")}
    return records


def together_after(records) -> float:
    return max(r["passed"] for r in records.values()) - records[0]["arrived"]


def run_late(folder, late, *args, env=None):
    return run_launcher("--print_config", "false", "--nproc_per_node", 3, *args, LATE, folder, late, env=env,
                        timeout=180)


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


def test_a_rank_0_3_s_late_finds_every_rank_waiting(tmp_path):
    assert_together(tmp_path, 3)


@pytest.mark.slow
def test_a_rank_0_6_s_late_finds_every_rank_waiting(tmp_path):
    assert_together(tmp_path, 6)


def test_a_restart_gets_a_fresh_store(tmp_path):
    r = run_late(tmp_path, 0, "--agent_store", "on", "--max_restarts", 1, env={"FAIL_FIRST": "1"})
    assert r.returncode == 0, r.stderr
    assert "restart" in r.stderr
    assert len(late_records(tmp_path, 0)) == len(late_records(tmp_path, 1)) == 3


def test_opt_out_leaves_the_store_to_rank_0(tmp_path):
    r = run_late(tmp_path, 0, "--agent_store", "off")
    assert r.returncode == 0, r.stderr
    assert {rec["agent_store"] for rec in late_records(tmp_path).values()} == {"False"}


def store_hosts_of(launcher_pid):
    found = []
    for child in psutil.Process(launcher_pid).children():
        try:
            if any(arg.endswith("store_host.py") for arg in child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def test_the_store_host_is_gone_after_the_job_and_after_kill_9_of_the_launcher(tmp_path):
    for how in ("end", "kill -9"):
        folder = tmp_path / how.replace(" ", "")
        folder.mkdir()
        launcher = start_launcher("--agent_store", "on", "--nproc_per_node", 2, "--shutdown_timeout", 1, PROBE,
                                  "--dump", folder, "--sleep", 2 if how == "end" else 120)
        try:
            read_dumps(folder, 2)
            hosts = store_hosts_of(launcher.pid)
            assert len(hosts) == 1
            if how == "kill -9":
                os.kill(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=60)
        finally:
            launcher.kill()
        assert how != "end" or launcher.returncode == 0
        assert_all_gone(hosts, timeout=10)


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


def test_two_nodes_the_store_host_on_node_0_only(tmp_path):
    nodes = ["127.0.0.1", "127.0.0.2"]
    port = free_ports(3)
    procs = [subprocess.Popen(launcher_cmd("--agent_store", "on", "--cluster_node_ips", ",".join(nodes), "--node_ip", ip,
                                           "--started_port", port, "--nproc_per_node", 2, "--print_config", "false",
                                           LATE, tmp_path, 2),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for ip in reversed(nodes)]
    wait_for(lambda: store_hosts_of(procs[1].pid) or procs[1].poll() is not None, timeout=60, what="node 0's store host")
    assert store_hosts_of(procs[0].pid) == []
    for code, out, err in finish_all(procs, timeout=180):
        assert code == 0, err
    records = late_records(tmp_path)
    assert sorted(records) == [0, 1, 2, 3]
    assert {rec["agent_store"] for rec in records.values()} == {"True"}


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
