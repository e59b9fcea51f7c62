"""What bench/goodput.py reads from a run: the step lines of bench/goodput_train.py, the samples trained (goodput's
numerator), and the invariants. Pure: lines and facts in, numbers and violations out.

A step is **committed** when every rank of its world wrote its line for it (``world`` lines of one ``world_id``
and ``step``); it trains the samples of its ranks' shares. The **samples trained** in a window are the distinct
sample ids of the steps committed in it (a step's commit time: its last rank's ``t``): a step redone after a
restart from a checkpoint trains the same ids again and counts once (``redone`` counts such repeats, the work a
restart threw away). **Goodput** is the samples trained under faults over the samples a fault-free run of the
same side trained in the same time.

The invariants (``violations``), each a kind and a sentence:

- ``two worlds``: the spans (first line to last line) of two worlds overlap: two groups trained at once;
- ``below min``: a world smaller than the job's minimum (a partitioned node training alone makes one of 1);
- ``alone``: a line of a partitioned node written while it was cut off (past a grace for a step in flight);
- ``duplicate rank``: one rank of a world written by two processes, or twice for one step;
- ``sample twice``: two shares of one step overlap, or a share lies outside its step's batch;
- ``line lost``: a process's line numbers have a gap (a line written to its file and lost);
- ``log line lost``: a line in the workers' files missing from what its node's launcher kept (standard output);
- ``process left``: a process of the run alive after its end.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

FIELDS = ("t", "node", "world_id", "world", "rank", "pid", "step", "lo", "hi", "seq")
IN_FLIGHT_S = 1.0  # a partitioned node's step whose all-reduce had returned before the cut may be stamped after it


@dataclass(frozen=True)
class Line:
    t: float
    node: str
    world_id: int
    world: int
    rank: int
    pid: int
    step: int
    lo: int
    hi: int
    seq: int


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str


def parse(text: str) -> list:
    """The step lines in ``text`` (other lines, and a line cut short by a kill, left out)."""
    found = []
    for raw in text.splitlines():
        if not raw.startswith('{"gp": 1'):
            continue
        try:
            record = json.loads(raw)
            found.append(Line(**{k: record[k] for k in FIELDS}))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def commits(lines: Iterable[Line]) -> dict:
    """(world_id, step) -> (commit time, samples) of every committed step."""
    by_step: dict = defaultdict(dict)
    for line in lines:
        by_step[(line.world_id, line.step)][line.rank] = line
    done = {}
    for key, ranks in by_step.items():
        world = next(iter(ranks.values())).world
        if len(ranks) == world and set(ranks) == set(range(world)):
            done[key] = (max(l.t for l in ranks.values()), sum(l.hi - l.lo for l in ranks.values()))
    return done


def trained(lines: Iterable[Line], start: float, end: float) -> tuple:
    """(samples trained, samples redone) by the steps committed within [start, end]: each step number once."""
    seen: set = set()
    samples = redone = 0
    for (_, step), (at, count) in sorted(commits(lines).items(), key=lambda kv: kv[1][0]):
        if not start <= at <= end:
            continue
        if step in seen:
            redone += count
        else:
            seen.add(step)
            samples += count
    return samples, redone


def commit_times(lines: Iterable[Line]) -> list:
    """(commit time, samples) of every committed step, by time."""
    return sorted(commits(lines).values())


def goodput(samples: int, fault_free: int) -> Optional[float]:
    return samples / fault_free if fault_free > 0 else None


# ---------------------------------------------------------------- the invariants


def violations(lines: list, batch: int, min_world: int, partitions: Iterable[tuple] = (),
               captured: Optional[dict] = None, exempt: Iterable[tuple] = (), leftovers: Iterable[str] = ()) -> list:
    """Every invariant broken by a run. ``partitions``: (node, cut at, healed at); ``captured``: node -> the set of
    (pid, seq) its launchers kept (None: not checked); ``exempt``: (node, from, to) spans whose lines may be lost
    in a launcher's pipe (its node powered off); ``leftovers``: the processes alive after the run."""
    found = []
    found += overlapping_worlds(lines)
    found += small_worlds(lines, min_world)
    found += alone(lines, partitions)
    found += duplicate_ranks(lines)
    found += twice_counted(lines, batch)
    found += gaps(lines)
    if captured is not None:
        found += not_kept(lines, captured, list(exempt))
    found += [Violation("process left", f"{p} alive after the run") for p in leftovers]
    return found


def spans(lines: Iterable[Line]) -> dict:
    """world_id -> (first t, last t, its nodes)."""
    found: dict = {}
    for line in lines:
        first, last, nodes = found.get(line.world_id, (line.t, line.t, frozenset()))
        found[line.world_id] = (min(first, line.t), max(last, line.t), nodes | {line.node})
    return found


def overlapping_worlds(lines: list) -> list:
    ordered = sorted(spans(lines).items(), key=lambda kv: kv[1][0])
    found = []
    for (a, (_, a_end, a_nodes)), (b, (b_start, _, b_nodes)) in zip(ordered, ordered[1:]):
        if b_start < a_end:
            found.append(Violation("two worlds", f"world {a} ({','.join(sorted(a_nodes))}) trained until {a_end:.3f}, "
                                                 f"world {b} ({','.join(sorted(b_nodes))}) from {b_start:.3f}"))
    return found


def small_worlds(lines: list, min_world: int) -> list:
    small = {(l.world_id, l.world, l.node) for l in lines if l.world < min_world}
    return [Violation("below min", f"world {w} of size {size} on {node} (minimum {min_world})")
            for w, size, node in sorted(small)]


def alone(lines: list, partitions: Iterable[tuple]) -> list:
    found = []
    for node, cut, healed in partitions:
        during = [l for l in lines if l.node == node and cut + IN_FLIGHT_S <= l.t < healed]
        if during:
            found.append(Violation("alone", f"{node} wrote {len(during)} step line(s) while cut off "
                                            f"({cut:.3f}-{healed:.3f}), the first at {during[0].t:.3f} "
                                            f"in world {during[0].world_id} of {during[0].world}"))
    return found


def duplicate_ranks(lines: list) -> list:
    holders: dict = defaultdict(set)
    per_step: dict = defaultdict(int)
    for line in lines:
        holders[(line.world_id, line.rank)].add(line.pid)
        per_step[(line.world_id, line.step, line.rank)] += 1
    found = [Violation("duplicate rank", f"rank {rank} of world {w} held by processes {sorted(pids)}")
             for (w, rank), pids in holders.items() if len(pids) > 1]
    found += [Violation("duplicate rank", f"rank {rank} of world {w} wrote step {step} {count} times")
              for (w, step, rank), count in per_step.items() if count > 1]
    return found


def twice_counted(lines: list, batch: int) -> list:
    shares: dict = defaultdict(list)
    for line in lines:
        shares[(line.world_id, line.step)].append((line.lo, line.hi, line.rank))
    found = []
    for (w, step), ranges in shares.items():
        ranges.sort()
        for lo, hi, rank in ranges:
            if lo < step * batch or hi > (step + 1) * batch or lo > hi:
                found.append(Violation("sample twice", f"rank {rank} of world {w} trained {lo}-{hi} at step {step}, "
                                                       f"outside its batch"))
        for (_, a_hi, a), (b_lo, _, b) in zip(ranges, ranges[1:]):
            if b_lo < a_hi:
                found.append(Violation("sample twice", f"ranks {a} and {b} of world {w} both trained sample {b_lo} "
                                                       f"at step {step}"))
    return found


def gaps(lines: list) -> list:
    seqs: dict = defaultdict(list)
    for line in lines:
        seqs[line.pid].append(line.seq)
    found = []
    for pid, numbers in seqs.items():
        numbers.sort()
        missing = numbers[-1] + 1 - len(set(numbers))  # from line 0 on
        if missing:
            found.append(Violation("line lost", f"process {pid} wrote lines 0-{numbers[-1]}, "
                                                f"{missing} missing from its file"))
    return found


def not_kept(lines: list, captured: dict, exempt: list) -> list:
    missing: dict = defaultdict(list)
    for line in lines:
        if any(node == line.node and start <= line.t <= end for node, start, end in exempt):
            continue
        if (line.pid, line.seq) not in captured.get(line.node, ()):
            missing[line.node].append(line)
    return [Violation("log line lost", f"{len(lost)} line(s) of {node} missing from its launcher's output, the first: "
                                       f"process {lost[0].pid} line {lost[0].seq} at {lost[0].t:.3f}")
            for node, lost in missing.items()]


# ---------------------------------------------------------------- the straggler's figures


def named_after(events: Iterable[dict], host: str, since: float, within: float = 30.0) -> Optional[float]:
    """Seconds from ``since`` to the first ``straggler`` event (of any launcher's event log) naming the node at
    ``host``, within ``within`` seconds; None if none came."""
    times = [e["time"] for e in events if e.get("event") == "straggler" and e.get("host") == host
             and since <= e.get("time", 0) <= since + within]
    return min(times) - since if times else None


def back_after(commits_by_time: list, since: float, rate: float, window: float = 5.0, within: float = 10.0,
               share: float = 0.9) -> Optional[float]:
    """Seconds from ``since`` to the start of the first ``window`` (starting within ``within`` seconds, looked at
    every quarter second) over which the samples committed came at ``share`` of ``rate`` (samples/s, the fault-free
    run's) or more; None if none did."""
    start = since
    while start <= since + within:
        done = sum(count for at, count in commits_by_time if start < at <= start + window)
        if done >= share * rate * window:
            return start - since
        start += 0.25
    return None
