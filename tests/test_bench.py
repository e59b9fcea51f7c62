"""The benchmark (bench/) still works.

One ``--tiny`` pass of bench/run.py, both launchers, every workload: no timing is asserted, only
what the benchmark checks on the way (exit codes, no log line lost or cut, ranks in sync, no
process outliving its launcher). Then fast tests of the report (goals, rows, the table) and of
the harness's port reservations, which start no process.
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
from report import Compare, Goal, Metric, Row, Target  # noqa: E402

TITLES = ("1. start-up", "2. 2-worker job", "3. teardown", "4. idle", "5. log volume",
          "6. scale", "7. planning", "8a. training", "8b. training")


# ---------------------------------------------------------------- one --tiny run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    done = subprocess.run([sys.executable, "bench/run.py", "--tiny", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def row(result, workload, metric):
    (found,) = [r for r in result["rows"] if r["workload"].startswith(workload) and r["metric"].startswith(metric)]
    return found


def test_tiny_run_has_every_workload_in_the_table(tiny):
    stdout, result = tiny
    header = stdout.splitlines()[2].split()
    assert header == ["workload", "metric", "ours", "torchrun", "ratio", "goal", "met?"]
    for title in TITLES:
        assert title in stdout
    assert {r["workload"].split(" ")[0] for r in result["rows"]} == {t.split(" ")[0] for t in TITLES}


def test_tiny_run_measures_both_sides_of_every_row(tiny):
    _, result = tiny
    assert result["errors"] == [], result["errors"]
    assert all(r["ours"] is not None and r["torchrun"] is not None for r in result["rows"])
    assert "error [" not in tiny[0]


def test_tiny_run_loses_no_log_line(tiny):
    _, result = tiny
    lost = row(result, "5.", "lines lost")
    assert (lost["ours"], lost["torchrun"]) == (0, 0)
    assert lost["met"] is True


def test_tiny_run_exit_codes(tiny):
    _, result = tiny
    teardown = row(result, "3.", "launcher exit code")
    assert teardown["ours"] == 7 and teardown["met"] is True
    assert teardown["torchrun"] not in (0, 7)  # torchrun reports 1 whatever the worker's code
    assert row(result, "6.", "launcher exit code")["ours"] == 143  # 128 + SIGTERM


def test_tiny_run_leaves_no_process_behind(tiny):
    stdout, result = tiny
    assert result["leftovers"] == [] and result["notes"] == []
    assert "note:" not in stdout


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
    ]
    assert report.table(rows, ["torchrun, teardown: exit code 1"]) == "\n".join([
        "workload             metric              ours    torchrun   ratio   goal     met?",
        "-------------------  ------------------  ------  ---------  ------  -------  ----",
        "1. start-up: --help  wall time (s)       0.0421  1.03       0.0408  <= 0.1   yes",
        "3. teardown          seconds             0.5     0.4        1.25    <= 0.15  NO",
        "                     launcher exit code  7       error [1]  -       = 7      -",
        "7. planning          env (KiB)           122     3.4e-04    360              -",
        "  [1] torchrun, teardown: exit code 1",
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


def test_torchrun_gets_a_reserved_master_port(tmp_path):
    with harness.PortReservations() as ports:
        argv = harness.Torchrun().job_command(harness.Job(2, "allreduce.py"), ports)
        port = int(argv[argv.index("--master-port") + 1])
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    assert harness.Ours().job_command(harness.Job(2, "allreduce.py"), ports)[2:5] == ["launcher", "--nproc_per_node", "2"]
