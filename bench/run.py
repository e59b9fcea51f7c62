#!/usr/bin/env python3
"""Our launcher against torchrun, side by side, on the same workloads.

    python bench/run.py [--quick | --tiny] [--only NAME,...] [--json FILE] [--plot FILE.png]

Runs each workload with ``python -m launcher`` and ``python -m torch.distributed.run`` in turn
(ours, torchrun, ours, torchrun, ...) and prints one table: the medians, the ratio ours/torchrun
and the goal for each figure. ``--quick`` takes under a minute on 2 CPU cores for workloads 1 to 8,
about 40 s more for 9 and 10 and about 90 s more for 11a to 11c (the parameter server),
``--tiny`` a few seconds per workload, 15 to 30 s for those of 11 (the test suite uses it); the
default (full) mode takes a few minutes, over two of them in 9 (torchrun's 120 s bound), and
about 20 more for 11a to 11c (DDP on a 10,000,000-row table, and 4 processes against 2 on 2 cores).

Everything is measured from the outside: wall times around the launcher process, CPU time and
resident memory of the launcher and of its helper processes (its process tree minus the workers
and what they started), with psutil; only the training workloads (8, 11) have their workers
time their own steps and read their own peak memory. Workers are the small scripts next to this file. Every run
gets its own folder under one temporary folder, removed at the end; every process started is
bounded by a timeout and killed, with everything it started, when a run ends or fails.

The parts: ``harness.py`` runs and measures a launcher, ``workloads.py`` says what each workload
does and measures, ``report.py`` makes the table, the JSON file and the plot.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import report  # noqa: E402
from workloads import MODES, WORKLOADS, Sizes, Workload  # noqa: E402


@dataclass
class Results:
    rows: list[report.Row] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)  # of the table, numbered from 1: errors and remarks
    errors: list[str] = field(default_factory=list)  # runs that could not be measured
    remarks: list[str] = field(default_factory=list)  # what a figure means, e.g. that it is a bound
    leftovers: list[dict] = field(default_factory=list)  # processes that outlived a launcher

    def footnote(self, text: str) -> int:
        if text not in self.footnotes:
            self.footnotes.append(text)
        return self.footnotes.index(text) + 1

    def add(self, workload: Workload, title: str, outcome: harness.Outcome) -> None:
        rows = report.rows_of(title, workload.metrics, outcome.samples)
        for name, error in outcome.errors.items():
            text = f"{name}, {workload.name}: {error}"
            self.errors.append(text)
            for r in rows:
                r.errors[name] = self.footnote(text)
        for name, results in outcome.samples.items():  # a result's remarks: metric field -> text
            for result in results:
                for metric, r in zip(workload.metrics, rows):
                    remark = getattr(result, "remarks", {}).get(metric.field)
                    if remark:
                        text = f"{name}, {workload.name}: {remark}"
                        if text not in self.remarks:
                            self.remarks.append(text)
                        r.remarks[name] = self.footnote(text)
        self.rows += rows
        self.leftovers += [{"workload": workload.name, "launcher": name, "processes": count}
                           for name, count in outcome.leftovers.items()]

    def notes(self) -> list[str]:
        return [f"{x['workload']}: {x['launcher']}: {x['processes']} process(es) outlived the launcher"
                for x in self.leftovers]


def run_workloads(names: list[str], sizes: Sizes) -> Results:
    results = Results()
    with harness.temp_root() as root:
        for w in WORKLOADS:
            if w.name in names:
                title = w.title(sizes)
                harness.progress(f"{title} ...")
                results.add(w, title, harness.measure(w.name, partial(w.run, sizes=sizes), w.reps(sizes), root))
    return results


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="fewer repetitions and smaller sizes: about three minutes on 2 cores")
    mode.add_argument("--tiny", action="store_const", dest="mode", const="tiny",
                      help="the smallest sizes, one run each: keeps the harness from rotting")
    names = [w.name for w in WORKLOADS]
    p.add_argument("--only", metavar="NAMES", help="comma-separated workloads to run: " + ",".join(names))
    p.add_argument("--json", metavar="FILE", help="also write the rows and raw samples as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the ratios against the goals (needs matplotlib)")
    args = p.parse_args(argv)
    args.mode = args.mode or "full"
    args.only = args.only.split(",") if args.only else names
    unknown = set(args.only) - set(names)
    if unknown:
        p.error(f"unknown workload(s) {','.join(sorted(unknown))}; choose among {','.join(names)}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.plot:
        report.require_matplotlib()
    load = os.getloadavg()[0]  # others' work on the machine skews every figure: say how busy it was
    started = time.monotonic()
    results = run_workloads(args.only, MODES[args.mode])
    wall = time.monotonic() - started
    subtitle = f"{args.mode} mode on {report.machine()}; {report.versions()}; load average {load:.2f} at start"
    print(f"launcher vs torchrun ({subtitle})\n")
    print(report.table(results.rows, results.footnotes))
    for note in results.notes():
        print(f"  note: {note}")
    print(f"\nwall time {wall:.0f} s: python bench/run.py" + ("" if args.mode == "full" else f" --{args.mode}"))
    if args.json:
        report.write_json(args.json, {
            "mode": args.mode, "machine": report.machine(), "load_average": load, "wall_s": wall,
            "errors": results.errors, "remarks": results.remarks, "notes": results.notes(),
            "leftovers": results.leftovers}, results.rows)
    if args.plot:
        report.plot(results.rows, args.plot, subtitle)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
