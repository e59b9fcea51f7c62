"""torch's error files (``TORCHELASTIC_ERROR_FILE``): what a worker's ``@record`` wrote, and the job's root cause.

``torch.distributed.elastic.multiprocessing.errors.record`` writes a worker's uncaught exception as
``{"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "Traceback ...",
"timestamp": "..."}}}`` (or ``{"message": "text"}``). The launcher reads it into the failure summary,
and, when it was given such a file itself (by a scheduler, as torchrun is), writes the root cause there
in the same format. Standard library only.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from typing import Optional

from launcher.untrusted import json_object

MAX_STACK = 16 * 1024  # characters of a worker's traceback carried to the other nodes
SHOWN_LINES = 40  # lines of it in the failure summary


def read(path: Optional[str]) -> Optional[dict]:
    """The error file's JSON object; None when there is none (the worker did not use @record) or it is not one."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return loads(f.read())
    except OSError:
        return None


def loads(text: str) -> Optional[dict]:
    """A record carried as JSON text (from a peer node); None when it is empty or not one."""
    data = json_object(text) if text else None
    return data if data is not None and "message" in data else None


def traceback_of(data: Optional[dict]) -> str:
    """The worker's traceback (its message when the file has none)."""
    message = (data or {}).get("message")
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return ""
    extra = message.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return str(stack or message.get("message") or "")


def bounded(data: dict, limit: int = MAX_STACK) -> dict:
    """``data`` with its traceback cut to its last ``limit`` characters (a RecursionError's runs to 100 KB+),
    so that it fits in a control message to the other nodes."""
    message = data.get("message")
    extra = message.get("extraInfo") if isinstance(message, dict) else None
    if isinstance(message, str) and len(message) > limit:
        return {**data, "message": "..." + message[-limit:]}
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    if not isinstance(stack, str) or len(stack) <= limit:
        return data
    return {**data, "message": {**message, "extraInfo": {**extra, "py_callstack": "...\n" + stack[-limit:]}}}


def for_parent(data: dict, code: int) -> dict:
    """The worker's record as the launcher passes it on: its exit code set, as torchrun's agent does."""
    message = data.get("message")
    if isinstance(message, dict):
        return {**data, "message": {**message, "errorCode": code}}
    return data


def of_cause(text: str, summary: str, code: int, now: float) -> dict:
    """A record of a root cause that no worker's @record wrote (a signal, a lost node, no @record)."""
    return {"message": {"message": text, "extraInfo": {"py_callstack": summary, "timestamp": str(int(now))},
                        "errorCode": code}}


def write(path: str, data: dict) -> Optional[str]:
    """Write ``data`` to ``path`` (replacing what was there); the reason when it could not be written."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)
    except OSError as e:
        return e.strerror or str(e)
    return None


def remove(path: Optional[str]) -> None:
    """A stale record (an earlier attempt's) must not be taken for this attempt's."""
    if path:
        with suppress(OSError):
            os.unlink(path)
