"""What ``launcher tune`` says: a line per trial as it ends, the live line while one runs, the table of the settings
by rate at the end, and the plot of the trials (``--plot``, with the bench extra's matplotlib)."""

from __future__ import annotations

from launcher.output.reports import table
from launcher.plan.tune_search import DEFAULTS, Result, noise_between
from launcher.plan.tune_space import label


def rate_text(rate: float, spread: float, metric: str) -> str:
    share = f" ±{100 * spread / rate:.1f}%" if rate else ""
    return f"{rate:.4g} {metric}/s{share}"


def trial_line(number: int, result: Result, metric: str) -> str:
    head = f"tune: trial {number}: {label(result.point)}: "
    if result.rate is None:
        return head + f"failed: {result.why}"
    r = result.rate
    return head + f"{rate_text(r.rate, r.spread, metric)} over {r.steps} steps, {r.seconds:.1f} s ({result.why})"


def progress_line(number: int, point: tuple, seconds: float, rate, metric: str) -> str:
    measured = rate_text(rate.rate, rate.spread, metric) if rate is not None else "warming up"
    return f"tune: trial {number}: {label(point)}: {seconds:.0f} s, {measured}"


def final_lines(standings: list, metric: str, command: str, out: str) -> list:
    """The table (fastest first), the best against the defaults, and the command that runs the best."""
    defaults = next((s for s in standings if s.point == DEFAULTS), None)
    rows = [("rate", "spread", "trials", "vs defaults", "settings")]
    for s in standings:
        ratio = f"{s.rate / defaults.rate:.2f}x" if defaults is not None and defaults.rate else "-"
        rows.append((f"{s.rate:.4g} {metric}/s", f"±{100 * s.spread / s.rate:.1f}%" if s.rate else "-",
                     str(s.trials), ratio, label(s.point)))
    lines = ["tune: the settings by rate:"] + table(rows)
    space = [s for s in standings if s.point != DEFAULTS]
    best = space[0]
    second = space[1] if len(space) > 1 else None
    if noise_between(best, second):
        lines.append(f"tune: within noise: the best ({label(best.point)}) and the next ({label(second.point)}) "
                     "overlap; either will do")
    if defaults is not None and defaults.rate:
        lines.append(f"tune: best: {label(best.point)}, {best.rate / defaults.rate:.2f}x the program's own settings")
    else:
        lines.append(f"tune: best: {label(best.point)}")
    lines.append(f"tune: kept in {out}; run it with: {command}")
    return lines


def plot_formats() -> list:
    """The file name endings matplotlib can draw to (png, pdf, svg, ...)."""
    import matplotlib  # there: launcher.cli.tune made sure

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return sorted(FigureCanvasAgg(Figure()).get_supported_filetypes())


def plot(path: str, results: list, metric: str) -> None:
    """Each trial's rate (with its spread) in the order run, failed ones marked at zero: a PNG at ``path``."""
    import matplotlib  # there: launcher.cli.tune made sure before the first trial

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(results) * 0.4), 4))
    xs = range(1, len(results) + 1)
    rates = [r.rate.rate if r.rate else 0.0 for r in results]
    errors = [r.rate.spread if r.rate else 0.0 for r in results]
    colors = ["tab:blue" if r.rate else "tab:red" for r in results]
    ax.bar(xs, rates, yerr=errors, color=colors)
    ax.set_xticks(list(xs), [label(r.point) for r in results], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel(f"{metric}/s")
    ax.set_title("launcher tune: each trial (red: failed)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
