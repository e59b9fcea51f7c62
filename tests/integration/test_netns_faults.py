"""A partitioned node and a slowed node of an elastic job of ours (bench/faults.py): three launchers, each in a
network namespace and a cgroup of its own, run bench/goodput_train.py in place. Needs root, ``ip`` and nftables
or iptables (skipped otherwise); every namespace, cgroup and process made is removed, also on a failure."""

import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults  # noqa: E402
import goodput  # noqa: E402
import goodput_check as check  # noqa: E402
import goodput_schedule as plan  # noqa: E402
import harness  # noqa: E402

NODES = 3
BATCH = goodput.BATCH  # the bench's step: a slowed rank stands out of a busy machine's noise
BOUND_S = 120.0  # for any one thing awaited (the job's start includes 3 imports of torch on 2 busy cores)


def _usable() -> str:
    try:
        faults.require_root("network namespaces and cgroups")
        faults.require_tool("ip", "network namespaces")
        faults.firewall()
        faults.cgroup_version()
    except faults.Unavailable as e:
        return str(e)
    return ""


pytestmark = pytest.mark.skipif(bool(_usable()), reason=_usable() or "usable")


class Job:
    """Three nodes of ours in place, their namespaces and cgroups; everything removed by ``close``."""

    def __init__(self, folder: Path, stack: ExitStack, straggler: bool = False):
        self.net = stack.enter_context(faults.Network())
        self.prefix = self.net.prefix
        self.out = folder / "out"
        self.out.mkdir()
        self.nodes = []
        for i in range(NODES):
            self.net.add_node(i)
            group = faults.CpuGroup.create(f"{self.prefix}-n{i}")
            stack.callback(group.remove)
            self.nodes.append(goodput.Node(i, self.net.ns(i), group, folder))
        stack.callback(self.stop)
        until = time.time() + 3 * BOUND_S + 60  # the workers' own end, past every bound
        for node in self.nodes:
            node.start(goodput.Side("inplace"), "c10d", "faults-test", self.out, until, straggler, BATCH)
            if node.index == 0:
                time.sleep(goodput.STAGGER_S)

    def lines(self) -> list:
        return [line for path in sorted(self.out.glob("steps.*.jsonl"))
                for line in check.parse(path.read_text(errors="replace"))]

    def wait_for(self, found, what: str):
        """Poll the step lines until ``found(lines)`` gives something; fail after BOUND_S, or if node 0 ended."""
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            value = found(self.lines())
            if value:
                return value
            if not self.nodes[0].running():
                pytest.fail(f"node 0's launcher exited ({self.nodes[0].runs[-1].exit_code}) before {what}")
            time.sleep(0.1)
        pytest.fail(f"no {what} within {BOUND_S:.0f} s")

    def committed_after(self, world, after: float, count: int = 1):
        """The time of the ``count``-th step committed after ``after`` in a world of ``world`` ranks (None: any)."""
        def found(lines):
            sizes = {l.world_id: l.world for l in lines}
            times = [at for (wid, step), (at, _) in check.commits(lines).items()
                     if at > after and world in (None, sizes[wid])]
            return sorted(times)[count - 1] if len(times) >= count else None
        return found

    def stop(self) -> None:
        for node in self.nodes:
            for run in node.runs:
                if not run.exited:
                    run.proc.terminate()
        for node in self.nodes:
            for run in node.runs:
                run.exited_by(time.time() + goodput.STOP_BOUND_S)
                run.stop()


@pytest.fixture
def job_factory(tmp_path):
    with ExitStack() as stack:
        made = []

        def make(**kw):
            job = Job(tmp_path, stack, **kw)
            made.append(job)
            return job

        yield make
    for job in made:  # everything made was removed
        assert faults.leftover_namespaces(job.prefix) == []
        for node in job.nodes:
            assert not node.group.path.exists()
            assert all(harness.tagged_processes(run.tag) == [] for run in node.runs)


def test_a_partitioned_node_stops_and_the_survivors_go_on_without_it(job_factory):
    job = job_factory()
    job.wait_for(job.committed_after(3, 0.0, count=3), "step of all 3 nodes")
    cut = time.time()
    job.net.cut(2)
    try:
        job.wait_for(job.committed_after(2, cut, count=3), "step of the 2 survivors after the cut")
        victim = job.nodes[2].runs[-1]
        assert victim.exited_by(time.time() + BOUND_S), "the partitioned node's launcher did not stop"
        assert victim.exit_code != 0
        time.sleep(1.0)  # more steps of the survivors while it is still cut off
    finally:
        job.net.heal(2)
    healed = time.time()
    job.wait_for(job.committed_after(2, healed), "step after the heal")
    lines = job.lines()
    problems = check.violations(lines, BATCH, goodput.MIN_WORLD, partitions=[("n2", cut, healed)])
    assert problems == []
    assert not [l for l in lines if l.node == "n2" and l.t > cut + check.IN_FLIGHT_S]  # it never trained alone
    assert {l.node for l in lines if l.t > cut + check.IN_FLIGHT_S} == {"n0", "n1"}


def test_a_slowed_node_is_named_and_leaves_and_no_healthy_node_is_named(job_factory):
    """--straggler_policy leave: the node whose cgroup gets 5% of a CPU (the bench's slow fault) is named, leaves,
    and the two others go on; no other node is ever named (the bench's steps, on a busy machine)."""
    job = job_factory(straggler=True)
    job.wait_for(job.committed_after(3, 0.0, count=3), "step of all 3 nodes")
    slowed = time.time()
    job.nodes[2].group.limit(plan.SLOW_CPUS)
    try:
        def named(_lines):
            events = [e for node in job.nodes for e in goodput.events_of(node.folder, node.name)]
            return check.named_after(events, faults.Network.address(2), slowed, within=BOUND_S)
        job.wait_for(named, "straggler event naming the slowed node")
        job.wait_for(job.committed_after(2, time.time(), count=5), "steps of the two others after it left")
    finally:
        job.nodes[2].group.lift()
    named = {e["host"] for node in job.nodes for e in goodput.events_of(node.folder, node.name)
             if e.get("event") == "straggler"}
    assert named == {faults.Network.address(2)}, named
    assert check.violations(job.lines(), BATCH, goodput.MIN_WORLD) == []
