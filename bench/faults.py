"""Faults for a node of a job on one machine: slowed, powered off, frozen, cut off from the others.

A "node" is a launcher and everything it starts, held together by a cgroup of its own (``CpuGroup``): the
launcher enters it before it forks anything (``enter_command``), so its workers and their children are
in it too, in whatever session or process group they make. On that cgroup:

- **slow**: ``group.limit(0.05)`` gives the whole node 5% of one CPU (cgroup v1 ``cpu.cfs_quota_us``, v2
  ``cpu.max``); ``group.lift()`` gives it back;
- **power off**: ``group.signal(SIGKILL)``, every process of the node at once (swept until none is left);
- **freeze / thaw**: ``group.signal(SIGSTOP)`` / ``group.signal(SIGCONT)``.

``Network`` puts each node in a network namespace of its own, with a veth pair into a bridge that lives in a
namespace of its own too (so the host's interfaces and routes are never touched); the nodes get 10.213.0.N/24
(N = 1, 2, ...; the bridge 10.213.0.254, where an etcd may listen), addresses that exist only inside those
namespaces. ``network.cut(node)`` drops every packet of the node but its loopback's, with nftables (else
iptables) inside its own namespace; ``network.heal(node)`` removes the rule. Leaving the ``with`` block
removes every namespace (their veths go with them), also on an error or Ctrl-C.

Everything here needs root and ``ip`` (namespaces) and ``nft`` or ``iptables`` (a partition): where one is
missing, ``Unavailable`` says which, in one sentence (the tests turn it into a skip).

``python bench/faults.py enter [--netns NAME] [--cgroup DIR] -- ARGV...`` joins the cgroup and the namespace,
then execs ARGV (the same process: its pid is the pid of what ARGV runs).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Optional

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the CPU quota's period
SUBNET = "10.213.0"  # addresses of the nodes' namespaces only
BRIDGE_IP = f"{SUBNET}.254"
IFNAME = "gp0"  # the node's end of its veth, inside its namespace (the same name in each: GLOO_SOCKET_IFNAME)
CLONE_NEWNET = 0x40000000
TABLE = "goodput_partition"


class Unavailable(Exception):
    """A fault cannot be made here (no root, no tool, no cgroup); the message says what is missing."""


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise Unavailable(f"{what} needs root")


def require_tool(name: str, what: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise Unavailable(f"{what} needs {name}, which is not installed")
    return found


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (bounded); its output is returned, and a failure raised with the command's stderr."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[:300]}")
    return done


# ---------------------------------------------------------------- a node's cgroup


def cgroup_version() -> int:
    """2 on a unified hierarchy, 1 where the cpu controller has a hierarchy of its own."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return 1
    raise Unavailable("a CPU quota needs the cpu controller of cgroup v1 or v2, and neither is mounted")


def signal_sweeps(pids, sig: int, sweeps: int = 3) -> list:
    """``sig`` to every process ``pids()`` gives, collected first and then signalled in one sweep, again for any
    process started in between (``sweeps`` at most); the pids signalled."""
    done: list = []
    for _ in range(sweeps):
        fresh = [pid for pid in pids() if pid not in done]
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        done += fresh
    return done


class CpuGroup:
    """A cgroup that holds one node: its processes, a CPU quota, and signals to all of them."""

    def __init__(self, path: Path, version: int):
        self.path, self.version = path, version

    @classmethod
    def create(cls, name: str) -> "CpuGroup":
        require_root("a cgroup of a node")
        version = cgroup_version()
        parent = CGROUP_ROOT / "cpu" if version == 1 else CGROUP_ROOT
        if version == 2 and "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
            try:
                (parent / "cgroup.subtree_control").write_text("+cpu")
            except OSError as e:
                raise Unavailable(f"cgroup v2's cpu controller cannot be enabled at {parent} ({e.strerror})") from None
        path = parent / name
        try:
            path.mkdir()
        except OSError as e:
            raise Unavailable(f"cannot make the cgroup {path} ({e.strerror})") from None
        return cls(path, version)

    def limit(self, cpus: float) -> None:
        """At most ``cpus`` of one CPU for every process of the node together."""
        quota = max(1000, int(cpus * PERIOD_US))
        if self.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")

    def lift(self) -> None:
        if self.version == 1:
            (self.path / "cpu.cfs_quota_us").write_text("-1")
        else:
            (self.path / "cpu.max").write_text(f"max {PERIOD_US}")

    def pids(self) -> list:
        """Every process in the cgroup and in the cgroups below it (a launcher may make its own below)."""
        found = []
        for folder, _, _ in os.walk(self.path):
            try:
                found += [int(p) for p in Path(folder, "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return found

    def signal(self, sig: int, sweeps: int = 5) -> list:
        """``sig`` to every process of the node, swept again for processes forked meanwhile; the pids signalled."""
        return signal_sweeps(self.pids, sig, sweeps)

    def kill_all(self, timeout: float = 10.0) -> bool:
        """SIGKILL (and SIGCONT, for stopped ones) until the cgroup is empty, bounded; whether it is."""
        deadline = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() > deadline:
                return False
            self.signal(signal.SIGKILL, sweeps=1)
            self.signal(signal.SIGCONT, sweeps=1)
            time.sleep(0.05)
        return True

    def remove(self) -> None:
        """Every process killed, then the cgroup and any below it removed (deepest first)."""
        if not self.path.exists():
            return
        if self.version == 1 or (self.path / "cpu.max").exists():
            try:
                self.lift()
            except OSError:
                pass
        self.kill_all()
        for folder, _, _ in sorted(os.walk(self.path), key=lambda w: -len(w[0])):
            try:
                os.rmdir(folder)
            except OSError:
                pass


# ---------------------------------------------------------------- the nodes' network


def firewall() -> str:
    """``nft`` where it is installed, else ``iptables``."""
    if shutil.which("nft"):
        return "nft"
    if shutil.which("iptables"):
        return "iptables"
    raise Unavailable("a partition needs nftables (nft) or iptables, and neither is installed")


class Network:
    """A bridge in a namespace of its own, and one namespace per node with a veth into it."""

    def __init__(self, prefix: Optional[str] = None):
        require_root("network namespaces")
        require_tool("ip", "network namespaces")
        self.prefix = prefix or f"gp{uuid.uuid4().hex[:6]}"
        self.bridge_ns = f"{self.prefix}-br"
        self.namespaces: list = []  # every namespace made, the bridge's first
        self.cut_nodes: set = set()

    def __enter__(self) -> "Network":
        try:
            self._add_ns(self.bridge_ns)
            self._ip(self.bridge_ns, "link", "add", "gpbr", "type", "bridge")
            self._ip(self.bridge_ns, "addr", "add", f"{BRIDGE_IP}/24", "dev", "gpbr")
            self._ip(self.bridge_ns, "link", "set", "gpbr", "up")
            self._ip(self.bridge_ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        done = sh("ip", "netns", "add", name, check=False)
        if done.returncode != 0:
            raise Unavailable(f"cannot make a network namespace ({done.stderr.strip()[:200]})")
        self.namespaces.append(name)

    @staticmethod
    def _ip(ns: str, *args: str) -> None:
        sh("ip", "-n", ns, *args)

    def ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    @staticmethod
    def address(node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def add_node(self, node: int) -> str:
        """Node ``node``'s namespace, its veth up with ``address(node)``; the namespace's name."""
        ns, peer = self.ns(node), f"p{node}"
        self._add_ns(ns)
        sh("ip", "link", "add", f"{self.prefix}v{node}", "netns", ns, "type", "veth", "peer", "name", peer,
           "netns", self.bridge_ns)
        self._ip(ns, "link", "set", f"{self.prefix}v{node}", "name", IFNAME)
        self._ip(ns, "addr", "add", f"{self.address(node)}/24", "dev", IFNAME)
        self._ip(ns, "link", "set", IFNAME, "up")
        self._ip(ns, "link", "set", "lo", "up")
        self._ip(self.bridge_ns, "link", "set", peer, "master", "gpbr")
        self._ip(self.bridge_ns, "link", "set", peer, "up")
        return ns

    def cut(self, node: int) -> None:
        """Drop every packet into or out of the node but its loopback's (inside its namespace)."""
        ns = self.ns(node)
        if firewall() == "nft":
            rules = (f"table inet {TABLE} {{\n"
                     f"  chain in {{ type filter hook input priority 0; iifname != \"lo\" drop; }}\n"
                     f"  chain out {{ type filter hook output priority 0; oifname != \"lo\" drop; }}\n}}\n")
            done = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                                  capture_output=True, timeout=30)
            if done.returncode != 0:
                raise RuntimeError(f"nft in {ns}: {done.stderr.strip()[:300]}")
        else:
            for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
                sh("ip", "netns", "exec", ns, "iptables", "-I", chain, "!", flag, "lo", "-j", "DROP")
        self.cut_nodes.add(node)

    def heal(self, node: int) -> None:
        ns = self.ns(node)
        if firewall() == "nft":
            sh("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", TABLE)
        else:
            for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
                sh("ip", "netns", "exec", ns, "iptables", "-D", chain, "!", flag, "lo", "-j", "DROP")
        self.cut_nodes.discard(node)

    def close(self) -> None:
        """Every namespace made removed (their veths, rules and bridge with them), the nodes' first."""
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


def leftover_namespaces(prefix: str) -> list:
    """Namespaces whose name starts with ``prefix`` (for a test's check that none is left)."""
    return [line.split()[0] for line in sh("ip", "netns", "list", check=False).stdout.splitlines()
            if line.startswith(prefix)]


# ---------------------------------------------------------------- starting a node's launcher


def enter_command(argv: list, netns: Optional[str] = None, cgroup: Optional[CpuGroup] = None) -> list:
    """``argv`` run from inside ``cgroup`` and network namespace ``netns`` (this module's ``enter``)."""
    wrap = [sys.executable, str(Path(__file__).resolve()), "enter"]
    if netns:
        wrap += ["--netns", netns]
    if cgroup is not None:
        wrap += ["--cgroup", str(cgroup.path)]
    return [*wrap, "--", *argv]


def _setns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def enter(netns: Optional[str], cgroup: Optional[str], argv: list) -> None:
    if cgroup:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    if netns:
        _setns(netns)
    os.execvp(argv[0], argv)


def main(argv: list) -> int:
    """``enter [--netns NAME] [--cgroup DIR] -- ARGV...``"""
    if "--" not in argv or argv[:1] != ["enter"]:
        print("usage: faults.py enter [--netns NAME] [--cgroup DIR] -- ARGV...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="faults.py enter")
    parser.add_argument("--netns")
    parser.add_argument("--cgroup")
    args = parser.parse_args(argv[1:split])
    enter(args.netns, args.cgroup, argv[split + 1:])
    return 127  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
