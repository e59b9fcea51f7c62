"""--monitor_port on real jobs: /metrics (parsed with prometheus_client's own parser), /healthz, /status.json (the
document of ``launcher status --json``), /view.json and /events; and what a client can do to it: never read, open
1,000 connections, send a request of 1 GB. Every wait is for an event, bounded."""

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import REPO, WORKERS, free_ports, launcher_cmd, run_launcher, start_launcher, wait_for

pytest.importorskip("prometheus_client")
REPORTER = WORKERS / "reporter.py"
WAIT = 60


def get(url, timeout=10):
    """(status, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Job:
    """A launcher with --monitor_port 0 and two reporting workers; its monitor's URL, from its console."""

    def __init__(self, tmp_path, *args):
        self.folder = tmp_path
        self.proc = start_launcher("--nproc_per_node", 2, "--monitor_port", 0, "--log_dir", tmp_path / "logs", *args,
                                   REPORTER, tmp_path)
        self.err = b""
        line = self.proc.stderr.readline()
        while line and "monitor: http://" not in line:
            line = self.proc.stderr.readline()
        assert line, "the launcher printed no monitor URL"
        self.url = line.split("monitor: ", 1)[1].split(" ", 1)[0]

    def view(self):
        code, body = get(self.url + "view.json")
        return json.loads(body) if code == 200 else None

    def end(self):
        (self.folder / "stop").touch()
        self.proc.terminate()
        try:
            return self.proc.communicate(timeout=WAIT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def job(tmp_path):
    made = Job(tmp_path)
    yield made
    if made.proc.poll() is None:
        made.proc.kill()
        made.proc.communicate()


def test_metrics_health_and_status_of_a_running_job(job):
    from prometheus_client.parser import text_string_to_metric_families

    wait_for(lambda: (v := job.view()) and all(w["step"] is not None and w["step"] >= 3 for w in v["workers"]),
             WAIT, "both workers' reports")
    code, text = get(job.url + "metrics")
    assert code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text.decode()) for s in family.samples}
    assert samples[("launcher_workers", (("state", "running"),))] == 2
    assert samples[("launcher_worker_restarts_total", ())] == 0 and samples[("launcher_nodes", ())] == 1
    assert samples[("launcher_membership_changes_total", (("cause", "lost"),))] == 0
    assert samples[("launcher_worker_step", (("rank", "1"),))] >= 3
    assert samples[("launcher_worker_step_seconds", (("rank", "0"),))] > 0
    assert samples[("launcher_log_bytes_total", (("rank", "0"),))] > 0
    assert get(job.url + "healthz") == (200, b"ok: 2 worker(s) running\n")
    code, body = get(job.url + "status.json")
    status = json.loads(body)
    assert code == 200 and [p["pid"] for p in status["nodes"][0]["processes"]] == [w["pid"] for w in job.view()["workers"]]
    written = json.loads(subprocess.run(launcher_cmd("status", job.folder / "logs", "--json"), capture_output=True,
                                        text=True, cwd=REPO, timeout=30).stdout)
    assert set(written["nodes"][0]) == set(status["nodes"][0])  # the same document
    assert get(job.url + "nope")[0] == 404
    job.end()


def test_a_line_a_worker_writes_reaches_the_view(job):
    wait_for(lambda: (v := job.view()) and "step 3" in v["workers"][0]["last_line"], WAIT, "rank 0's line 'step 3'")
    code, page = get(job.url)
    assert code == 200 and b"EventSource" in page and b"http" not in page.split(b"<script>")[0].lower().replace(
        b'http-equiv', b'')  # no asset from elsewhere
    job.end()


def test_no_client_can_stall_the_launcher_or_its_logs(job):
    """A stream never read, 1,000 connections, a request of 1 GB: the monitor still answers, the workers' logs grow."""
    host, port = job.url[len("http://"):-1].rsplit(":", 1)
    idle = socket.create_connection((host, int(port)))
    idle.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
    many = []
    for _ in range(1000):
        try:
            many.append(socket.create_connection((host, int(port)), timeout=5))
        except OSError:
            break
    big = socket.create_connection((host, int(port)))
    big.settimeout(10)
    sent = 0
    try:
        big.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
        chunk = b"x" * (1 << 20)
        while sent < 1 << 30:
            big.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the monitor answered and closed: the rest is never read
    assert sent < 1 << 30
    for s in many:
        s.close()
    before = (job.folder / "logs" / "workerlog.0").stat().st_size
    wait_for(lambda: get(job.url + "healthz")[0] == 200, WAIT, "the monitor's answer after the attacks")
    wait_for(lambda: (job.folder / "logs" / "workerlog.0").stat().st_size > before + 100, WAIT, "rank 0's log growing")
    idle.close()
    big.close()
    job.end()


def test_it_listens_on_the_node_s_address_only(tmp_path):
    made = Job(tmp_path)
    try:
        port = int(made.url.rsplit(":", 1)[1].strip("/"))
        assert made.url.startswith("http://127.0.0.1:")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", port), timeout=5)
    finally:
        made.end()


def test_the_port_from_the_environment_and_a_port_in_use(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    r = run_launcher("--nproc_per_node", 1, REPORTER, tmp_path, env={"LAUNCHER_MONITOR_PORT": str(port)})
    busy.close()
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"--monitor_port {port} cannot listen on 127.0.0.1 (Address already in use); give a free port" in r.stderr
    assert not (tmp_path / "fd.0").exists()  # no worker started


@pytest.mark.parametrize("value", ["70000", "-1", "http"])
def test_a_bad_port_exits_2(tmp_path, value):
    r = run_launcher("--monitor_port", value, "--nproc_per_node", 1, REPORTER, tmp_path)
    assert r.returncode == 2 and "--monitor_port" in r.stderr and "Traceback" not in r.stderr


def test_without_prometheus_client_it_says_what_to_install(tmp_path):
    shadow = tmp_path / "shadow" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed')\n")
    r = run_launcher("--monitor_port", 0, "--nproc_per_node", 1, REPORTER, tmp_path,
                     env={"PYTHONPATH": f"{shadow.parent}:{REPO}"})
    assert r.returncode == 2 and r.stderr.strip() == (
        "launcher: error: --monitor_port needs prometheus_client: pip install 'launcher[monitor]' "
        "(or pip install prometheus_client).")


def test_node_0_of_a_c10d_job_tells_each_member_s_heartbeat_age(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from conftest import free_ports, listening

    port = free_ports(6)
    line = ("--nnodes", "1:2", "--nproc-per-node", 1, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "monitored", "--rdzv-conf", "last_call_timeout=60")
    node0 = Job.__new__(Job)
    node0.folder, node0.err = tmp_path, b""
    node0.proc = start_launcher(*line, "--monitor_port", 0, REPORTER, tmp_path)
    node1 = None
    try:
        wait_for(lambda: listening("127.0.0.1", port), WAIT, "node 0 on the endpoint")
        node1 = start_launcher(*line, REPORTER, tmp_path)
        out = node0.proc.stderr.readline()
        while out and "monitor: http://" not in out:
            out = node0.proc.stderr.readline()
        url = out.split("monitor: ", 1)[1].split(" ", 1)[0]

        def ages():
            code, text = get(url + "metrics")
            return [s for f in text_string_to_metric_families(text.decode()) for s in f.samples
                    if s.name == "launcher_node_heartbeat_age_seconds"] if code == 200 else []
        wait_for(lambda: ages(), WAIT, "node 1's heartbeat age on node 0")
        (sample,) = ages()
        assert sample.labels["node"] and 0 <= sample.value < 60
    finally:
        (tmp_path / "stop").touch()
        for proc in (node0.proc, node1):
            if proc is not None:
                try:
                    proc.communicate(timeout=WAIT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()


def test_node_0_of_a_fixed_job_tells_node_1_s_heartbeat_age_and_shows_its_ranks(tmp_path):
    """Two launchers (127.0.0.1, 127.0.0.2) with the same --monitor_port: node 0's /metrics has node 1's heartbeat
    age, and its /job.json node 1's rows (fetched by node 0's launcher from node 1's monitor)."""
    from prometheus_client.parser import text_string_to_metric_families

    from conftest import listening

    port, monitor = free_ports(3), free_ports(1)
    procs = [start_launcher("--cluster_node_ips", "127.0.0.1,127.0.0.2", "--node_ip", ip, "--started_port", port,
                            "--nproc_per_node", 2, "--monitor_port", monitor, REPORTER, tmp_path)
             for ip in ("127.0.0.2", "127.0.0.1")]
    url = f"http://127.0.0.1:{monitor}/"
    try:
        wait_for(lambda: listening("127.0.0.1", monitor), WAIT, "node 0's monitor")

        def ages():
            code, text = get(url + "metrics")
            return {s.labels["node"]: s.value for f in text_string_to_metric_families(text.decode()) for s in f.samples
                    if s.name == "launcher_node_heartbeat_age_seconds"} if code == 200 else {}
        wait_for(lambda: "1" in ages(), WAIT, "node 1's heartbeat age on node 0")
        assert set(ages()) == {"1"} and 0 <= ages()["1"] < 60

        def peer_ranks():
            code, body = get(url + "job.json")
            peers = json.loads(body).get("peers", []) if code == 200 else []
            return [w["rank"] for p in peers for w in p["workers"]]
        wait_for(lambda: peer_ranks() == [2, 3], WAIT, "node 1's ranks in node 0's /job.json")
    finally:
        (tmp_path / "stop").touch()
        for proc in procs:
            try:
                proc.communicate(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
