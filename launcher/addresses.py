"""``HOST[:PORT]`` read once, for the launcher and its workers alike: a host name or an IP address, and a port. Pure.

A host is a name (letters, digits, ``-``, ``_``, dots; not digits and dots alone), an IPv4 or an IPv6 address. An
IPv6 address takes its port in brackets, as in a URL: ``[::1]:29500``, ``[fe80::1%eth0]:29500``. A bare IPv6 address
(two colons or more) is a host with no port, never split at its last colon (``fe80::1:2950`` is an address too):
where a port is needed, the refusal says to write the brackets. A ``NotAnAddress`` is the rest of a sentence after
the value; the caller names the option and the fix. Nothing of the launcher is imported: the worker side uses it too.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Optional, Tuple

# The lowest port is 1: torch's endpoint parser takes 0 too, but port 0 asks the kernel for any free port, which
# the nodes that connect to this address could never find.
LOWEST_PORT, HIGHEST_PORT = 1, 65535
NAME = re.compile(r"[A-Za-z0-9_.-]+")  # an underscore too: docker compose's service names have one
DIGITS = re.compile(r"[0-9]+")  # ASCII only (fullmatch): "²".isdigit() is true, but int("²") fails


class NotAnAddress(ValueError):
    """What is wrong with a value, as the rest of a sentence after it (``is not HOST:PORT``, ``has no port``)."""


def split(text, default_port: Optional[int] = None) -> Tuple[str, int]:
    """``HOST[:PORT]`` as (host, port), the host without brackets; no port: ``default_port`` (None: one is needed)."""
    host, port = parts(str(text).strip())
    if not is_host(host):
        raise NotAnAddress("is not HOST:PORT" if host else "has no host before its port")
    if port is None and default_port is None:
        hint = f" (an IPv6 address takes its port in brackets: [{host}]:PORT)" if ":" in host else ""
        raise NotAnAddress(f"has no port{hint}")
    if port is not None and not (DIGITS.fullmatch(port) and LOWEST_PORT <= int(port) <= HIGHEST_PORT):
        raise NotAnAddress(f"has the port {port!r}, not a whole number from {LOWEST_PORT} to {HIGHEST_PORT}")
    return host, default_port if port is None else int(port)


def parts(text: str) -> Tuple[str, Optional[str]]:
    """(host, the text after its colon or None) of ``HOST[:TAIL]``, ``[V6][:TAIL]`` or a bare IPv6 address, unchecked:
    a port here, a hostfile's slots or GPU ids elsewhere (``launcher.plan.hostfile``)."""
    if text.startswith("["):
        inside, closed, rest = text[1:].partition("]")
        if not closed or ":" not in inside or (rest and not rest.startswith(":")):
            raise NotAnAddress("is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)")
        return inside, (rest[1:] if rest else None)
    host, colon, port = text.partition(":")
    return (text, None) if ":" in port else (host, port if colon else None)


def is_host(text: str) -> bool:
    """A host name, an IPv4 address or an IPv6 one (its zone too)."""
    try:
        return ipaddress.ip_address(text) is not None
    except ValueError:
        return bool(NAME.fullmatch(text)) and not text.replace(".", "").isdigit()  # 2379 alone is a port


def joined(host: str, port: int) -> str:
    """``HOST:PORT`` (``[V6]:PORT``): what ``split`` reads back."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
