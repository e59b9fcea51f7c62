"""The suite's own helpers (tests/conftest.py), where a failure of theirs would hide what a test found."""

import subprocess
import sys

import pytest

from conftest import finish_all


def test_a_process_that_overruns_fails_the_test_showing_what_every_process_wrote():
    def start(code):
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    done = start("import sys; print('out of a'); print('err of a', file=sys.stderr)")
    hung = start("import sys, time; print('err of b', file=sys.stderr, flush=True); time.sleep(600)")
    after = start("import sys; print('err of c', file=sys.stderr)")
    with pytest.raises(AssertionError) as failure:
        finish_all([done, hung, after], timeout=2)
    text = str(failure.value)
    assert "still ran after 2 s" in text and "exit code -9" in text
    for line in ("out of a", "err of a", "err of b", "err of c"):
        assert line in text
    assert hung.poll() is not None  # killed, not left running
