"""launcher tune's pure parts: the space read and checked (every refusal names the knob, before any trial), a
trial's config, the rate from reports on the workers' clock, the steady rule, hangs and silence on a fake clock, and
the search (successive halving, the leaders measured again in alternating order), replayed for --resume."""

import json
import math
import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli import tune as tune_cli
from launcher.cli.main import launch, request_of
from launcher.errors import LaunchError
from launcher.plan import tune_history, tune_rate, tune_search, tune_space, tune_trial
from launcher.plan.tune_rate import Rate, Series
from launcher.plan.tune_search import DEFAULTS, Result, Search


def job(tmp_path, space: str, *args):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    args = list(args or ("--nproc_per_node", "1", "train.py"))
    own = [] if "--log_dir" in args else ["--log_dir", str(tmp_path / "logs")]  # tune makes its log dir at once
    return tune_cli.job_of(launch, "python -m launcher", str(path), None, False, None, own + args, request_of)


def refused(tmp_path, space: str, *args) -> str:
    with pytest.raises(LaunchError) as e:
        job(tmp_path, space, *args)
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.mark.parametrize("space,fragment", [
    ("knobs:\n  nprocs: [1, 2]\n", "knob nprocs is neither a launch option nor env.NAME"),
    ("knobs:\n  env.OMP_NUM_THREADS: []\n", "knob env.OMP_NUM_THREADS needs a list of at least one value"),
    ("knobs:\n  env.OMP_NUM_THREADS: 2\n", "knob env.OMP_NUM_THREADS needs a list of at least one value, not int 2"),
    ("knobs:\n  shutdown_timeout: [5, -1]\n", "knob shutdown_timeout"),
    ("knobs:\n  max_restarts: [1, 2.5]\n", "knob max_restarts expects a whole number, not 2.5"),
    ("knobs:\n  bind_cores_to_rank: [1]\n", "knob bind_cores_to_rank expects true or false, not 1"),
    ("knobs:\n  run_path: [true]\n", "knob run_path: the launch takes --run_path with no effect or refuses it"),
    ("knobs:\n  auto_tuner_json: [a.json]\n", "knob auto_tuner_json: the launch takes --auto_tuner_json with no effect"),
    ("knobs:\n  log_dir: [a, b]\n", "knob log_dir: --log_dir is the tuner's own for each trial"),
    ("knobs:\n  nproc_per_node: [1, 2]\n", "knob nproc_per_node is also given to the launch; leave --nproc_per_node out"),
    ("knobs:\n  strategy.fuse_all: [true]\n", "knob strategy.fuse_all is not a field of fleet's DistributedStrategy"),
    ("knobs:\n  strategy.nccl_comm_num: [0, 1]\n", "knob strategy.nccl_comm_num expects a whole number of at least 1"),
    ("knobs:\n  arg.batch: [1]\n", "knob arg.batch: an argument knob names the program's flag"),
    ("knobs:\n  env.: [1]\n", "knob env. names no env"),
    ("knobs:\n  env.A: [1, 1]\n", "knob env.A lists a value twice"),
    ("knobs:\n  env.A: [[1]]\n", "knob env.A: list [1] is not a value"),
    ("knobs: {}\n", "needs knobs:"),
    ("knob:\n  env.A: [1]\n", "has an unknown key 'knob'"),
    ("metric: 3\nknobs:\n  env.A: [1]\n", "metric names the running count"),
    ("trial_seconds: 0\nknobs:\n  env.A: [1]\n", "trial_seconds must be a number from 1 to 86400, not int 0"),
    ("repeats: 0\nknobs:\n  env.A: [1]\n", "repeats must be a whole number from 1 to 10"),
    ("search: grid\nknobs:\n  env.A: [1]\n", "search is descent or every, not str 'grid'"),
    ("knobs:\n  nnodes: ['2:1']\n", "knob nnodes"),
    ("knobs:\n  max_restarts: [1]\n  max-restarts: [2]\n", "is named twice"),
    ("- a\n", "not a mapping"),
    ("knobs:\n  env.A: [" + ",".join(map(str, range(40))) + "]\n  env.B: [" + ",".join(map(str, range(40))) + "]\n",
     "has more than 1000 points"),
])
def test_every_refused_space_exits_before_any_trial_naming_the_knob(tmp_path, space, fragment):
    assert fragment in refused(tmp_path, space, "--nproc_per_node", "1", "train.py"), space


def test_a_point_the_launch_refuses_as_a_whole_is_named(tmp_path):
    message = refused(tmp_path, "knobs:\n  module: [true]\n  no_python: [true, false]\n", "train.py")
    assert "the point module=true no_python=true is refused: --module and --no_python exclude each other" in message
    message = refused(tmp_path, "knobs:\n  devices: ['0']\n  selected_gpus: ['0', '1']\n", "train.py")
    assert "the point devices=0 selected_gpus=1 is refused: --devices 0 disagrees with --selected_gpus 1" in message


def test_a_space_file_that_is_not_there_is_one_sentence(tmp_path):
    with pytest.raises(LaunchError, match="space file .* does not exist; check the path given to --space"):
        tune_cli.job_of(launch, "python -m launcher", str(tmp_path / "nope.yaml"), None, False, None, ["t.py"], request_of)


def test_plot_without_matplotlib_is_refused_before_any_trial(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    path = tmp_path / "space.yaml"
    path.write_text("knobs:\n  env.A: [1]\n")
    with pytest.raises(LaunchError, match=r"--plot needs matplotlib: pip install 'launcher\[bench\]'"):
        tune_cli.job_of(launch, "python -m launcher", str(path), None, False, "t.png", ["t.py"], request_of)


def test_an_out_a_plot_or_a_log_dir_that_cannot_be_written_is_refused_before_any_trial(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("knobs:\n  env.A: [1]\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    logs = ["--log_dir", str(tmp_path / "logs")]

    def refusal(out, plot, *args):
        with pytest.raises(LaunchError) as e:
            tune_cli.job_of(launch, "python -m launcher", str(path), out, False, plot, [*args, "t.py"], request_of)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert refusal(None, None, "--log_dir", str(a_file / "logs")) == \
        f"--log_dir {a_file / 'logs'} cannot be created (a part of its path is a file); choose a folder you can write to."
    assert refusal(str(tmp_path), None, *logs) == f"--out {tmp_path} is a folder; give the path of a file."
    assert refusal(str(a_file / "t.yaml"), None, *logs) == \
        f"--out {a_file / 't.yaml'}: its folder {a_file} cannot be created (a part of its path is a file); give another path."
    matplotlib = pytest.importorskip("matplotlib")
    assert matplotlib  # the test extra's, as --plot's
    assert refusal(None, str(a_file / "t.png"), *logs).startswith(f"--plot {a_file / 't.png'}: its folder ")
    message = refusal(None, str(tmp_path / "trials.jpeg2000"), *logs)
    assert message.startswith(f"--plot {tmp_path / 'trials.jpeg2000'}: matplotlib cannot draw to a file ending in "
                              ".jpeg2000; give one ending in ")
    assert " .png, " in message and message.endswith(f", say {tmp_path / 'trials'}.png.")
    assert "with no ending; " in refusal(None, str(tmp_path / "trials"), *logs)
    assert not (tmp_path / "logs" / "trial-1").exists()


def test_no_script_says_where_tunes_own_options_go(tmp_path):
    message = refused(tmp_path, "knobs:\n  env.A: [1]\n", "--nproc_per_node", "1")
    assert message.startswith("no training script given; usage: python -m launcher tune --space FILE")
    message = refused(tmp_path, "knobs:\n  env.A: [1]\n", "--nproc_per_node", "1", "--resume", "t.py")
    assert message.startswith("tune's own --resume comes before the launch options: python -m launcher tune --space")


def test_the_launch_given_to_tune_is_each_trials_under_the_knobs(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("env:\n  KEEP: 'yes'\nmax_restarts: 1\n")
    j = job(tmp_path, "metric: samples\nknobs:\n  nproc_per_node: [1, 2]\n  env.OMP_NUM_THREADS: [1]\n"
            "  strategy.use_local_sgd: [true]\n  arg.--batch-size: [64]\n",
            "--config", str(base), "--print_config", "false", "--log_dir", str(tmp_path / "logs"), "--bind_cores_to_rank",
            "train.py", "--batch-size", "16", "--lr", "1")
    assert j.log_dir == str(tmp_path / "logs") and j.out == os.path.join(j.log_dir, "tuned.yaml")
    assert j.space.metric == "samples" and [k.kind for k in j.space.knobs] == ["option", "env", "strategy", "arg"]
    point = j.space.points()[1]
    settings_ = tune_trial.config(j.base, j.space, point)
    assert settings_ == {"env": {"KEEP": "yes", "OMP_NUM_THREADS": "1"}, "max_restarts": 1, "print_config": False,
                         "bind_cores_to_rank": True, "training_script": "train.py", "nproc_per_node": 2,
                         "training_script_args": ["--batch-size", "64", "--lr", "1"],
                         "strategy": {"use_local_sgd": True}}
    path = tmp_path / "trial.yaml"
    path.write_text(tune_trial.to_yaml(settings_, "a header\nof two lines"))
    opts = request_of(["--config", str(path)]).options  # what the trial runs: the config alone
    assert (opts.nproc_per_node, opts.max_restarts, opts.bind_cores_to_rank) == (2, 1, True)
    assert opts.training_script_args == ("--batch-size", "64", "--lr", "1")
    assert dict(opts.extra_env)["LAUNCHER_STRATEGY"] == '{"use_local_sgd":true}'
    assert yaml.safe_load(path.read_text())["nproc_per_node"] == 2


flags = st.sampled_from(["--bs", "--batch-size", "-n"])
words = st.lists(st.sampled_from(["--bs", "--batch-size", "-n", "1", "x", "--bs=3", "--lr"]), max_size=8)


@settings(max_examples=200, deadline=None)
@given(words, flags, st.one_of(st.integers(0, 99), st.booleans()))
def test_an_argument_knob_leaves_its_flag_once_with_the_value(args, flag, value):
    out = tune_trial.with_argument(list(args), flag, value)
    held = [a for a in out if a == flag or a.startswith(flag + "=")]
    if value is False:
        assert held == []
    else:
        assert held == [flag]
        if value is not True:
            assert out[out.index(flag) + 1] == str(value)
    other_flags = lambda xs: [a for a in xs if a.startswith("-") and a != flag and not a.startswith(flag + "=")]  # noqa: E731
    assert other_flags(out) == other_flags(args)  # the other flags are kept, in their order


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.one_of(st.none(), st.integers(), st.text(max_size=5),
                                                       st.lists(st.integers(), max_size=3), st.booleans()), max_size=4))
def test_the_space_parser_never_fails_but_with_one_sentence(knobs):
    check = lambda name, value, where: name  # noqa: E731  (options: accepted as they are)
    try:
        space = tune_space.parse({"knobs": knobs}, "space", check)
    except LaunchError as e:
        assert "\n" not in str(e)
    else:
        assert all(k.values for k in space.knobs) and len(space.points()) >= 1


# ---------------------------------------------------------------- the rate, on the workers' clock


def feed(series: Series, ranks: int, seconds: float, step_time: float, start=1000.0, every=0.1, per_step=1.0,
         jitter=lambda i: 0.0):
    """Reports as --report_log keeps them: each rank's, at most every ``every`` s."""
    steps = int(seconds / step_time)
    shown = -1
    for i in range(steps):
        t = start + i * step_time + jitter(i)
        if t - start >= (shown + 1) * every or i == steps - 1:
            shown += 1
            for r in range(ranks):
                series.add({"rank": r, "step": i, "t": t, "scalars": {"samples": per_step * (i + 1)}})


def test_the_rate_is_the_sum_over_ranks_after_the_warm_up():
    s = Series("samples", warmup_steps=5)
    feed(s, ranks=2, seconds=4.0, step_time=0.01, per_step=32)
    rate = s.rate()
    assert rate.rate == pytest.approx(2 * 3200, rel=0.01) and rate.spread < 0.01 * rate.rate
    assert rate.steady(0.02) and rate.steps > 350


def test_the_warm_up_steps_are_left_out():
    s = Series("steps", warmup_steps=5)
    slow_start = lambda i: 0.5 if i >= 5 else 0.1 * i  # noqa: E731  (the first 5 steps take 0.5 s)
    feed(s, ranks=1, seconds=2.0, step_time=0.01, jitter=slow_start)
    assert s.rate().rate == pytest.approx(100, rel=0.02)


def test_a_rate_that_moves_is_not_steady_and_one_rank_alone_is_not_a_rate():
    s = Series("steps", warmup_steps=0)
    feed(s, ranks=1, seconds=2.0, step_time=0.01, jitter=lambda i: (i * 0.01) ** 2 / 2)  # slowing down
    assert not s.rate().steady(0.02)
    s = Series("steps", warmup_steps=0)
    s.add({"rank": 0, "step": 0, "t": 1.0, "scalars": {}})
    assert s.rate() is None


def test_the_rate_waits_for_every_rank_of_the_world_its_reports_give():
    series = Series("steps", warmup_steps=0)
    for i in range(20):
        series.add({"rank": 0, "world": 2, "step": i, "t": 0.1 * i})
    assert series.world == 2 and series.rate() is None  # rank 1, on another node, has not reported yet
    for i in range(20):
        series.add({"rank": 1, "world": 2, "step": i, "t": 0.1 * i + 0.05})
    assert series.rate().rate == pytest.approx(20.0, rel=0.01)
    series.add({"rank": 0, "world": True, "step": 30, "t": 9.0})  # not a world size: the last one stands
    assert series.world == 2


def test_a_short_window_is_not_steady_yet():
    s = Series("steps", warmup_steps=0)
    feed(s, ranks=1, seconds=2.5, step_time=0.01)
    assert s.rate() is not None and not s.rate().steady(0.5)


def test_untrusted_lines_are_skipped():
    s = Series("samples", warmup_steps=0)
    for line in ({}, {"rank": "0", "t": 1.0}, {"rank": 0, "t": float("nan")}, {"rank": 0, "t": 1.0, "scalars": None},
                 {"rank": 0, "t": 1.0, "step": 1, "scalars": {"samples": "many"}}):
        s.add(line)
    assert s.rate() is None and s.counted == 0


def test_verdicts_on_a_fake_clock():
    s = Series("steps", warmup_steps=0)
    assert tune_rate.verdict(s, 5.0, 1000.0, 10.0, 0.02) is None  # nothing yet, time left
    why, rate = tune_rate.verdict(s, 10.0, 1010.0, 10.0, 0.02)
    assert rate is None and why.startswith("the program reported nothing: call launcher.runtime.report(step=step)")
    feed(s, ranks=1, seconds=0.5, step_time=0.05, start=1000.0)
    why, rate = tune_rate.verdict(s, 10.0, 1010.0, 10.0, 0.02)
    assert rate is None and why == "hung: no report in its last 10 s"
    why, rate = tune_rate.verdict(s, 10.0, 1000.6, 10.0, 0.02)
    assert why == "time" and rate is not None  # out of time, still reporting: what it measured
    s = Series("samples", warmup_steps=0)
    s.add({"rank": 0, "step": 1, "t": 1.0, "scalars": {}})
    why, _ = tune_rate.ended(s, 2.0, 10.0, "ended")
    assert why.startswith("the program reported no samples in its 1 reports: call launcher.runtime.report(step=step, "
                          "samples=COUNT_SO_FAR)")


def test_within_noise_is_overlap():
    assert tune_rate.within_noise((100, 3), (95, 2)) and not tune_rate.within_noise((100, 2), (95, 2))


# ---------------------------------------------------------------- the search


def rate(r, spread=1.0):
    return Rate(r, spread, 100, 2.0, 10)


def run_search(speed, points, repeats=3, fail=(), every=False):
    """The trials the search asks for, each measured as ``speed(point, n)`` (n: the point's trials so far)."""
    search, asked = Search(points, repeats, every), []
    while (point := search.next()) is not None:
        asked.append(point)
        n = asked.count(point) - 1
        measured = 1.0 if point == DEFAULTS else speed(point, n)
        search.record(Result(point, None if point in fail else rate(measured), "steady"))
    return search, asked


def test_the_defaults_first_then_every_point_then_the_leaders_in_alternating_order():
    points = [(("env.A", i),) for i in range(9)]
    search, asked = run_search(lambda p, n: p[0][1] * 10.0, points)
    assert asked[0] == DEFAULTS and asked[1:10] == points
    passes = asked[10:]
    assert passes == [points[6], points[7], points[8], points[8], points[7], points[6]]  # slowest first, then reversed
    assert search.best().point == points[8] and search.best().trials == 3


def test_a_failed_point_is_out_and_every_failure_kept():
    points = [(("env.A", i),) for i in range(4)]
    search, asked = run_search(lambda p, n: p[0][1] * 10.0, points, fail=(points[3],))
    assert points[3] not in asked[5:] and search.best().point == points[2]
    assert [r.point for r in search.failures()] == [points[3]]


def test_repeats_one_measures_each_point_once():
    points = [(("env.A", i),) for i in range(5)]
    assert run_search(lambda p, n: 1.0, points, repeats=1)[1] == [DEFAULTS, *points]


def test_the_search_replays_the_same_trials_from_its_results():
    points = [(("env.A", i),) for i in range(7)]
    speed = lambda p, n: 50.0 + ((p[0][1] * 37 + n * 11) % 23)  # noqa: E731
    assert run_search(speed, points)[1] == run_search(speed, points)[1]


def grid(*sizes):
    return tune_space.Space(tuple(tune_space.Knob(f"env.K{i}", tune_space.ENV, f"K{i}", tuple(range(n)))
                                  for i, n in enumerate(sizes))).points()


def test_the_descent_goes_one_knob_at_a_time_and_measures_the_sum_of_the_values_not_their_product():
    points = grid(4, 3, 2, 3)  # 72 points
    best = (3, 0, 1, 2)
    speed = lambda p, n: 100.0 - sum(abs(v - b) * 7 for (_, v), b in zip(p, best))  # noqa: E731
    search, asked = run_search(speed, points)
    assert asked[:5] == [DEFAULTS, points[0], *[p for p in points if p[1:] == points[0][1:] and p != points[0]]]
    assert search.best().point == tuple(zip([f"env.K{i}" for i in range(4)], best))
    descent = asked[:asked.index(search.best().point) + 1]
    first_pass = 1 + 3 + 2 + 1 + 2  # the start, then each knob's other values
    second_pass = 3 + 2 + 1  # the lines through the point it moved to; the last knob's line is measured
    assert len(set(asked) - {DEFAULTS}) == first_pass + second_pass  # of 72 points
    assert len(descent) == len(set(descent))  # nothing measured twice before the leaders' passes


def test_a_value_that_helps_only_beside_another_is_found_by_every_not_by_the_descent():
    points = grid(2, 2)
    together = (("env.K0", 1), ("env.K1", 1))
    speed = lambda p, n: 200.0 if p == together else 100.0 - 10 * sum(v for _, v in p)  # noqa: E731
    assert run_search(speed, points)[0].best().point == points[0]
    search, asked = run_search(speed, points, every=True)
    assert asked[:5] == [DEFAULTS, *points] and search.best().point == together


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.data())
def test_the_search_ends_asks_only_points_of_the_space_and_names_the_fastest_it_measured(sizes, data):
    points = grid(*sizes)
    speeds = {p: data.draw(st.floats(1.0, 100.0)) for p in points}
    fail = set(data.draw(st.lists(st.sampled_from(points), max_size=2)))
    search, asked = run_search(lambda p, n: speeds[p], points, fail=fail)
    assert asked[0] == DEFAULTS and set(asked[1:]) <= set(points)
    assert len(asked) <= 1 + len(points) * 3
    measured = [s for s in search.standings() if s.point != DEFAULTS]
    assert search.best() == (max(measured, key=lambda s: s.rate) if measured else None)
    assert not fail & {s.point for s in measured}


def test_noise_between_the_best_and_the_next():
    a = tune_search.Standing((("env.A", 1),), 100.0, 3.0, 3)
    b = tune_search.Standing((("env.A", 2),), 97.0, 1.0, 3)
    assert tune_search.noise_between(a, b) and not tune_search.noise_between(a, None)


def test_a_report_line_cut_short_is_read_once_whole_and_every_nodes_log_is_read(tmp_path):
    from launcher.run.tune_trial import TrialReports

    path = tmp_path / "reports.node0.jsonl"
    (tmp_path / "reports.nodeX.jsonl").write_text('{"rank":9,"step":1,"t":1.0,"scalars":{}}\n')  # not a node's
    series, reports = Series("steps", warmup_steps=0), TrialReports(str(tmp_path))
    reports.read_into(series)  # no file yet
    path.write_bytes(b'{"rank":0,"step":1,"t":1.0,"scalars":{}}\n{"rank":0,"st')
    reports.read_into(series)
    assert series.reports == 1
    with open(path, "ab") as f:
        f.write(b'ep":2,"t":2.0,"scalars":{}}\nnot json\n')
    reports.read_into(series)
    assert series.reports == 2 and series.ranks[0][-1][2] == 2
    (tmp_path / "reports.node1.jsonl").write_text('{"rank":1,"step":1,"t":1.0,"scalars":{}}\n')  # a shared log dir
    reports.read_into(series)
    assert series.reports == 3 and set(series.first_step) == {0, 1}


def test_the_table_says_within_noise_and_the_ratio_to_the_defaults():
    from launcher.output.tune_lines import final_lines

    a, b = (("env.A", 1),), (("env.A", 2),)
    standings = [tune_search.Standing(a, 200.0, 6.0, 3), tune_search.Standing(b, 195.0, 2.0, 3),
                 tune_search.Standing(DEFAULTS, 100.0, 1.0, 1)]
    lines = final_lines(standings, "samples", "python -m launcher --config t.yaml x.py", "t.yaml")
    assert lines[0] == "tune: the settings by rate:" and "2.00x" in lines[2] and lines[2].endswith("env.A=1")
    assert "tune: within noise: the best (env.A=1) and the next (env.A=2) overlap; either will do" in lines
    assert "tune: best: env.A=1, 2.00x the program's own settings" in lines
    assert lines[-1] == "tune: kept in t.yaml; run it with: python -m launcher --config t.yaml x.py"


def test_a_history_line_cut_short_is_run_again(tmp_path):
    from launcher.run.tuner import read_history

    path = tmp_path / "tune.jsonl"
    path.write_text('{"trial": 1, "point": [], "why": "steady", "rate": {"rate": 5.0, "spread": 0.1, "steps": 9, '
                    '"seconds": 1.5, "lines": 9}}\n{"trial": 2, "point": [["env.A", 1]], "why": "exit code 3: x", '
                    '"rate": null}\n{"trial": 3, "point": [["env.A", 2]], "wh')
    got = read_history(str(path))
    assert list(got) == [DEFAULTS, (("env.A", 1),)]
    assert got[DEFAULTS][0][1].rate.rate == 5.0 and got[(("env.A", 1),)][0] == (2, Result((("env.A", 1),), None,
                                                                                         "exit code 3: x"))


def test_a_history_file_is_read_whole_whatever_it_holds(tmp_path):
    # --resume trusts nothing of the file: each of these lines is skipped (its trial runs again), none raises
    from launcher.run.tuner import read_history

    good = tune_history.line_of(4, Result((("env.A", 1),), Rate(5.0, 0.1, 9, 3.0, 9), "steady"))
    bad = ['{"trial": Infinity, "point": [], "why": "x", "rate": null}', "[" * 100_000 + "]" * 100_000,
           '{"trial": 1, "point": [], "why": "x", "rate": {"rate": "fast", "spread": 0, "steps": 1, "seconds": 3, '
           '"lines": 9}}', good.replace("5.0", "NaN"), good.replace('"steps": 9', '"steps": 9.5'),
           '{"trial": 1, "point": [["env.A", {"x": 1}]], "why": "x", "rate": null}', '{"trial": true, "point": [], '
           '"why": "x", "rate": null}', '{"trial": 2, "point": [["env.A"]], "why": "x", "rate": null}',
           '{"trial": 1' + "0" * 5000 + ', "point": [], "why": "x", "rate": null}', "7", "null", good[:-3]]
    path = tmp_path / "tune.jsonl"
    path.write_bytes(("\n".join(bad) + "\n").encode() + b"\xff\xfe\n" + good.encode() + b"\n")
    assert read_history(str(path)) == {(("env.A", 1),): [(4, Result((("env.A", 1),), Rate(5.0, 0.1, 9, 3.0, 9),
                                                                    "steady"))]}


HISTORY_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["trial", "point", "why", "rate"]), HISTORY_JSON, max_size=4),
       st.dictionaries(st.sampled_from(["rate", "spread", "steps", "seconds", "lines"]), HISTORY_JSON, max_size=5))
def test_a_history_line_never_raises_and_what_it_gives_has_its_types(doc, rate):
    for line in (json.dumps(doc), json.dumps({**doc, "rate": rate})):
        found = tune_history.entry(line)
        if found is not None:
            number, result = found
            assert isinstance(number, int) and number >= 1 and isinstance(result.why, str)
            assert all(isinstance(name, str) for name, _ in result.point)
            if result.rate is not None:
                assert all(math.isfinite(v) for v in vars(result.rate).values())
                assert tune_history.entry(tune_history.line_of(number, result)) == found  # the round trip


def test_trials_that_cannot_be_drawn_say_so_in_one_sentence_with_the_best_kept(tmp_path, monkeypatch):
    import errno

    from launcher.output import tune_lines
    from launcher.run import tuner

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tune_lines, "plot", full)
    space = tune_space.parse({"knobs": {"env.A": [1]}}, "space", lambda name, value, where: name)
    search, done = Search(space.points(), 1), []
    while (point := search.next()) is not None:
        done.append(Result(point, Rate(10.0 if point else 5.0, 0.1, 50, 3.0, 50), "steady"))
        search.record(done[-1])
    job = tuner.TuneJob(space, {"training_script": "t.py"}, str(tmp_path), str(tmp_path / "t.yaml"), "c", plot="t.png")
    with pytest.raises(tuner.NotKept) as e:
        tuner._finish(job, search, done)
    assert str(e.value) == f"cannot draw the trials in t.png (No space left on device); the best settings are kept in " \
                           f"{tmp_path / 't.yaml'}."
    assert e.value.exit_code == 1 and "env" in yaml.safe_load((tmp_path / "t.yaml").read_text())
