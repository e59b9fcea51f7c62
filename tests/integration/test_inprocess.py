"""The example the docs show (examples/elastic_inprocess.py, plain and with fleet) on c10d: after a loss the survivors
go on in their processes, and a joiner gets their parameters (inprocess_job.py says how the job is watched; the
losses and joins of every kind are test_inprocess_losses.py's and test_inprocess_joiners.py's)."""

import json

import pytest

from conftest import assert_all_gone, free_ports
from inprocess_job import C10D_CONF, EXAMPLE, HOST, Job, check_went_on
from test_elastic import power_off, stop_all

pytestmark = pytest.mark.real_torch


def example_job(tmp_path, last_call: int, *options) -> Job:
    """A c10d job of examples/elastic_inprocess.py (with ``options``), as the docs show it."""
    port = free_ports(6)
    line = ("--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={HOST}:{port}",
            "--rdzv-id=job1", "--rdzv-conf", f"{C10D_CONF},last_call_timeout={last_call}")
    job = Job(tmp_path, "c10d", port)
    job.line = lambda node: (*line, "--log_dir", tmp_path / f"node{node}", EXAMPLE, *options, "--check",
                             tmp_path / "digests.jsonl")
    return job


@pytest.mark.parametrize("options", [(), ("--fleet",)], ids=["plain", "fleet"])
def test_the_example_goes_on_after_a_loss_as_the_docs_show(tmp_path, options):
    """c10d, with examples/elastic_inprocess.py as the docs show it (``--fleet``: fleet.elastic_run, and
    fleet.distributed_optimizer wrapped again in each round): its lines carry the fields the docs name; after a loss
    the survivors go on in their processes at the next step, every rank of the new round with the same parameters;
    a joiner gets them too, bit for bit."""
    job = example_job(tmp_path, 60, *options)
    try:
        job.start(3)
        job.wait_world([0, 1, 2], 3)
        gone = power_off(job.procs[2])
        job.wait_world([0, 1], 2)
        check_went_on(job, [0, 1], 3, 2)
        assert {"time", "step", "world", "rank", "pid", "loss"} <= set(job.steps(0)[-1])
        job.start(1)
        job.wait_world([0, 1, 3], 3, after=max(int(s["step"]) for s in job.steps(0)))
        for n in (0, 1):
            assert len({int(s["pid"]) for s in job.steps(n)}) == 1, f"node {n} has new processes:\n{job.said()}"
        joined = [d for d in job.digests() if d["world"] == 3 and d["step"] > 0]
        assert len({d["rank"] for d in joined}) == 3 and len({d["digest"] for d in joined}) == 1, joined
    finally:
        stop_all(job.procs)
    assert_all_gone(gone)
    check_event_log(tmp_path / "node1")




def check_event_log(log_dir) -> None:
    """A survivor's events.jsonl: the rounds, node 2 lost then a node joined, its worker kept, never started again."""
    events = [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]
    rounds = [(e["round"], e["why"], e["nodes"]) for e in events if e["event"] == "round"]
    assert [(why, nodes) for _, why, nodes in rounds[-2:]] == [("lost", 2), ("joined", 3)], rounds
    changes = [(e["event"], e["round"]) for e in events if e["event"].startswith("member_")]
    assert changes[-2:] == [("member_lost", rounds[-2][0]), ("member_joined", rounds[-1][0])], changes
    started = [e for e in events if e["event"] == "worker_started"]
    assert len({e["pid"] for e in started}) == 1 and all(e.get("kept") for e in started[1:]), started
