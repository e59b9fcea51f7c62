"""The benchmark (bench/) still works.

One ``--tiny`` pass of bench/run.py, both launchers, every workload (the parameter-server ones in
their own pass): no timing is asserted, only what the benchmark checks on the way (exit codes, no log
line lost or cut, ranks in sync, no process outliving its launcher, a figure that is only a bound said
so in a footnote). Those passes, and bench/late_rank0.py's run, take minutes of torch start-ups: they
are marked ``bench``, out of the quick loop (CI runs them: ``pytest -m bench``); the quick loop runs the
harness end to end on its two cheapest workloads. Then fast tests of the report (goals, rows, the
table) and of the harness's port reservations, which start no process.
"""

import errno
import json
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import harness  # noqa: E402
import report  # noqa: E402
import workloads  # noqa: E402
from report import Compare, Goal, Metric, Row, Target  # noqa: E402

TITLES = ("1. start-up", "2. 2-worker job", "3. teardown", "4. idle", "5. log volume",
          "6. scale", "7. planning", "8a. training", "8b. training", "9. cross-node teardown",
          "10. restart round trip", "11a. CTR", "11b. dense MLP", "11c. CTR as 11a")
TINY_CROSS_BOUND_S = workloads.MODES["tiny"].cross_bound_s
PS_TITLES = ("11a.", "11b.", "11c.")  # ours needs the launcher's parameter-server mode
HAS_PS = harness.ours_has_option("--server_num")


# ---------------------------------------------------------------- one --tiny run


PS_WORKLOADS = [w.name for w in workloads.WORKLOADS if w.name.startswith("ps-")]


def tiny_run(tmp_path_factory, names):
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    done = subprocess.run([sys.executable, "bench/run.py", "--tiny", "--only", ",".join(names), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.fixture(scope="module")
def tiny_quick(tmp_path_factory):
    """The quick loop's run: the two cheapest workloads (start-up, teardown: 10 s), both launchers."""
    return tiny_run(tmp_path_factory, ["startup", "teardown"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Every workload but the parameter-server ones (a minute of torch start-ups: their own, slow, run)."""
    return tiny_run(tmp_path_factory, [w.name for w in workloads.WORKLOADS if w.name not in PS_WORKLOADS])


@pytest.fixture(scope="module")
def tiny_ps(tmp_path_factory):
    return tiny_run(tmp_path_factory, PS_WORKLOADS)


def row(result, workload, metric):
    (found,) = [r for r in result["rows"] if r["workload"].startswith(workload) and r["metric"].startswith(metric)]
    return found


def test_a_tiny_run_of_two_workloads_measures_both_sides_and_leaves_nothing(tiny_quick):
    """The harness end to end, in the quick loop (the full run's tests below say what each workload's rows hold)."""
    stdout, result = tiny_quick
    assert stdout.splitlines()[2].split() == ["workload", "metric", "ours", "torchrun", "ratio", "goal", "met?"]
    assert {r["workload"].split(" ")[0] for r in result["rows"]} == {"1.", "3."}
    assert result["errors"] == [] and result["leftovers"] == [] and result["notes"] == []
    for r in result["rows"]:
        assert r["torchrun"] is not None and r["ours"] is not None, r
    teardown = row(result, "3.", "launcher exit code")
    assert teardown["ours"] == 7 and teardown["met"] is True


@pytest.mark.bench
def test_tiny_run_has_every_workload_in_the_table(tiny):
    stdout, result = tiny
    header = stdout.splitlines()[2].split()
    assert header == ["workload", "metric", "ours", "torchrun", "ratio", "goal", "met?"]
    titles = [t for t in TITLES if not t.startswith(PS_TITLES)]
    for title in titles:
        assert title in stdout
    assert {r["workload"].split(" ")[0] for r in result["rows"]} == {t.split(" ")[0] for t in titles}


@pytest.mark.bench
def test_tiny_run_measures_both_sides_of_every_row(tiny):
    _, result = tiny
    assert result["errors"] == [], result["errors"]
    for r in result["rows"]:
        assert r["torchrun"] is not None and r["ours"] is not None, r
    assert "error [" not in tiny[0]


@pytest.mark.bench
def test_tiny_parameter_server_run_has_its_three_workloads_measured(tiny_ps):
    stdout, result = tiny_ps
    for title in TITLES:
        assert (title in stdout) == title.startswith(PS_TITLES)
    unmeasured = [] if HAS_PS else [r for r in result["rows"] if r["workload"].startswith(PS_TITLES)]
    expected = [f"ours, ps-{kind}: python -m launcher has no --server_num (parameter-server mode): not measured"
                for kind in ("sparse", "dense", "ddp-sparse") if not HAS_PS]
    assert result["errors"] == expected, result["errors"]
    for r in result["rows"]:
        assert r["torchrun"] is not None and (r["ours"] is None) == (r in unmeasured), r


@pytest.mark.bench
@pytest.mark.parametrize("title", PS_TITLES)
def test_tiny_run_parameter_server_trains_the_same_model(tiny_ps, title):
    _, result = tiny_ps
    sides = ("ours", "torchrun") if HAS_PS else ("torchrun",)  # ours: 2 trainers + 2 servers, sync
    for side in sides:
        assert row(result, title, "trainer steps/s")[side] > 0
        peak, timed = row(result, title, "trainer peak resident memory")[side], row(result, title, "the same")[side]
        assert 50 < timed <= peak < 4096
    if HAS_PS:  # the same initial weights and batches, 3 + 2 steps of SGD: the same loss
        loss = row(result, title, "loss at the last step")
        assert loss["ours"] == pytest.approx(loss["torchrun"], rel=1e-3)


@pytest.mark.bench
def test_tiny_run_remarks_only_on_a_figure_that_is_a_bound(tiny):
    stdout, result = tiny
    for r in result["rows"]:
        assert "ours" not in r["remarks"], r  # ours never runs into a bound
        for side, number in r["remarks"].items():
            assert r["workload"].startswith("9.")
            remark = result["remarks"][0]
            assert remark.startswith(f"{side}, cross-node: node 0") and "bound" in remark
            assert f"  [{number}] {remark}" in stdout


@pytest.mark.bench
def test_tiny_run_cross_node_teardown(tiny):
    _, result = tiny
    seconds = row(result, "9.", "worker exit on node 1")
    assert 0 < seconds["ours"] < TINY_CROSS_BOUND_S
    assert 0 < seconds["torchrun"] <= TINY_CROSS_BOUND_S
    node0, node1 = row(result, "9.", "node 0 launcher exit code"), row(result, "9.", "node 1 launcher exit code")
    assert (node0["ours"], node1["ours"]) == (7, 7) and node0["met"] is True and node1["met"] is True
    assert node1["torchrun"] not in (0, 7)  # torchrun reports 1 whatever the worker's code
    if seconds["torchrun"] == TINY_CROSS_BOUND_S:  # its node 0 never stopped by itself: said so
        assert node0["torchrun"] == "running"
        assert seconds["remarks"] == node0["remarks"] == {"torchrun": 1}
    else:
        assert node0["torchrun"] not in (0, "running") and seconds["remarks"] == {}


@pytest.mark.bench
def test_tiny_run_restart_round_trip(tiny):
    _, result = tiny
    running = row(result, "10.", "failure -> attempt 2 all running")
    created = row(result, "10.", "failure -> attempt 2 all created")
    assert 0 < created["torchrun"] <= running["torchrun"] < 60
    # ours runs attempt 2 in spare interpreters started during attempt 1: created before the failure
    assert created["ours"] < 0 < running["ours"] < 60
    code = row(result, "10.", "launcher exit code")
    assert (code["ours"], code["torchrun"]) == (0, 0) and code["met"] is True


@pytest.mark.bench
def test_tiny_run_loses_no_log_line(tiny):
    _, result = tiny
    lost = row(result, "5.", "lines lost")
    assert (lost["ours"], lost["torchrun"]) == (0, 0)
    assert lost["met"] is True
    floor = row(result, "5.", "wall time / direct-write floor")  # against the writers run with no launcher
    assert floor["ours"] > 0 and floor["torchrun"] > 0 and floor["ratio"] is None


@pytest.mark.bench
def test_tiny_run_exit_codes(tiny):
    _, result = tiny
    teardown = row(result, "3.", "launcher exit code")
    assert teardown["ours"] == 7 and teardown["met"] is True
    assert teardown["torchrun"] not in (0, 7)  # torchrun reports 1 whatever the worker's code
    assert row(result, "6.", "launcher exit code")["ours"] == 143  # 128 + SIGTERM


@pytest.mark.bench
def test_tiny_run_leaves_no_process_behind(tiny):
    stdout, result = tiny
    assert result["leftovers"] == [] and result["notes"] == []
    assert "note:" not in stdout


@pytest.mark.bench
def test_late_rank0_bench_runs_two_nodes_with_each_launcher():
    """bench/late_rank0.py, its smallest run: 2 nodes on loopback x 1 worker, rank 0 not late."""
    import re

    done = subprocess.run([sys.executable, "bench/late_rank0.py", "--late", "0", "--nproc", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("load average ") and lines[0].endswith("2 nodes x 1 workers")
    assert lines[1].split() == ["rank", "0", "late", "ours", "(auto:", "agent", "store)", "ours",
                                "(--agent_store", "off)", "torchrun"]
    assert re.fullmatch(r" +0 s( +\d+\.\d{3} s){3}", lines[2]), lines


def test_plot_without_matplotlib_is_a_clear_error(tmp_path):
    code = ("import sys, builtins; real = builtins.__import__\n"
            "def fake(name, *a, **k):\n"
            "    if name.startswith('matplotlib'): raise ImportError(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = fake\n"
            "sys.argv = ['bench/run.py', '--plot', sys.argv[1]]\n"
            "import runpy; runpy.run_path('bench/run.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.png")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "matplotlib" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------- goals


@pytest.mark.parametrize("goal, text", [
    (report.ratio_at_most(0.15), "<= 0.15"),
    (report.ratio_at_least(1.0), ">= 1"),
    (report.at_most_torchrun(), "<= torchrun"),
    (report.ours_equal(7), "= 7"),
])
def test_goal_text(goal, text):
    assert goal.text() == text


@pytest.mark.parametrize("goal, ours, torchrun, met", [
    (report.ratio_at_most(0.5), 1.0, 4.0, True),
    (report.ratio_at_most(0.5), 2.0, 4.0, True),  # the limit itself meets it
    (report.ratio_at_most(0.5), 3.0, 4.0, False),
    (report.ratio_at_most(0.5), 0.0, 0.0, False),  # no ratio: not met
    (report.ratio_at_least(1.0), 41.0, 40.0, True),
    (report.ratio_at_least(1.0), 39.0, 40.0, False),
    (report.at_most_torchrun(), 0.0, 0.0, True),
    (report.at_most_torchrun(), 0.01, 0.0, False),
    (report.ours_equal(7), 7, 1, True),
    (report.ours_equal(7), 1, 7, False),
    (report.ours_equal(7), "1/7", 1, False),  # runs disagreed
    (report.ours_equal(7), 7, "running", True),  # torchrun had not exited: a word, not a code
    (report.ours_equal(0), 0, 5, True),
    (report.ours_equal(7), None, 1, None),  # a side has no figure
    (report.ratio_at_most(0.5), 1.0, None, None),
])
def test_goal_met(goal, ours, torchrun, met):
    assert goal.met(ours, torchrun) is met


def test_goal_marks_on_the_ratio_axis():
    assert report.ratio_at_most(0.25).ratio_mark() == 0.25
    assert report.at_most_torchrun().ratio_mark() == 1.0
    assert report.ours_equal(7).ratio_mark() is None


# ---------------------------------------------------------------- rows and table


@dataclass
class Result:
    seconds: float
    exit_code: int


METRICS = (Metric("seconds", "wall time (s)", report.ratio_at_most(0.5)),
           Metric("exit_code", "exit code", report.ours_equal(7), summary=report.same_codes, ratio=False))


def test_rows_are_medians_ratios_and_goals():
    results = {"ours": [Result(1.0, 7), Result(3.0, 7), Result(2.0, 7)], "torchrun": [Result(8.0, 1)]}
    seconds, code = report.rows_of("3. teardown", METRICS, results)
    assert (seconds.ours, seconds.torchrun, seconds.ratio, seconds.met) == (2.0, 8.0, 0.25, True)
    assert seconds.samples == {"ours": [1.0, 3.0, 2.0], "torchrun": [8.0]}
    assert (code.ours, code.torchrun, code.ratio, code.met) == (7, 1, None, True)


def test_same_codes_of_runs_that_disagree_also_on_kind():
    assert report.same_codes([7, 7]) == 7
    assert report.same_codes([7, 1, 7]) == "1/7"
    assert report.same_codes([1, "running", 1]) == "1/running"
    assert report.same_codes([130, 7]) == "7/130"


def test_rows_of_a_side_without_results_have_no_figure_and_no_verdict():
    seconds, code = report.rows_of("3. teardown", METRICS, {"ours": [Result(1.0, 1), Result(1.0, 7)], "torchrun": []})
    assert (seconds.torchrun, seconds.ratio, seconds.met) == (None, None, None)
    assert code.ours == "1/7" and code.met is None


def test_table_format():
    rows = [
        Row("1. start-up: --help", "wall time (s)", 0.0421, 1.03, 0.0408, report.ratio_at_most(0.1), True, {}),
        Row("3. teardown", "seconds", 0.5, 0.4, 1.25, report.ratio_at_most(0.15), False, {}),
        Row("3. teardown", "launcher exit code", 7, None, None, report.ours_equal(7), None, {},
            errors={"torchrun": 1}),
        Row("7. planning", "env (KiB)", 122.0, 0.000339, 360.0, None, None, {}),
        Row("9. cross-node", "seconds", 0.1, 120, 0.000833, report.ratio_at_most(0.1), True, {},
            remarks={"torchrun": 2}),
    ]
    assert report.table(rows, ["torchrun, teardown: exit code 1", "torchrun, cross-node: a bound"]) == "\n".join([
        "workload             metric              ours    torchrun   ratio    goal     met?",
        "-------------------  ------------------  ------  ---------  -------  -------  ----",
        "1. start-up: --help  wall time (s)       0.0421  1.03       0.0408   <= 0.1   yes",
        "3. teardown          seconds             0.5     0.4        1.25     <= 0.15  NO",
        "                     launcher exit code  7       error [1]  -        = 7      -",
        "7. planning          env (KiB)           122     3.4e-04    360               -",
        "9. cross-node        seconds             0.1     120 [2]    8.3e-04  <= 0.1   yes",
        "  [1] torchrun, teardown: exit code 1",
        "  [2] torchrun, cross-node: a bound",
    ])


def test_json_rows_carry_the_goal_as_text_and_as_data(tmp_path):
    rows = report.rows_of("3. teardown", METRICS, {"ours": [Result(1.0, 7)], "torchrun": [Result(4.0, 1)]})
    report.write_json(str(tmp_path / "r.json"), {"mode": "tiny"}, rows)
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["mode"] == "tiny"
    assert written["rows"][0]["goal"] == "<= 0.5"
    assert written["rows"][0]["goal_spec"] == {"compare": "<=", "target": "ratio", "threshold": 0.5}
    assert written["rows"][1]["met"] is True
    assert Goal(Compare(written["rows"][1]["goal_spec"]["compare"]), Target.OURS, 7).met(7, 1)


# ---------------------------------------------------------------- port reservations


def test_a_reserved_port_is_refused_to_plain_binds_but_open_to_a_store():
    with harness.PortReservations() as ports:
        port = ports.reserve()
        for host in ("127.0.0.1", "0.0.0.0"):
            with socket.socket() as plain, pytest.raises(OSError) as refused:
                plain.bind((host, port))
            assert refused.value.errno == errno.EADDRINUSE
        with socket.socket() as store:  # what torch's TCPStore does
            store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            store.bind(("0.0.0.0", port))
            store.listen()
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", port))  # released once the run is over


def test_a_reserved_block_is_consecutive_and_held():
    with harness.PortReservations() as ports:
        first = ports.reserve_block(3)
        for port in range(first, first + 3):
            with socket.socket() as plain, pytest.raises(OSError):
                plain.bind(("127.0.0.2", port))


def test_two_nodes_use_one_set_of_reserved_ports():
    job = harness.Job(2, "fail.py", max_restarts=1)
    with harness.PortReservations() as ports:
        ours = harness.Ours().node_commands(job, 2, ports)
        started = int(ours[0][ours[0].index("--started_port") + 1])
        for port in (started - 1, started, started + 1):  # node 0's control port, the worker ports
            with socket.socket() as plain, pytest.raises(OSError):
                plain.bind(("127.0.0.1", port))
        theirs = harness.Torchrun().node_commands(job, 2, ports)
        port = int(theirs[0][theirs[0].index("--master-port") + 1])
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert [argv[argv.index("--node_ip") + 1] for argv in ours] == ["127.0.0.1", "127.0.0.2"]
    assert all(argv[argv.index("--cluster_node_ips") + 1] == "127.0.0.1,127.0.0.2" for argv in ours)
    assert all(argv[argv.index("--started_port") + 1] == str(started) for argv in ours)
    assert all(argv[argv.index("--max_restarts") + 1] == "1" for argv in ours)
    assert [argv[argv.index("--node-rank") + 1] for argv in theirs] == ["0", "1"]
    assert all(argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--master-port") + 1] == str(port)
               and argv[argv.index("--max-restarts") + 1] == "1" for argv in theirs)


def test_a_parameter_server_job_is_ours_only():
    job = harness.Job(2, "ctr.py", servers=2)
    with harness.PortReservations() as ports:
        assert harness.Ours().job_command(job, ports)[2:7] == ["launcher", "--server_num", "2", "--worker_num", "2"]
        with pytest.raises(harness.BenchError, match="parameter servers"):
            harness.Torchrun().job_command(job, ports)


def test_torchrun_gets_a_reserved_master_port(tmp_path):
    with harness.PortReservations() as ports:
        argv = harness.Torchrun().job_command(harness.Job(2, "allreduce.py"), ports)
        port = int(argv[argv.index("--master-port") + 1])
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert harness.Ours().job_command(harness.Job(2, "allreduce.py"), ports)[2:5] == ["launcher", "--nproc_per_node", "2"]


def test_follow_idle_measures_a_small_log_dir(tmp_path):
    """bench/follow_idle.py, small: every figure measured, every line shown once, the new log too."""
    out = tmp_path / "follow.json"
    r = subprocess.run([sys.executable, "bench/follow_idle.py", "--files", "50", "--idle", "0.5", "--probes", "3",
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert "idle CPU (fraction of a core)" in r.stdout and result["files"] == 50
    assert result["new_file_s"] is not None and result["truncated_s"] is not None
    assert result["lines_shown_twice_or_unexpected"] == [] and result["stderr"] == ""


def test_monitor_cost_measures_both_sides_and_every_line(tmp_path):
    """bench/monitor_cost.py, small: the launcher's CPU and RSS without and with --monitor_port, each probe line seen."""
    pytest.importorskip("prometheus_client")
    out = tmp_path / "monitor.json"
    r = subprocess.run([sys.executable, "bench/monitor_cost.py", "--idle", "0.5", "--probes", "2", "--scrape", "0.2",
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert set(result) == {"off", "on"} and all(result[s]["rss_mib"] > 0 for s in result)
    assert len(result["on"]["line_seconds"]) == 2 and max(result["on"]["line_seconds"]) < float("inf")
