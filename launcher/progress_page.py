"""A worker's progress page: the memory a worker's ``launcher.runtime.report`` writes its last step into and its launcher
reads, shared through a memory file (memfd) the launcher makes and passes to the worker (``PROGRESS_FD``). No
socket, no file on disk, no system call on the worker's side: a report is a copy into memory, which never blocks
and never fails the step; the launcher reads the page when it looks (hangs, the monitor).

The page: a sequence number (8 bytes, odd while a report is being written), the report's length (4 bytes), the
report (JSON, at most BODY bytes). The launcher takes a report only when the number was even and the same before
and after it read the report, so it never takes half of one; what the worker wrote is untrusted (``decode``)."""

from __future__ import annotations

import json
import math
import struct
from typing import Optional

SIZE = 4096
HEAD = struct.Struct("<QI")  # sequence number, length
BODY = SIZE - HEAD.size
MAX_SCALARS = 32
MAX_NAME = 64


def write(page, sequence: int, body: bytes) -> int:
    """``body`` as the page's report, after the report numbered ``sequence``; the new report's number."""
    body = body[:BODY]
    page[0:8] = struct.pack("<Q", sequence + 1)  # odd: being written
    page[8:12] = struct.pack("<I", len(body))
    page[HEAD.size:HEAD.size + len(body)] = body
    page[0:8] = struct.pack("<Q", sequence + 2)
    return sequence + 2


def read(page) -> tuple:
    """(sequence number, report bytes or None): None while one is being written, or none was."""
    for _ in range(3):
        sequence, length = HEAD.unpack_from(page, 0)
        if sequence == 0 or sequence % 2 or length > BODY:
            continue
        body = bytes(page[HEAD.size:HEAD.size + length])
        if HEAD.unpack_from(page, 0)[0] == sequence:
            return sequence, body
    return HEAD.unpack_from(page, 0)[0], None


def encode(step: Optional[int], wall: float, scalars: dict, compute: Optional[float] = None) -> bytes:
    """A report: the step (a whole number, or None), the worker's clock, its finite numbers by name, and the step's
    compute time (seconds of its own work, without its waits in collectives) where known."""
    kept = {str(k)[:MAX_NAME]: float(v) for k, v in list(scalars.items())[:MAX_SCALARS]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v)}
    doc = {"step": step, "t": wall, "scalars": kept}
    if _seconds(compute):
        doc["compute"] = float(compute)
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(body: bytes) -> Optional[dict]:
    """A report read back, checked: {"step": int or None, "t": float, "scalars": {name: float}, "compute": float or
    None}; None if it is not one (a ``compute`` that is not a finite number >= 0 reads as None)."""
    try:
        report = json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(report, dict):
        return None
    step, wall, scalars = report.get("step"), report.get("t"), report.get("scalars")
    if step is not None and (type(step) is not int or not 0 <= step < 2**63):
        return None
    if type(wall) not in (int, float) or not _finite(wall) or not isinstance(scalars, dict):
        return None
    kept = {k: float(v) for k, v in list(scalars.items())[:MAX_SCALARS]
            if isinstance(k, str) and len(k) <= MAX_NAME and k.isprintable()
            and type(v) in (int, float) and _finite(v)}
    compute = report.get("compute")
    return {"step": step, "t": float(wall), "scalars": kept, "compute": float(compute) if _seconds(compute) else None}


def _seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value) and value >= 0


def _finite(number) -> bool:
    """Whether a number is a finite float (an int past a float's range is not: float() of it raises)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False
