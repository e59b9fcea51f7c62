"""Why a job (or one attempt of it) stopped, as every node reports it, and what follows from it across attempts
and nodes: a restart or the end, and the nodes still waited for. Pure; ``launcher.plan.policy`` re-exports it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Tuple

# Encoded bytes of a cause's parts that go to the other nodes: within one control message (64 KiB) together
WIRE_TEXT_BYTES, WIRE_SUMMARY_BYTES, WIRE_ERROR_BYTES = 4000, 36000, 20000
WIRE_SUMMARY = 8000  # characters of a summary kept at most (fewer where they take more than one byte)


def _json_size(text: str) -> int:
    return len(json.dumps(text))


def _fit(text: str, budget: int, keep_end: bool = False) -> str:
    """``text`` cut (its start kept, or its end) to at most WIRE_SUMMARY characters and ``budget`` bytes of JSON."""
    cut = "[...]"
    if len(text) <= WIRE_SUMMARY and _json_size(text) <= budget:
        return text
    low, high = 0, min(len(text), WIRE_SUMMARY)  # the most characters that fit: bisection
    while low < high:
        mid = (low + high + 1) // 2
        part = text[-mid:] if keep_end else text[:mid]
        if _json_size(part) + len(cut) <= budget:
            low = mid
        else:
            high = mid - 1
    if low == 0:
        return cut
    return cut + text[-low:] if keep_end else text[:low] + cut


def one_line(text: str, limit: int = 1000) -> str:
    """A peer's text as one printable line (no newline, no terminal escape), at most ``limit`` characters."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


@dataclass(frozen=True)
class Cause:
    """Why a job (or one attempt of it) stopped, as every node reports it."""

    node: int
    kind: str  # "worker" failed, "signal" to a launcher, "start" failed, "hang", "lost" node, "join" never
    code: int  # the exit code every launcher of the job ends with
    text: str  # one sentence
    summary: str = ""  # the lines to show: the failing rank, its log, its last lines
    error: str = ""  # the failing worker's @record (its TORCHELASTIC_ERROR_FILE) as JSON text; "" without one

    @property
    def restartable(self) -> bool:
        return self.kind in ("worker", "hang")

    def as_dict(self) -> dict:
        """For the wire: within one control message whatever the worker printed. Each part is cut to a
        budget of encoded bytes (a character may take 12 bytes of JSON): the text's start, the summary's
        end; the @record JSON goes whole or not at all (the other nodes then describe the cause from
        the text and summary)."""
        error = self.error if _json_size(self.error) <= WIRE_ERROR_BYTES else ""
        return {"node": self.node, "kind": self.kind, "code": self.code, "text": _fit(self.text, WIRE_TEXT_BYTES),
                "summary": _fit(self.summary, WIRE_SUMMARY_BYTES, keep_end=True), "error": error}

    @classmethod
    def from_dict(cls, d) -> Optional["Cause"]:
        """From a peer's message; None when it is not one (each field of its type: no conversion)."""
        if not isinstance(d, dict):
            return None
        node, kind, code, text, summary, error = (d.get(k) for k in ("node", "kind", "code", "text", "summary", "error"))
        if type(node) is not int or type(code) is not int or not 0 <= code <= 255 or node < 0:
            return None
        if not (isinstance(kind, str) and isinstance(text, str) and isinstance(summary, (str, type(None)))
                and isinstance(error, (str, type(None)))):
            return None
        return cls(node, kind, code, one_line(text), summary or "", error or "")


def after_attempt(attempt: int, max_restarts: int, cause: Optional[Cause]) -> Tuple[str, int]:
    """("restart", next attempt) or ("end", exit code), once every node is done with an attempt."""
    if cause is None:
        return "end", 0
    if cause.restartable and attempt < max_restarts:
        return "restart", attempt + 1
    return "end", cause.code


def still_due(joined, reported, gone) -> tuple:
    """The nodes node 0 still waits for once its own part of an attempt is over: every joined node
    that has neither reported nor been lost. A node that never joined is not waited for: when this
    node's workers all exited 0 the job's work here is done (it ends with 0, naming that node), and
    when they failed the job ends with that failure."""
    return tuple(sorted(set(joined) - set(reported) - set(gone)))


def never_joined(node_count: int, ever_joined) -> tuple:
    """The nodes (1 to node_count - 1) that have not joined node 0 even once."""
    return tuple(n for n in range(1, node_count) if n not in ever_joined)
