"""What users and schedulers write, parsed and checked: whole numbers, hosts, node lists, endpoints, ports. Pure.

Every refusal is a LaunchError of one sentence that names the value and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from launcher import addresses
from launcher.errors import LaunchError

DIGITS = addresses.DIGITS
INTEGER = re.compile(r"-?[0-9]+")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class NodeRange:
    """A number of nodes as written: ``N`` (``low == high``) or ``MIN:MAX``."""

    low: int
    high: int
    text: str

    @property
    def elastic(self) -> bool:
        return self.low != self.high

    def __str__(self) -> str:
        return self.text


def node_range(text) -> NodeRange:
    """``N`` or ``MIN:MAX`` (1 <= MIN <= MAX): the one parser of a number of nodes, whoever wrote it. A bad one raises
    ValueError with the rest of the sentence after the value (the caller names the option or variable)."""
    if isinstance(text, NodeRange):
        return text
    text = str(text).strip()
    parts = text.split(":")
    if len(parts) > 2 or not all(DIGITS.fullmatch(p.strip()) for p in parts):
        raise ValueError("is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1 and len(parts) == 1:
        raise ValueError("is not a number of nodes; give 1 or more")
    if low < 1:
        raise ValueError(f"has a minimum of 0 nodes; give 1 or more, such as 1:{max(high, 1)}")
    if low > high:
        raise ValueError(f"has its minimum above its maximum; give MIN:MAX with MIN at most MAX, such as {high}:{low}")
    return NodeRange(low, high, text)


def parse_endpoint(text: str, name: str):
    """``host:port`` (``[v6]:port``) as (host, port) (``launcher.addresses``)."""
    try:
        return addresses.split(text)
    except addresses.NotAnAddress as e:
        raise LaunchError(f"{name} has the endpoint {text!r}, which {e}; give comma-separated host:port pairs such as "
                          "10.0.0.1:6170.") from None


def port_range(first: int, count: int, given_as: str) -> tuple:
    """Ports ``first`` to ``first + count - 1``; ``given_as`` names the start port as the user gave it."""
    if not 1 <= first or first + count - 1 > 65535:
        raise LaunchError(f"{given_as} with {count} workers needs ports {first} to {first + count - 1}, outside 1-65535; choose a start port between 1024 and {65535 - count + 1}.")
    return tuple(range(first, first + count))


def parse_node_list(text: str, name: str) -> tuple:
    """Every node's address, in node-rank order; an address listed more than once is nodes that share a host."""
    nodes = tuple(n.strip() for n in text.split(","))
    for n in nodes:
        if not is_valid_host(n):
            raise LaunchError(f"{name}={text} has a malformed address {n!r}; give comma-separated IPs or host names, such as 192.168.0.1,192.168.0.2.")
    return nodes


def is_valid_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(HOSTNAME.match(text)) and not text.replace(".", "").isdigit()


def node_rank_of(node_ips: tuple, node_ip: str, name: str, list_name: str, rank: Optional[int] = None,
                 rank_name: str = "--rank") -> int:
    """This node's place in ``node_ips``: ``rank`` when given (its address must be ``node_ip``), else the one
    place of ``node_ip``; an address listed more than once (nodes sharing a host) needs the rank."""
    listed = ",".join(node_ips)
    if rank is not None:
        if not 0 <= rank < len(node_ips):
            raise LaunchError(f"{rank_name} {rank} is not a node of {list_name} {listed}; give 0 to {len(node_ips) - 1}.")
        if node_ips[rank] != node_ip:
            raise LaunchError(f"{rank_name} {rank} is node {node_ips[rank]} of {list_name} {listed}, but {name} is {node_ip}; give one of them.")
        return rank
    if node_ip not in node_ips:
        raise LaunchError(f"{name} {node_ip} is not in {list_name} {listed}; give this node's address as it appears in that list.")
    places = [i for i, ip in enumerate(node_ips) if ip == node_ip]
    if len(places) > 1:
        times = "twice" if len(places) == 2 else f"{len(places)} times"
        raise LaunchError(f"{list_name} {listed} lists {node_ip} {times} (nodes {spoken_list(places)} share that host), so {name} "
                          f"{node_ip} does not say which node this is; give this node's rank with {rank_name} ({spoken_list(places, 'or')}).")
    return places[0]


def spoken_list(numbers: list, word: str = "and") -> str:
    """``0, 1 and 3`` (or ``0, 1 or 3``)."""
    return ", ".join(map(str, numbers[:-1])) + f" {word} {numbers[-1]}"


def node_endpoints(node_ips: Sequence[str], node_ports: Sequence[Sequence[int]]) -> list:
    """Every worker's endpoint in rank order: each node's address with each of its own ports."""
    return [addresses.joined(ip, p) for ip, ports in zip(node_ips, node_ports) for p in ports]


def first_duplicate(items: Sequence[str]) -> Optional[str]:
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None
