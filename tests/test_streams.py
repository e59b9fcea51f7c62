"""torchrun's --redirects, --tee, --local-ranks-filter parsed and routed (launcher.plan.streams), and the
output each route makes (launcher.output.routes): the rules of torch's DefaultLogsSpecs.reify, in our layout."""

import os

import pytest

from launcher.errors import LaunchError
from launcher.output import log_files, routes, sinks
from launcher.plan import streams
from launcher.plan.model import HostFacts, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.plan.streams import BOTH, ERR, NONE, OUT, StreamChoice, StreamRoute, parse_choice, route

HOST = HostFacts(gpu_count=None, cpu_count=4, python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")


def test_values_and_maps_are_parsed_as_torchruns_std():
    assert streams.parse_std("3", "--tee") == BOTH and streams.parse_std(" 0 ", "--tee") == NONE
    assert streams.parse_std("0:3,1:0,2:1,3:2", "--redirects") == {0: BOTH, 1: NONE, 2: OUT, 3: ERR}
    assert streams.parse_ranks("0,2") == frozenset({0, 2}) and streams.parse_ranks("1") == frozenset({1})
    assert parse_choice(None, None, None) is None


@pytest.mark.parametrize("option, text", [("--redirects", "4"), ("--redirects", "all"), ("--tee", "0:5"),
                                          ("--tee", "0:1,"), ("--redirects", "-1"), ("--tee", "")])
def test_a_bad_stream_choice_is_one_sentence_naming_it(option, text):
    with pytest.raises(LaunchError, match=rf"^{option} {text} is not a choice of streams; give 0 none, 1 stdout"):
        streams.parse_std(text, option)


@pytest.mark.parametrize("text", ["a", "0,", "", "-1", "0;1"])
def test_a_bad_ranks_filter_is_refused(text):
    with pytest.raises(LaunchError, match=rf"^--local-ranks-filter {text} is not a list of local ranks"):
        streams.parse_ranks(text)


@pytest.mark.parametrize("redirects, tee, shown, local_rank, expected", [
    ("3", None, None, 0, StreamRoute(BOTH, NONE)),        # -r 3: files only
    ("1", None, None, 1, StreamRoute(OUT, ERR)),          # -r 1: stdout to the file, stderr on the console
    (None, "3", None, 1, StreamRoute(BOTH, BOTH)),        # -t 3: file and console
    ("2", "1", None, 0, StreamRoute(BOTH, OUT)),          # a teed stream is redirected too
    ("0:3", None, None, 1, StreamRoute(NONE, BOTH)),      # a rank the map does not name: NONE
    (None, "3", {0}, 1, StreamRoute(BOTH, NONE)),         # filtered out: the file only
    ("0", None, {0}, 1, StreamRoute(NONE, NONE)),         # filtered out, not redirected: dropped
    (None, None, {1}, 1, StreamRoute(BOTH, BOTH)),        # the filter alone keeps our files (with --log_dir)
    (None, None, {1}, 0, StreamRoute(BOTH, NONE)),
])
def test_routes_follow_torchruns_rules(redirects, tee, shown, local_rank, expected):
    choice = parse_choice(redirects, tee, ",".join(map(str, shown)) if shown else None)
    assert route(choice, local_rank, log_dir=True) == expected


def test_the_filter_alone_without_log_dir_limits_the_console():
    choice = StreamChoice(shown=frozenset({1}))
    assert [route(choice, rank, log_dir=False) for rank in (0, 1)] == [StreamRoute(NONE, NONE), StreamRoute(NONE, BOTH)]


def test_the_plan_gives_each_worker_its_route_and_a_log_file_only_where_a_stream_goes():
    opts = LaunchOptions("train.py", nproc_per_node=2, log_dir="logs", stream_choice=parse_choice("0:3", None, None))
    plan = make_plan(opts, {}, HOST, lambda ip, n: range(7000, 7000 + n))
    assert [w.route for w in plan.workers] == [StreamRoute(BOTH, NONE), StreamRoute(NONE, BOTH)]
    assert [w.log_file for w in plan.workers] == ["logs/workerlog.0", None]
    plain = make_plan(LaunchOptions("train.py", nproc_per_node=2, log_dir="logs"), {}, HOST, lambda ip, n: range(7000, 7000 + n))
    assert [w.route for w in plain.workers] == [None, None]


def test_the_plan_refuses_streams_to_files_without_a_log_dir_and_in_ps_mode():
    with pytest.raises(LaunchError, match="give --log-dir too"):
        make_plan(LaunchOptions("train.py", stream_choice=parse_choice("3", None, None)), {}, HOST, lambda ip, n: range(7000, 7000 + n))
    with pytest.raises(LaunchError, match="are torchrun's, for collective jobs"):
        make_plan(LaunchOptions("train.py", server_num=1, worker_num=1, stream_choice=parse_choice(None, "3", None)), {}, HOST)


def outputs_of(tmp_path, redirects, tee=None, shown=None):
    opts = LaunchOptions("train.py", nproc_per_node=2, log_dir=str(tmp_path), stream_choice=parse_choice(redirects, tee, shown))
    plan = make_plan(opts, {}, HOST, lambda ip, n: range(7000, 7000 + n))
    made = []
    for spec in plan.workers:
        fd = log_files.open_log(spec.log_file, str(tmp_path), spec.label, spec.cmd) if spec.log_file else None
        made.append(routes.worker_output(spec, fd))
    return made


def test_each_route_makes_the_output_that_sends_each_stream_there(tmp_path):
    whole, split = outputs_of(tmp_path, "0:3,1:1")
    assert isinstance(whole, sinks.FileOutput) and not whole.follows
    assert isinstance(split, routes.RoutedOutput) and len(split.pipes()) == 2
    out, err = split.child_fds()
    assert os.path.samestat(os.fstat(out), os.stat(tmp_path / "workerlog.1")) and not os.path.samestat(os.fstat(err), os.fstat(out))
    for output in (whole, split):
        output.spawned()
        output.finish()


def test_a_filtered_rank_that_is_not_redirected_writes_to_dev_null(tmp_path):
    shown, dropped = outputs_of(tmp_path, "0", shown="0")
    assert isinstance(shown, sinks.PipeOutput) and dropped.pipes() == () and dropped.path is None
    assert all(os.path.samestat(os.fstat(fd), os.stat(os.devnull)) for fd in dropped.child_fds())
    for output in (shown, dropped):
        output.spawned()
        output.finish()
