"""The written interface of a worker's output (``sinks.WorkerOutput``): every sink keeps it."""

import inspect
import os

import pytest

from launcher.output import log_files, routes, sinks

MEMBERS = ("follows", "child_fds", "spawned", "pipes", "wants", "read_pipe", "follow", "last_written",
           "finish", "catch_up", "last_lines", "bytes_written")


@pytest.fixture
def both_sinks(tmp_path):
    path = str(tmp_path / "workerlog.0")
    made = [sinks.FileOutput(path, log_files.open_log(path, str(tmp_path), "rank 0", ("python", "x.py")), echo=False),
            sinks.PipeOutput("rank 1")]
    yield made
    for output in made:
        output.spawned()
        output.finish()


def test_the_protocol_names_what_the_supervisor_asks_of_an_output():
    declared = {name for name in vars(sinks.WorkerOutput) if not name.startswith("_")}
    assert declared == set(MEMBERS)


def test_a_log_file_and_pipes_are_both_worker_outputs(both_sinks):
    for output in both_sinks:
        assert isinstance(output, sinks.WorkerOutput), type(output).__name__


@pytest.mark.parametrize("sink", [sinks.FileOutput, sinks.PipeOutput, routes.RoutedOutput])
def test_each_sink_takes_the_arguments_the_protocol_gives(sink):
    for name in MEMBERS[1:]:
        wanted = list(inspect.signature(getattr(sinks.WorkerOutput, name)).parameters)
        assert list(inspect.signature(getattr(sink, name)).parameters) == wanted, (sink.__name__, name)


def test_a_new_sink_is_a_class_with_these_members_and_nothing_else():
    class Discard:
        follows = False

        def child_fds(self):
            return os.devnull, os.devnull

        def spawned(self): pass
        def pipes(self): return ()
        def wants(self, fd): return False
        def read_pipe(self, fd): return False
        def follow(self): return False
        def last_written(self): return None
        def finish(self): pass
        def catch_up(self): pass
        def last_lines(self, n=20): return []
        def bytes_written(self): return 0

    class Incomplete:
        def child_fds(self):
            return None, None

    assert isinstance(Discard(), sinks.WorkerOutput)
    assert not isinstance(Incomplete(), sinks.WorkerOutput)



def test_a_failure_s_last_lines_hold_what_the_worker_wrote_just_before_it_exited():
    """The worker's last words wait in its pipe when it exits before the event loop reads them: ``catch_up`` relays
    them before the failure summary takes the last lines (seen 1 run in 5 beside two busy processes)."""
    output = sinks.PipeOutput("rank 0")
    out_w, _ = output.child_fds()
    os.write(out_w, b"worker rank 0 up\nrank 0 is about to fail with 3\n")
    output.spawned()
    assert output.last_lines() == []
    output.catch_up()
    assert output.last_lines() == ["worker rank 0 up", "rank 0 is about to fail with 3"]
    output.finish()
