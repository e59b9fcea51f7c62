"""Bytes from outside (the network, etcd, a file another process writes) read without raising."""

from __future__ import annotations

import json
from typing import Optional, Union


def json_object(data: Union[str, bytes]) -> Optional[dict]:
    """The JSON object in ``data``; None for what is not one (not JSON, not UTF-8, nested past the parser, a number
    past int's digits, another type)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return value if isinstance(value, dict) else None
