"""A process group without torch, for the tests whose subject is the launcher, not torch: what a
worker's ``dist.init_process_group("gloo")`` relies on (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
the store that node 0's launcher serves there), used the way torch's own client uses it, at a
fraction of torch's 2 s of CPU per worker start. A test that runs real torch per path stays beside
the ones that use this.

The store is spoken in torch's TCPStore protocol (launcher/run/tcpstore_protocol.py says how): the
client opens with VALIDATE, and keys go under ``/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/`` as
torch's env:// rendezvous puts them when the agent serves the store
(torch/distributed/rendezvous.py, ``_create_c10d_store``). A sum is each rank's SET, a WAIT for
every rank's key, then a GET of each. Where no launcher serves the store (an etcd job: torch's env://
rule, rank 0 hosts it), ``HostedGroup`` stands in: rank 0 listens on MASTER_ADDR:MASTER_PORT, each
other rank connects there, says its rank, and sends each value on a line; rank 0 answers the sum.
Every connect and read is bounded (``TIMEOUT``): a worker whose peer or store is gone fails, it
does not hang.
"""

import json
import os
import socket
import struct
import time

MAGIC = 0x3C85F7CE  # torch's VALIDATE number
VALIDATE, SET, GET, WAIT = 0, 1, 3, 6
TIMEOUT = 60.0


def _sized(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


class StoreGroup:
    def __init__(self) -> None:
        env = os.environ
        self.rank, self.world = int(env["RANK"]), int(env["WORLD_SIZE"])
        self.prefix = f"/worker/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.calls = 0
        self.sock = None
        if self.world > 1:
            self.sock = _connect((env["MASTER_ADDR"], int(env["MASTER_PORT"])))  # torch's client retries too
            self.sock.sendall(struct.pack("<BI", VALIDATE, MAGIC))
            self.replies = self.sock.makefile("rb")

    def _read(self, n: int) -> bytes:
        data = self.replies.read(n)  # a buffered read: short only at the end of the stream
        if len(data) < n:
            raise SystemExit("store_group: the store closed the connection")
        return data

    def all_reduce(self, value: float) -> float:
        """The sum of every rank's ``value``."""
        if self.sock is None:
            return value
        self.calls += 1
        keys = [f"{self.prefix}sum/{self.calls}/{r}".encode() for r in range(self.world)]
        self.sock.sendall(struct.pack("<B", SET) + _sized(keys[self.rank]) + _sized(json.dumps(value).encode()))
        self.sock.sendall(struct.pack("<BQ", WAIT, len(keys)) + b"".join(_sized(k) for k in keys))
        self._read(1)  # STOP_WAITING
        total = 0.0
        for key in keys:
            self.sock.sendall(struct.pack("<B", GET) + _sized(key))
            (size,) = struct.unpack("<Q", self._read(8))
            total += json.loads(self._read(size))
        return total

    def barrier(self) -> None:
        self.all_reduce(0.0)

    def close(self) -> None:
        if self.sock is not None:
            self.replies.close()
            self.sock.close()


class HostedGroup:
    def __init__(self) -> None:
        env = os.environ
        self.rank, self.world = int(env["RANK"]), int(env["WORLD_SIZE"])
        address = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        if self.rank == 0:
            with socket.create_server(address) as server:
                server.settimeout(TIMEOUT)
                self.peers = [server.accept()[0].makefile("rw") for _ in range(self.world - 1)]
            for peer in self.peers:
                int(peer.readline())  # its rank: a line
        else:
            self.peers = [_connect(address).makefile("rw")]
            self.peers[0].write(f"{self.rank}\n")
            self.peers[0].flush()

    def all_reduce(self, value: float) -> float:
        if self.rank != 0:
            self.peers[0].write(f"{json.dumps(value)}\n")
            self.peers[0].flush()
            return _line(self.peers[0])
        total = value + sum(_line(peer) for peer in self.peers)
        for peer in self.peers:
            peer.write(f"{json.dumps(total)}\n")
            peer.flush()
        return total

    def barrier(self) -> None:
        self.all_reduce(0.0)

    def close(self) -> None:
        for peer in self.peers:
            peer.close()


def _connect(address) -> socket.socket:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return socket.create_connection(address, timeout=TIMEOUT)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _line(peer) -> float:
    line = peer.readline()
    if not line:
        raise SystemExit("store_group: a peer of the group closed its connection")
    return json.loads(line)


def group():
    """The group this worker's launch gives: on the store node 0's launcher serves, or hosted by rank 0."""
    if int(os.environ["WORLD_SIZE"]) > 1 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return HostedGroup()
    return StoreGroup()
