"""The seeded schedule of faults of bench/goodput.py: pure, the same seed the same schedule.

The run's middle (from 15% to 85% of its duration) is cut into one slot per fault kind (two for ``slow``: a
slowed node is named only after a window of its slow steps, and its launcher, in the slowed cgroup, acts slowly
too), in an order drawn from the seed; each fault begins at a time drawn within the first fifth of its slot and ends within the slot, so that
faults never overlap and the job has a few seconds after each to settle. Its victim is drawn among the nodes
1 .. NODES-1, never node 0, the first launcher: with c10d node 0 hosts the rendezvous (our keeper, torchrun's
store), and losing it ends the job on both launchers by design, so a schedule that hit it would measure that
rule, not the fault; the same schedule runs on every side and backend, so etcd's runs spare node 0 too.

- ``slow``: the victim's cgroup given ``SLOW_CPUS`` of one CPU, then the quota lifted;
- ``poweroff``: every process of the victim SIGKILLed; it "boots" again (its launcher started afresh) at the end;
- ``freeze``: every process of the victim SIGSTOPped, then SIGCONTed at the end;
- ``partition``: the victim's traffic dropped (nftables or iptables in its namespace), then the rule removed;
- ``join``: the spare node (node NODES, idle until then) starts its launcher at the beginning; it stays.

The ``spare`` scenario (``spare_schedule``) starts the spare at once, where it waits as a standby (warm on the
``inplace`` side), and then powers members off one after the other (``SPARE_LOSSES`` of them): each lost member's
place is the standby's (and, once back, the powered-off node waits as the next one).

Whatever the fault, a node whose launcher has exited while no fault holds it is started again (as a cluster's
node agent restarts a failed service), on every side alike.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

KINDS = ("slow", "poweroff", "freeze", "partition", "join")
NODES = 3  # started at once; node NODES is the spare
SLOW_CPUS = 0.05
SPAN = (0.15, 0.85)  # the part of the run that holds the faults
LENGTHS = {"slow": (0.6, 0.8), "poweroff": (0.3, 0.5), "freeze": (0.3, 0.5), "partition": (0.45, 0.65), "join": (0, 0)}
SLOTS = {"slow": 2}  # slots a kind takes (1 unless named)


@dataclass(frozen=True)
class Fault:
    kind: str
    node: int
    start: float  # seconds after the run's start
    end: float  # when it is undone (== start for a join)

    def holds(self, node: int, at: float) -> bool:
        """Whether this fault holds ``node`` at ``at`` (seconds after the start)."""
        return self.node == node and self.start <= at < self.end

    def as_dict(self) -> dict:
        return asdict(self)


def schedule(seed: int, duration: float, kinds: tuple = KINDS) -> tuple:
    """The faults of ``seed`` in a run of ``duration`` seconds, in the order they begin."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    first, last = SPAN[0] * duration, SPAN[1] * duration
    unit = (last - first) / max(1, sum(SLOTS.get(kind, 1) for kind in order))
    faults, begins = [], first
    for kind in order:
        slot = SLOTS.get(kind, 1) * unit
        start = begins + rng.uniform(0, slot / 5)
        low, high = LENGTHS[kind]
        length = rng.uniform(low, high) * slot
        node = NODES if kind == "join" else rng.randrange(1, NODES)
        faults.append(Fault(kind, node, round(start, 2), round(start + length, 2)))
        begins += slot
    return tuple(faults)


SPARE_LOSSES = ("poweroff", "poweroff")


def spare_schedule(seed: int, duration: float) -> tuple:
    """The spare waiting from the start (a join at 0 s), then members powered off, as ``schedule`` draws them."""
    return (Fault("join", NODES, 0.0, 0.0),) + schedule(seed, duration, SPARE_LOSSES)


def describe(faults: tuple) -> str:
    return ", ".join(f"{f.kind} n{f.node} {f.start:.0f}-{f.end:.0f} s" if f.end > f.start
                     else f"{f.kind} n{f.node} {f.start:.0f} s" for f in faults)
