"""A lost node's survivors keep their processes: one node lost (killed, or stopped), or two at once
(inprocess_job.py says what is promised and how it is watched)."""

import signal

import pytest

from conftest import assert_all_gone
from etcd_servers import etcd  # noqa: F401 - the fixture (of inprocess_job.job's etcd jobs)
from inprocess_job import check_ended_well, check_went_on, job  # noqa: F401 - the fixture
from test_elastic import family, power_off

pytestmark = pytest.mark.real_torch


@pytest.mark.parametrize("job", ["etcd"], indirect=True)
def test_a_lost_node_s_survivors_go_on_in_their_processes(job):
    """With etcd (c10d's is test_inprocess.py's, with the program the docs show)."""
    job.start(3)
    job.wait_world([0, 1, 2], 3)
    gone = power_off(job.procs[2])
    job.wait_world([0, 1], 2)
    check_went_on(job, [0, 1], 3, 2)
    results = job.finish([0, 1])
    check_ended_well(results)
    if job.backend == "etcd":  # found by the liveness ring, not when its lease expired
        assert any("is gone (its connection closed)" in err for _, _, err in results), results
    assert_all_gone(gone)


def test_a_silent_node_is_lost_and_the_survivors_go_on_in_their_processes(job):
    job.start(3)
    job.wait_world([0, 1, 2], 3)
    stopped = family(job.procs[2].pid)
    for p in stopped:
        p.send_signal(signal.SIGSTOP)
    try:
        job.wait_world([0, 1], 2)
    finally:
        for p in stopped:
            p.send_signal(signal.SIGKILL)
    check_went_on(job, [0, 1], 3, 2)
    check_ended_well(job.finish([0, 1]))


def test_two_nodes_lost_at_once_leave_the_two_others_going_on(job):
    job.nnodes = "2:4"
    job.start(4)
    job.wait_world([0, 1, 2, 3], 4)
    gone = power_off(job.procs[2]) + power_off(job.procs[3])
    job.wait_world([0, 1], 2)
    check_went_on(job, [0, 1], 4, 2)
    check_ended_well(job.finish([0, 1]))
    assert_all_gone(gone)
