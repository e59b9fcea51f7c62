"""The table ``--hostfile``'s command prints after checking every host: a line a host, its address, workers, ranks,
ports, and what failed (``ok`` when nothing did)."""

from __future__ import annotations

from typing import Sequence

HEADINGS = ("host", "address", "workers", "ranks", "ports", "check")


def hosts_table(rows: Sequence[tuple]) -> str:
    """``rows`` (one tuple of texts a host, in HEADINGS' order) as aligned columns, the last one left free."""
    lines = [HEADINGS, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADINGS) - 1)]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1] + "\n" for line in lines)
