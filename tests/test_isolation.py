"""Tests that run the launcher's code in the pytest process leave the next test its output as new
(``tests/conftest.py``): each pair here runs in that order, in a pytest of its own."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

PAIRS = {
    # the launch command (CliRunner) sets the launcher's logger to propagate nothing; caplog after it
    "logger": ((), "tests/test_paddle_cli.py::test_an_option_that_cannot_be_honoured_is_refused_naming_why[npus]",
               "tests/test_watch.py::test_writer_that_cannot_write_warns_once_and_never_raises"),
    # attempts.run makes the console's stream for stderr, a pipe under -s; capfd after it
    "console": (("-s",), "tests/test_attempts.py::test_a_clean_end_exits_0",
                "tests/test_attempts.py::test_a_failure_on_another_node_stops_this_one_with_node_0s_code_and_cause"),
}


@pytest.mark.parametrize("options, first, then", PAIRS.values(), ids=PAIRS)  # in one process, in this order
def test_a_test_after_one_that_ran_the_launcher_in_process_sees_its_messages(options, first, then):
    r = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        *options, first, then], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})  # its summary line as asked
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
