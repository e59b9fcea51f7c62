"""Each node's worker ports: nodes that share a host (the same address in the node list) take the
ports after those of the nodes before them on it (as many as each node has workers). Pure.

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


def every_node(node_ips: tuple, first: tuple, given_as: str, counts: tuple = ()) -> tuple:
    """The worker ports of each node, by node rank; ``first``: the ports of the first node at each
    address, ``given_as``: how messages name its start port (``--started_port 6070``); ``counts``: each node's
    number of workers where they differ (an elastic round's nodes of different sizes; (): ``len(first)`` each).
    A node takes as many ports from the start as it has workers, after those of the nodes before it on its host."""
    counts = tuple(counts) or (len(first),) * len(node_ips)
    nodes, taken = Counter(), Counter()  # address -> the nodes before on that host, and the ports they take
    ports = []
    for rank, (ip, count) in enumerate(zip(node_ips, counts)):
        shift = taken[ip]
        mine = tuple(first[0] + shift + k for k in range(count)) if first else ()
        if mine and mine[-1] > HIGHEST_PORT:
            raise LaunchError(f"{given_as}: node {rank} ({ip}) shares its host with {nodes[ip]} node(s) before it, so "
                              f"its {count} worker(s) would take ports {mine[0]} to {mine[-1]}, beyond {HIGHEST_PORT}; "
                              f"choose a start port of at most {HIGHEST_PORT + 1 - shift - count}.")
        nodes[ip], taken[ip] = nodes[ip] + 1, shift + count
        ports.append(mine)
    return tuple(ports)


def on_host_of(node_ips: tuple, node: int, ports: tuple) -> tuple:
    """Every port that the nodes at ``node``'s address use (``ports``: each node's, by node rank)."""
    return tuple(p for ip, mine in zip(node_ips, ports) if ip == node_ips[node] for p in mine)


def sharing(node_ips: tuple, node: int) -> tuple:
    """The other nodes at ``node``'s address, by node rank."""
    return tuple(i for i, ip in enumerate(node_ips) if ip == node_ips[node] and i != node)
