"""What is reported: goals, the rows of the table, the table itself, the JSON file and the plot.

Nothing here starts a process or knows a workload: rows are made from each launcher's results
(``rows_of``), each goal is data (a comparison, what is compared and a threshold), and whether
it is met is computed from the figures.
"""

from __future__ import annotations

import importlib.metadata
import json
import operator
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import psutil

SIDES = ("ours", "torchrun")  # the two columns, in this order


class Compare(Enum):
    AT_MOST = "<="
    AT_LEAST = ">="
    EQUAL = "="


class Target(Enum):
    """What a goal compares."""

    RATIO = "ratio"  # ours / torchrun, against the threshold
    OURS = "ours"  # our figure, against the threshold
    TORCHRUN = "torchrun"  # our figure, against torchrun's


_HOLDS = {Compare.AT_MOST: operator.le, Compare.AT_LEAST: operator.ge, Compare.EQUAL: operator.eq}


@dataclass(frozen=True)
class Goal:
    compare: Compare
    target: Target
    threshold: float = 1.0

    def text(self) -> str:
        """As the table shows it: ``<= 0.1`` (a ratio), ``= 7`` (our figure), ``<= torchrun``."""
        against = "torchrun" if self.target is Target.TORCHRUN else f"{self.threshold:g}"
        return f"{self.compare.value} {against}"

    def met(self, ours: Any, torchrun: Any) -> Optional[bool]:
        """Whether the figures meet the goal; None when a side has no figure."""
        if ours is None or torchrun is None:
            return None
        value, reference = {
            Target.RATIO: (ratio(ours, torchrun), self.threshold),
            Target.OURS: (ours, self.threshold),
            Target.TORCHRUN: (ours, torchrun),
        }[self.target]
        if not (_is_number(value) and _is_number(reference)):
            return False  # no ratio, or exit codes that differed between runs
        return bool(_HOLDS[self.compare](value, reference))

    def ratio_mark(self) -> Optional[float]:
        """Where the goal lies on the axis of ratios (the plot's mark); None when it is not a ratio."""
        return {Target.RATIO: self.threshold, Target.TORCHRUN: 1.0}.get(self.target)


def ratio_at_most(limit: float) -> Goal:
    return Goal(Compare.AT_MOST, Target.RATIO, limit)


def ratio_at_least(limit: float) -> Goal:
    return Goal(Compare.AT_LEAST, Target.RATIO, limit)


def at_most_torchrun() -> Goal:
    return Goal(Compare.AT_MOST, Target.TORCHRUN)


def ours_equal(value: float) -> Goal:
    return Goal(Compare.EQUAL, Target.OURS, value)


def ours_at_most(value: float) -> Goal:
    return Goal(Compare.AT_MOST, Target.OURS, value)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def ratio(ours: Any, torchrun: Any) -> Optional[float]:
    """ours / torchrun; None when torchrun's figure is missing or 0."""
    if not (_is_number(ours) and _is_number(torchrun)) or torchrun == 0:
        return None
    return ours / torchrun


def same_codes(codes: list[Any]) -> Any:
    """An exit code, or all of them ("1/7") when the runs disagree (a code may be a word: "running")."""
    return codes[0] if len(set(codes)) == 1 else "/".join(sorted(set(map(str, codes)), key=lambda c: (len(c), c)))


@dataclass(frozen=True)
class Metric:
    field: str  # the attribute of a workload's result
    label: str
    goal: Optional[Goal] = None
    summary: Callable[[list], Any] = statistics.median  # over the runs of one launcher
    ratio: bool = True  # whether ours / torchrun means something


@dataclass
class Row:
    workload: str
    metric: str
    ours: Any
    torchrun: Any
    ratio: Optional[float]
    goal: Optional[Goal]
    met: Optional[bool]  # None: no goal, or a side has no figure
    samples: dict[str, list]  # launcher name -> every run's value
    errors: dict[str, int] = field(default_factory=dict)  # launcher name -> footnote number
    remarks: dict[str, int] = field(default_factory=dict)  # launcher name -> footnote on its figure


def rows_of(title: str, metrics: Sequence[Metric], results: dict[str, list]) -> list[Row]:
    """One row per metric, from each launcher's results (dataclasses holding the metrics' fields)."""
    rows = []
    for m in metrics:
        values = {side: [getattr(r, m.field) for r in results.get(side, [])] for side in SIDES}
        ours, theirs = (m.summary(values[side]) if values[side] else None for side in SIDES)
        met = m.goal.met(ours, theirs) if m.goal else None
        rows.append(Row(title, m.label, ours, theirs, ratio(ours, theirs) if m.ratio else None, m.goal, met, values))
    return rows


# ---------------------------------------------------------------- the table


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"
    return str(value)


HEADER = ("workload", "metric", "ours", "torchrun", "ratio", "goal", "met?")
MET = {True: "yes", False: "NO", None: "-"}


def figure(row: Row, side: str) -> str:
    if side in row.errors:
        return f"error [{row.errors[side]}]"
    text = fmt(getattr(row, side))
    return f"{text} [{row.remarks[side]}]" if side in row.remarks else text


def cells(row: Row, first: bool) -> tuple[str, ...]:
    ours, theirs = (figure(row, side) for side in SIDES)
    goal = row.goal.text() if row.goal else ""
    return (row.workload if first else "", row.metric, ours, theirs, fmt(row.ratio), goal, MET[row.met])


def table(rows: Sequence[Row], errors: Sequence[str]) -> str:
    """Aligned columns, the workload named on its first row only, then the numbered footnotes
    (errors, and remarks on figures)."""
    lines = [cells(r, i == 0 or r.workload != rows[i - 1].workload) for i, r in enumerate(rows)]
    widths = [max(len(c) for c in col) for col in zip(HEADER, *lines)]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [HEADER, *lines]]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out + [f"  [{i}] {e}" for i, e in enumerate(errors, 1)])


# ---------------------------------------------------------------- the JSON file


def row_json(row: Row) -> dict[str, Any]:
    goal = row.goal
    return {
        "workload": row.workload, "metric": row.metric, "ours": row.ours, "torchrun": row.torchrun,
        "ratio": row.ratio, "goal": goal.text() if goal else "", "met": row.met,
        "goal_spec": {"compare": goal.compare.value, "target": goal.target.value,
                      "threshold": goal.threshold} if goal else None,
        "samples": row.samples, "errors": row.errors, "remarks": row.remarks,
    }


def write_json(path: str, summary: dict[str, Any], rows: Sequence[Row]) -> None:
    """``summary`` (mode, machine, errors, ...) and every row with its raw samples."""
    Path(path).write_text(json.dumps({**summary, "rows": [row_json(r) for r in rows]}, indent=1, default=str))


# ---------------------------------------------------------------- the machine


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0))
    mem = psutil.virtual_memory().total / 2**30
    return f"{model}, {cpus} CPUs (nproc), {mem:.0f} GiB RAM, Linux {platform.release()}"


def versions() -> str:
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"Python {platform.python_version()}, torch {torch_version}"


# ---------------------------------------------------------------- the plot


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("--plot needs matplotlib, which is not installed: pip install 'launcher[bench]' "
                 "(or pip install matplotlib)")


def plot(rows: Sequence[Row], path: str, subtitle: str) -> None:
    """Bar chart of the ratios ours/torchrun (log scale) against the ratio goals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.ratio is not None]
    floor = 1e-3  # a ratio of 0 (ours used no CPU at all) still gets a visible bar on a log scale
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1.8))
    ys = list(range(len(shown)))
    colors = [{True: "tab:green", False: "tab:red", None: "tab:gray"}[r.met] for r in shown]
    ax.barh(ys, [max(r.ratio, floor) for r in shown], color=colors)
    for y, r in zip(ys, shown):
        ax.text(max(r.ratio, floor) * 1.05, y, fmt(r.ratio), va="center", fontsize=7)
        mark = r.goal.ratio_mark() if r.goal else None
        if mark is not None:
            ax.plot([mark, mark], [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="gray", linestyle=":", linewidth=1)
    ax.set_yticks(ys, [f"{r.workload.split(':')[0]} {r.metric}" for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ours / torchrun (black mark: goal; green: met, red: missed, gray: no goal)")
    ax.set_title("launcher vs torchrun\n" + subtitle.replace("; ", "\n"), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
