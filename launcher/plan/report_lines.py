"""A report log's lines (``--report_log``) as they travel from another machine, pure: sent in batches of at most
MOST_LINES lines and, unless one line is longer, MOST_BYTES bytes (a host's lifeline under --hostfile, a following
tuner's link); kept where they arrive only if each is one JSON object on one line of at most LONGEST bytes."""

from __future__ import annotations

from typing import Sequence

from launcher.untrusted import json_object

MOST_LINES, MOST_BYTES = 256, 256 << 10
LONGEST = 64 << 10  # bytes of the longest line sent (the launcher's are well under 1 KiB)


def batches(lines: Sequence[bytes]) -> list:
    """``lines`` (without their newlines) as text, in batches."""
    out, batch, size = [], [], 0
    for text in (raw.decode(errors="replace") for raw in lines):
        if batch and (len(batch) >= MOST_LINES or size + len(text) > MOST_BYTES):
            out.append(batch)
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    return out + ([batch] if batch else [])


def kept(items) -> bytes:
    """The lines of a batch off the wire as they are kept, each ending with a newline: only text that is one JSON
    object on one line, of at most LONGEST bytes (anything else in ``items``, or ``items`` not a list: left out)."""
    texts = [item.encode(errors="replace") for item in items if isinstance(item, str)] if isinstance(items, list) else []
    return b"".join(text + b"\n" for text in texts if _one_object(text))


def _one_object(text: bytes) -> bool:
    return len(text) <= LONGEST and b"\n" not in text and b"\r" not in text and json_object(text) is not None
