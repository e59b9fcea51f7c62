"""Each node's worker ports: nodes that share a host (the same address in the node list) take the
ports after those of the nodes before them on it. Pure.

Every node computes the same ports for every node from the plan alone (the node list and the first
node's ports), so that every worker is given the same endpoint list. Nodes on hosts of their own
all use the first node's ports, as on separate machines; the second node listed at an address takes
the next ``len(first)`` ports, the third the ones after those, and so on. Two nodes written as two
addresses of one machine (``127.0.0.1,127.0.0.2``) are two hosts here, as they are on the network.
"""

from __future__ import annotations

from collections import Counter

from launcher.errors import LaunchError

HIGHEST_PORT = 65535


def every_node(node_ips: tuple, first: tuple, given_as: str) -> tuple:
    """The worker ports of each node, by node rank; ``first``: the ports of the first node at each
    address, ``given_as``: how messages name its start port (``--started_port 6070``)."""
    before = Counter()
    ports = []
    for rank, ip in enumerate(node_ips):
        shift = before[ip] * len(first)
        before[ip] += 1
        mine = tuple(p + shift for p in first)
        if mine and mine[-1] > HIGHEST_PORT:
            raise LaunchError(f"{given_as}: node {rank} ({ip}) shares its host with {before[ip] - 1} node(s) before it, so "
                              f"its {len(first)} worker(s) would take ports {mine[0]} to {mine[-1]}, beyond {HIGHEST_PORT}; "
                              f"choose a start port of at most {HIGHEST_PORT + 1 - len(first) * before[ip]}.")
        ports.append(mine)
    return tuple(ports)


def on_host_of(node_ips: tuple, node: int, ports: tuple) -> tuple:
    """Every port that the nodes at ``node``'s address use (``ports``: each node's, by node rank)."""
    return tuple(p for ip, mine in zip(node_ips, ports) if ip == node_ips[node] for p in mine)


def sharing(node_ips: tuple, node: int) -> tuple:
    """The other nodes at ``node``'s address, by node rank."""
    return tuple(i for i, ip in enumerate(node_ips) if ip == node_ips[node] and i != node)
