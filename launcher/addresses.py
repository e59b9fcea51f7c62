"""``HOST[:PORT]`` read once, for the launcher and its workers alike: a host name or an IP address, and a port. Pure.

A host is a name (letters, digits, ``-``, ``_`` and dots, not digits and dots alone), an IPv4 address or an IPv6
one. An IPv6 address with a port is written in brackets, as in a URL: ``[::1]:29500``, ``[fe80::1%eth0]:29500``
(its zone kept); ``[::1]`` alone is a host with no port. A bare IPv6 address (two colons or more, no brackets) is a
host with no port: its last group is never read as one (``fe80::1:29500`` is itself an address, and reading it
both ways would connect to the wrong place), and where a port is needed the refusal says to write the brackets.
A refusal is a ``NotAnAddress``: the rest of a sentence after the value, to which the caller adds its option's name
and the fix. Nothing of the launcher is imported here: the worker side reads its endpoints with it too.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Optional, Tuple

# The lowest port a HOST:PORT may name is 1: torch's parser of an endpoint takes 0 too, but port 0 asks the kernel
# for any free port, which the nodes that connect to this address could never find.
LOWEST_PORT = 1
HIGHEST_PORT = 65535
NAME = re.compile(r"[A-Za-z0-9_.-]+")  # an underscore too: docker compose's service names have one
DIGITS = re.compile(r"[0-9]+")  # ASCII only (fullmatch): "²".isdigit() is true, but int("²") fails


class NotAnAddress(ValueError):
    """What is wrong with a value, as the rest of a sentence after it (``is not HOST:PORT``, ``has no port``)."""


def split(text, default_port: Optional[int] = None) -> Tuple[str, int]:
    """``HOST[:PORT]`` as (host, port), the host without brackets; no port: ``default_port`` (None: one is needed)."""
    text = str(text).strip()
    host, port = _parts(text)
    if not is_host(host):
        raise NotAnAddress("is not HOST:PORT" if host else "has no host before its port")
    if port is None:
        if default_port is None:
            hint = f" (an IPv6 address takes its port in brackets: [{host}]:PORT)" if ":" in host else ""
            raise NotAnAddress(f"has no port{hint}")
        return host, default_port
    if not DIGITS.fullmatch(port) or not LOWEST_PORT <= int(port) <= HIGHEST_PORT:
        raise NotAnAddress(f"has the port {port!r}, not a whole number from {LOWEST_PORT} to {HIGHEST_PORT}")
    return host, int(port)


def _parts(text: str) -> Tuple[str, Optional[str]]:
    """(host, port text or None) of ``HOST[:PORT]``, ``[V6][:PORT]`` or a bare IPv6 address."""
    if text.startswith("["):
        inside, closed, rest = text[1:].partition("]")
        if not closed or ":" not in inside or (rest and not rest.startswith(":")):
            raise NotAnAddress("is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)")
        return inside, (rest[1:] if rest else None)
    if text.count(":") > 1:
        return text, None
    host, colon, port = text.partition(":")
    return host, (port if colon else None)


def is_host(text: str) -> bool:
    """A host name, an IPv4 address or an IPv6 one (its zone too)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(NAME.fullmatch(text)) and not text.replace(".", "").isdigit()  # 2379 alone is a port


def bracketed(host: str) -> str:
    """A host as an endpoint writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def joined(host: str, port: int) -> str:
    """``HOST:PORT`` (``[V6]:PORT``): what ``split`` reads back."""
    return f"{bracketed(host)}:{port}"
