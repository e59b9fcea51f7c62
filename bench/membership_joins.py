#!/usr/bin/env python3
"""The cost of the elastic membership's rules alone (``launcher.nodes.elastic.membership``) at the start of a
big job: pure Python, no socket, no process, a fake clock.

    python bench/membership_joins.py [--joins 10000] [--workers 8] [--runs 3] [--module PATH] [--json FILE]

Each run: ``begin`` (node 0), then JOINS ``JoinAsked`` of W workers each (``--nnodes 2:JOINS+2``: MAX is never
reached, so every join is a join alone), each followed by what node 0's keeper asks after an event
(``next_deadline``, as ``c10d.keeper`` does); then a ``TimePassed`` past the last call, which starts round 1 with
JOINS+1 nodes; then one ``Heartbeat`` of every node at once and a ``TimePassed``. Printed: the time of the last
join, of every join, of the round's start, of the heartbeat batch and of the last TimePassed (each with its
``next_deadline``), and of the whole run; min/median/max over the runs. ``--module``: another copy of
membership.py to measure (such as ``git show HEAD:launcher/nodes/elastic/membership.py`` saved in a file), to
compare before and after a change.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from launcher.plan.elastic import ElasticSpec, Rendezvous  # noqa: E402


def load(path):
    if path is None:
        from launcher.nodes.elastic import membership
        return membership
    spec = importlib.util.spec_from_file_location("membership_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def one_run(mb, joins: int, workers: int) -> dict:
    rendezvous = Rendezvous(join_timeout=600.0, last_call_timeout=1.0, heartbeat_timeout=3.0)
    spec = ElasticSpec(2, joins + 2, "c10d", job_id="job", rendezvous=rendezvous)
    now = 0.0
    began = time.perf_counter()
    state, _ = mb.begin(spec, mb.Node("n0", "10.0.0.1", workers), "job", now)
    joiners = [mb.Node(f"n{i}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", workers) for i in range(1, joins + 1)]
    joins_began = last = time.perf_counter()
    for node in joiners:
        now += 1e-5
        last = time.perf_counter()
        state, actions = mb.decide(state, mb.JoinAsked(node, "job"), now)
        mb.next_deadline(state)
        last = time.perf_counter() - last
    joined = time.perf_counter() - joins_began
    assert state.phase == mb.WAITING and len(state.members) == joins + 1, state.phase
    now += 1.0
    start = time.perf_counter()
    state, _ = mb.decide(state, mb.TimePassed(), now)
    mb.next_deadline(state)
    start = time.perf_counter() - start
    assert state.phase == mb.RUNNING and len(state.round.members) == joins + 1, state.phase
    now += 1.0
    beat = time.perf_counter()
    state, _ = mb.decide(state, mb.Heartbeat(at={n.node_id: now for n in joiners}), now)
    mb.next_deadline(state)
    beat = time.perf_counter() - beat
    tick = time.perf_counter()
    state, actions = mb.decide(state, mb.TimePassed(), now + 0.5)
    mb.next_deadline(state)
    tick = time.perf_counter() - tick
    assert not [a for a in actions if not isinstance(a, mb.Say)], actions
    return {"last_join_s": last, "joins_s": joined, "round_start_s": start, "heartbeat_batch_s": beat,
            "time_passed_s": tick, "total_s": time.perf_counter() - began}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--joins", type=int, default=10000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--module", default=None, help="another membership.py to measure")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    mb = load(args.module)
    runs = [one_run(mb, args.joins, args.workers) for _ in range(args.runs)]
    figures = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        figures[key] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
        print(f"{key:18} min {min(values) * 1e3:10.3f} ms  median {statistics.median(values) * 1e3:10.3f} ms  "
              f"max {max(values) * 1e3:10.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"joins": args.joins, "workers": args.workers, "runs": args.runs,
                                               "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
