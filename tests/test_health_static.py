"""A fixed job's nodes checked before any worker starts, on real launchers on loopback: a node whose training script
differs from node 0's refuses the job on every node (exit 2, one sentence naming the node, the check and the
reason), and no worker starts anywhere, as does a node whose clock stands a minute off; nodes that pass start as
before."""

import os
import re
import subprocess

from conftest import REPO, finish_all, free_ports, launcher_cmd, run_launcher

NODES = ["127.0.0.1", "127.0.0.2"]
TRAIN = "import os, sys\nopen(os.path.join(sys.argv[1], 'started.' + os.environ['RANK']), 'w').close()\n"


def start_node(folder, node_ip, port, out, first_path=None):
    """One launcher of the two-node job, run in ``folder`` (its own copy of train.py, by the same relative name);
    ``first_path``: a folder put first on its PYTHONPATH (a sitecustomize of its own)."""
    path = [str(first_path)] if first_path else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [*path, str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = launcher_cmd("--cluster_node_ips", ",".join(NODES), "--node_ip", node_ip, "--started_port", port,
                       "--nproc_per_node", 1, "--log_dir", out / f"log-{node_ip}", "--shutdown_timeout", 2,
                       "--join_timeout", 60, "train.py", out)
    return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def two_nodes(tmp_path, second_script, second_path=None):
    first, second = tmp_path / "node0", tmp_path / "node1"
    for folder, text in ((first, TRAIN), (second, second_script)):
        folder.mkdir()
        (folder / "train.py").write_text(text)
    port = free_ports(2) + 1  # and the one below, node 0's control port
    procs = [start_node(second, NODES[1], port, tmp_path, second_path), start_node(first, NODES[0], port, tmp_path)]
    return finish_all(procs)


def test_a_node_whose_script_differs_refuses_the_job_on_every_node_before_any_worker_starts(tmp_path):
    results = two_nodes(tmp_path, TRAIN + "# another copy of the code\n")
    sentence = ("node 1 (127.0.0.2) failed the health check script: its training script differs from node 0's "
                "(another copy of the code); mend the node, or skip the check with --skip_health_checks script")
    for code, _, err in results:
        assert code == 2, err
        errors = [line for line in err.splitlines() if "error" in line]
        assert errors == [f"launcher: error: {sentence}"], err
        assert "Traceback" not in err
    assert not list(tmp_path.glob("started.*"))  # no worker started anywhere
    shown = run_launcher("status", tmp_path / "log-127.0.0.1")  # node 0 judged them: each node's last check
    assert ("health of node 1: failed script: its training script differs from node 0's (another copy of the code)"
            in shown.stdout), shown.stdout + shown.stderr
    assert "health of node 0" not in shown.stdout  # it passed: the pages and /metrics say so


def test_nodes_that_pass_their_checks_start_their_workers(tmp_path):
    results = two_nodes(tmp_path, TRAIN)
    for code, _, err in results:
        assert code == 0, err
    assert sorted(p.name for p in tmp_path.glob("started.*")) == ["started.0", "started.1"]


def test_a_hello_whose_checkup_is_not_one_is_a_refusal_reason_on_node_0_s_socket():
    """Node 0's hub and a node's spoke on loopback, the spoke's hello carrying junk where its checkup goes."""
    import selectors
    import time

    from launcher.nodes.static.hub import Hub
    from launcher.nodes.static.spoke import Spoke
    from launcher.nodes.transport.messages import Identity
    from launcher.plan import admission
    from launcher.plan.health import Facts, HealthSettings

    node0 = Facts("3.11", "1.0", None, "x", time.time())
    for junk in ({"facts": {"python": "3", "launcher": "1", "clock": 1e300}, "findings": []}, [["shm"]], "checkup",
                 {"facts": {"python": {"a": 1}}}):
        port = free_ports(1)
        identity = Identity("job", ("127.0.0.1", "127.0.0.2"), (port + 1,), "train.py")
        hub = Hub(identity, "127.0.0.1", port, 3.0, 10.0, None,
                  judge=lambda node, offered: admission.judge(f"node {node}", offered, node0, time.time(),
                                                             HealthSettings()))
        spoke = Spoke(identity, 1, "127.0.0.1", port, 3.0, 10.0, None, checkup=lambda: junk)
        deadline = time.monotonic() + 30
        try:
            while 1 not in hub.verdicts and time.monotonic() < deadline:
                for end in (hub, spoke):
                    end.tick(time.monotonic())
                    with selectors.DefaultSelector() as selector:
                        for fd, events in end.registrations().items():
                            selector.register(fd, events)
                        for key, mask in selector.select(0.01):
                            end.ready(key.fd, mask, time.monotonic())
            assert hub.verdicts[1].refusal == ("node 1 sent a health checkup that is not one (a field missing or of a "
                                               "wrong type): run the same launcher version on every node"), junk
        finally:
            hub.close()
            spoke.close()


def test_a_node_whose_clock_stands_a_minute_off_refuses_the_job_on_every_node(tmp_path):
    """Node 1's wall clock a minute ahead: a faked source (its interpreter's time.time, shifted by a sitecustomize on
    its PYTHONPATH: a time namespace moves only the monotonic clocks), read by its launcher as it sends its hello."""
    fake = tmp_path / "fake_clock"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text("import time\n_real = time.time\ntime.time = lambda: _real() + 60.0\n")
    results = two_nodes(tmp_path, TRAIN, fake)
    for code, _, err in results:
        assert code == 2, err
        errors = [line for line in err.splitlines() if "error" in line]
        assert len(errors) == 1 and re.match(r"launcher: error: node 1 \(127\.0\.0\.2\) failed the health check clock: "
                                             r"its clock stands \+(5\d|60)\.\d s from node 0's \(the bound is 5 s\)",
                                             errors[0]), err
    assert not list(tmp_path.glob("started.*"))
