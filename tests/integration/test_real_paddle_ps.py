"""Real PaddlePaddle programs of parameter-server jobs, unchanged, under this launcher and under Paddle's own: the same
roles (Paddle 3's fleet), the same results (Paddle 2.6.2's parameter-server runtime on CPU). The environments, and
how each launcher is run, are test_real_paddle.py's."""

import glob

import pytest

from test_real_paddle import PROGRAMS, folders, results, run_ours, run_paddles
from test_real_paddle import paddle3, paddle26  # noqa: F401 - the fixtures

pytestmark = pytest.mark.training  # CI runs them after the quick loop (README's development lines)

_PADDLES = {}  # the roles under Paddle's launcher, once per test run


def paddles_roles(python, script, out, drop):
    """The roles of a job of 1 server and 2 trainers under Paddle's launcher, once per test run: each command line
    of ours is compared with the same one of Paddle's."""
    if "roles" not in _PADDLES:
        paddles = run_paddles(python, ["--server_num", "1", "--trainer_num", "2", script, out], out)
        assert paddles.returncode == 0, paddles.stdout[-3000:]
        _PADDLES["roles"] = results(out, "role.*.json", drop=drop)
    return _PADDLES["roles"]


@pytest.mark.parametrize("counts", [["--server_num", "1", "--worker_num", "2"],  # Paddle 1.8's launch_ps
                                    ["--run_mode", "ps", "--trainer_num", "2"]])  # Paddle 3's
def test_fleet_parses_the_roles_of_a_parameter_server_job_as_under_paddles_launcher(paddle3, tmp_path, counts):
    ours, theirs = folders(tmp_path)
    script = PROGRAMS / "fleet_ps_roles.py"
    mine = run_ours(paddle3, [*counts, script, ours], ours)
    assert mine.returncode == 0, mine.stderr[-3000:]
    endpoints = ("server_endpoints", "trainer_endpoints")  # free ports, different in each run
    got = results(ours, "role.*.json", drop=endpoints)
    assert sorted(got) == ["role.server.0.json", "role.trainer.0.json", "role.trainer.1.json"]
    assert got == paddles_roles(paddle3, script, theirs, endpoints)
    for data in results(ours, "role.*.json").values():
        assert (len(data["server_endpoints"]), len(data["trainer_endpoints"])) == (1, 2)


def _trainers_done(count):
    return lambda out: len(glob.glob(str(out / "ps.*.json"))) == count


def test_fleet_parameter_server_training_and_fleet_util_all_reduce_as_under_paddles_launcher(paddle26, tmp_path):
    """Paddle 2.6.2's PS runtime: a sparse embedding on the server, 2 trainers, then fleet.util.all_reduce of
    1.0 from each trainer: 2.0, through the gloo rendezvous that server 0's fleet serves."""
    ours, theirs = folders(tmp_path)
    script = PROGRAMS / "fleet_ps.py"
    mine = run_ours(paddle26, ["--server_num", "1", "--worker_num", "2", script, ours], ours)
    assert mine.returncode == 0, mine.stderr[-3000:]
    got = results(ours, "ps.*.json", drop=("loss",))  # asynchronous SGD: the loss depends on timing
    assert got == {f"ps.{i}.json": {"index": i, "workers": 2, "sum": 2.0} for i in range(2)}
    paddles = run_paddles(paddle26, ["--server_num", "1", "--trainer_num", "2", script, theirs], theirs,
                          until=_trainers_done(2))
    assert results(theirs, "ps.*.json", drop=("loss",)) == got, paddles.stdout[-3000:]
    for data in results(ours, "ps.*.json").values():
        assert 0 <= data["loss"] < 1000  # it trained: a number, not nan
