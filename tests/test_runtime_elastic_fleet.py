"""fleet.elastic_run in real worker processes (reform_probe.py with REFORM_FLEET, real torch gloo groups), with this
test as their launcher (test_runtime_elastic.py's ``Launcher``): each round's wrappers, and only they, average the
gradients, over the round's world."""

import pytest

from conftest import free_port
from test_runtime_elastic import Launcher, entries, env_of, lines

pytestmark = pytest.mark.training  # CI runs them after the quick loop (README's development lines)


@pytest.mark.parametrize("wrapper, comm_num", [("optimizer", 2), ("model", 1), ("model", 2)])
def test_a_fleet_program_wraps_its_model_again_in_each_round(tmp_path, wrapper, comm_num):
    """fleet.elastic_run: after each re-form (the same two ranks, then one rank alone, then a joiner) the gradients
    are averaged once, over the round's world, by that round's wrappers only (the last round's hooks are off)."""
    port = free_port()
    fleet = {"REFORM_FLEET": wrapper, "REFORM_COMM_NUM": str(comm_num)}
    with Launcher(tmp_path) as launcher:
        rank0, rank1 = (launcher.start(rank, 2, port, **fleet) for rank in range(2))
        for _ in range(3):
            steps_in(launcher, (rank0, rank1))
            launcher.stop([rank0, rank1])
            launcher.go({w: env_of(rank, 2, port) for rank, w in enumerate((rank0, rank1))})
        steps_in(launcher, (rank0, rank1))
        launcher.may_end.add(rank1.pid)
        launcher.stop([rank0])  # rank 1 is not told: its next all-reduce must fail, never pass as done
        launcher.go({rank0: env_of(0, 1, port)})
        steps_in(launcher, (rank0,))
        alone = entries(rank0)[-1]["step"]
        launcher.serve(lambda: lines(rank0)[-1]["step"] >= alone + 50, "rank 0's steps alone")
        rank1.kill()
        launcher.stop([rank0])
        joiner = launcher.start(1, 2, port, **fleet)
        launcher.go({rank0: env_of(0, 2, port)})
        steps_in(launcher, (rank0, joiner))

    checked = [r for w in (rank0, rank1, joiner) for r in lines(w) if r["event"] == "step"]
    assert {(r["round"], r["world_size"]) for r in lines(rank0) if r["event"] == "step"} == {
        (0, 2), (1, 2), (2, 2), (3, 2), (4, 1), (5, 2)}
    assert max(r["grad_error"] for r in checked) < 1e-5, checked
    assert {r["hooks"] for r in checked} == {2 if wrapper == "optimizer" else 0}  # Linear: weight and bias
    same_world = entries(rank0)[:4]  # rounds 0-3, two ranks: each round's communicators gone with it
    assert len({(r["fds"], r["threads"]) for r in same_world}) == 1, same_world
    survivor, new = entries(rank0)[-1], entries(joiner)[-1]
    assert (new["digest"], new["step"], new["source"]) == (survivor["digest"], survivor["step"], 0)


def steps_in(launcher, workers) -> None:
    """Wait until each of ``workers`` made a checked step in the round it is in now."""
    def stepped(w):
        now = entries(w)[-1]["round"] if entries(w) else None
        return any(r["event"] == "step" and r["round"] == now for r in lines(w))
    launcher.serve(lambda: all(stepped(w) for w in workers), "a checked step of each worker")
