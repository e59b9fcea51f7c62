"""bench/vs_paddle.py still works: one run of each figure against Paddle's own launcher, run from the
Paddle 3 environment of tests/paddle_envs.py (skipped where it cannot be made). No timing is asserted, only what holds however loaded the machine: exit codes, complete
logs, and nothing of ours left after kill -9. That run (both launchers, a minute) is marked ``bench``, out of the quick
loop (CI runs it: ``pytest -m bench``)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests import paddle_envs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import vs_paddle  # noqa: E402


@pytest.mark.bench
def test_one_run_of_each_figure_against_paddles_launcher():
    try:
        python = paddle_envs.make(paddle_envs.PADDLE3)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"cannot make the paddle3 environment: {e}")
    samples = vs_paddle.measure(runs=1, python=python)
    ours, paddle = samples["ours"], samples["paddle"]
    assert ours["startup_exit"] == paddle["startup_exit"] == [0]
    assert ours["teardown_exit"] == [7]  # the failing worker's code (Paddle's launcher exits 241)
    assert ours["left_after_kill9"] == [0]
    assert ours["log_complete"] == paddle["log_complete"] == [True]
    rows = {row[0]: row for row in vs_paddle.summary(samples)}
    assert set(rows) >= {"startup_s", "teardown_s", "left_after_kill9", "idle_mib", "log_mb_s"}


def test_without_paddle_it_says_so_and_measures_nothing(monkeypatch, capsys):
    monkeypatch.setattr(vs_paddle, "paddle_installed", lambda python: False)
    monkeypatch.setattr(sys, "argv", ["vs_paddle.py"])
    assert vs_paddle.main() == 0
    assert "paddlepaddle is not installed" in capsys.readouterr().out
