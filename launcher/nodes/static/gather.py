"""Gathering the node list of an MPI job (one launcher per node under mpirun) before planning.

MPI tells each launcher its rank and the number of ranks, never the other hosts. Rank 0 listens
on the gathering port (every address), sends each connection a ``challenge`` (a random nonce),
and waits for one ``join`` (``messages.Join``) from every other rank: its rank, the number of ranks, its address, a nonce,
with ``proof`` (auth.proof of the challenge) when LAUNCHER_JOB_TOKEN is set; then rank 0's
answer proves the token too (``answer_proof`` on the rank's nonce), and a rank obeys no answer
that does not (it may be a stranger's on the port: the rank tries again until the join timeout). Once all N-1 have
joined it closes the listener (so that the control channel can bind the same port), answers each
with ``messages.NodeList`` (node rank = MPI rank) and returns the list. The other
ranks connect to MASTER_ADDR, retrying every 0.2 s, and wait for that answer.

Messages are framed as the control channel frames them (``wire.encode``/``wire.Framer``). Every wait
is bounded by the join timeout (``GatherTimeout``, exit code 1). What a stranger can send (junk, a
message that is no join, a join that does not prove the token) only loses that connection, with a
warning, and the gathering goes on: the timeout's message names the last such connection. A duplicate
rank or a size mismatch in a join (a proven one, with a token) is a mistake in how the job was
started: it stops the gathering on rank 0 (``LaunchError``, exit 2), which tells the ranks already
connected why (``refused``), so that they stop at once too.
"""

from __future__ import annotations

import ipaddress
import json
import selectors
import secrets
import socket
import time
from typing import Optional

from launcher.nodes.transport import auth, connection, wire
from launcher.nodes.transport.listener import Listener, bind, pending_cap
from launcher.nodes.transport.messages import Challenge, Join, NodeList, Refusal, from_wire, to_wire
from launcher.host import preflight
from launcher.errors import LaunchError
from launcher.output.messages import log
from launcher.plan.clusters.source import GatherSpec as Spec
from launcher.plan.policy import one_line

RETRY_EVERY = connection.RETRY_EVERY
PROOF_JOB = "mpi-gather"  # the job id the proof is made over: the gathering precedes the job's own id


class GatherTimeout(LaunchError):
    """A rank that never came, or node 0 never reached: the job's join timeout, exit code 1."""

    exit_code = 1


class _NoAnswer(LaunchError):
    """Node 0's end closed, or sent junk, before answering: with a token it may be a stranger (or rank 0
    dropping a join it could not verify), so the rank tries again; without one it is an error."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


class _Stranger(Exception):
    """A connection sent what no rank of this job sends: it is dropped, and the gathering goes on."""


def route_address(master: str, port: int) -> str:
    """The local address the kernel would use to reach ``master`` (a connected UDP socket; no packet is sent)."""
    try:
        infos = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)
        family, _, _, _, where = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(where)
            return s.getsockname()[0]
    except (OSError, UnicodeError, IndexError) as e:
        raise LaunchError(f"this node's address towards MASTER_ADDR={master} cannot be found ({getattr(e, 'strerror', None) or e}); "
                          f"give it with --node_ip.") from None


def own_address(spec: Spec) -> str:
    """This node's address for the list when --node_ip is not given: the one that reaches MASTER_ADDR.

    On rank 0, a host name in MASTER_ADDR that resolves to a loopback address here (Debian's
    127.0.1.1 for the machine's own name) is kept as the name: the other ranks reached it by it.
    """
    address = route_address(spec.master, spec.port)
    if spec.rank == 0 and ipaddress.ip_address(address).is_loopback and not preflight.is_ip(spec.master):
        return spec.master
    return address


def gather(spec: Spec, address: str, timeout: float, token: Optional[str] = None) -> tuple:
    """Every node's address in MPI rank order (this one's is ``address``); () for a single rank."""
    if spec.size <= 1:
        return ()
    deadline = time.monotonic() + timeout
    if spec.rank == 0:
        return _lead(spec, address, deadline, timeout, token)
    return _join(spec, address, deadline, timeout, token)


# ---------------------------------------------------------------- rank 0


class _Peer:
    def __init__(self, sock: socket.socket, where: str) -> None:
        self.sock = sock
        self.where = where
        self.nonce = secrets.token_hex(16)
        self.framer = wire.Framer()
        self.rank: Optional[int] = None
        self.address = ""
        self.rank_nonce = ""  # the rank's own, for rank 0's answer to prove the token on


def _lead(spec: Spec, address: str, deadline: float, timeout: float, token: Optional[str]) -> tuple:
    try:
        listener = Listener(bind(address, spec.port, everywhere=True), "the gathering of the node list",
                            pending_cap(spec.size))
    except OSError as e:
        raise LaunchError(f"rank 0 cannot listen on port {spec.port} ({spec.given_as}) to gather the node list ({e.strerror}); "
                          f"choose a free port with --control_port.") from None
    selector = selectors.DefaultSelector()
    peers: dict = {}  # fd -> _Peer
    joined: dict = {}  # rank -> _Peer
    dropped: list = []  # why each stranger's connection was dropped
    try:
        while len(joined) < spec.size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [r for r in range(1, spec.size) if r not in joined]
                last = f"; the last of {len(dropped)} connection(s) dropped: {dropped[-1]}" if dropped else ""
                raise GatherTimeout(f"MPI rank(s) {_ranks(missing)} did not join the gathering of the node list on port {spec.port} "
                                    f"({spec.given_as}) within {timeout:g} s (--join_timeout){last}; check that they run, "
                                    f"reach this node and have the same LAUNCHER_JOB_TOKEN.")
            listener.watch_with(selector, time.monotonic())
            for key, _ in selector.select(min(left, 0.5)):
                if key.data is None:
                    _accept(listener, selector, peers)
                else:
                    _read(key.data, spec, token, selector, peers, joined, dropped, listener)
        listener.close()  # before the answers: the control channel may bind this port next
        nodes = (address, *(joined[r].address for r in range(1, spec.size)))
        for peer in joined.values():
            _send(peer.sock, _proven(to_wire(NodeList(list(nodes))), peer, token))
        return nodes
    except LaunchError as e:
        for peer in peers.values():
            _send(peer.sock, _proven(to_wire(Refusal(str(e))), peer, token))
        raise
    finally:
        for peer in peers.values():
            peer.sock.close()
        listener.close()
        selector.close()


def _accept(listener: Listener, selector, peers) -> None:
    """New connections, each sent its challenge; the oldest that never joined pushed out past the listener's cap (every
    rank may come at once), so that a flood of connections that never speak neither runs rank 0 out of descriptors
    nor keeps a rank out."""
    new, pushed_out = listener.accept(time.monotonic())
    for sock in pushed_out:
        if peers.pop(sock.fileno(), None) is not None:
            selector.unregister(sock)
            sock.close()
    for sock, where in new:
        peer = _Peer(sock, f"{where[0]}:{where[1]}")
        peers[sock.fileno()] = peer
        selector.register(sock, selectors.EVENT_READ, peer)
        _send(sock, to_wire(Challenge(peer.nonce)))


def _read(peer: _Peer, spec: Spec, token, selector, peers, joined, dropped, listener: Listener) -> None:
    if peers.get(peer.sock.fileno()) is not peer:  # pushed out in this turn
        return
    try:
        data = peer.sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    if not data:  # gone before or after joining: a rank that joined must stay until the answer
        _forget(peer, selector, peers, joined, listener)
        return
    try:
        for message in peer.framer.feed(data):
            _join_message(peer, message, spec, token, joined)
            listener.settled(peer.sock)
    except (wire.ProtocolError, _Stranger) as e:
        why = f"{peer.where} {e if isinstance(e, _Stranger) else f'sent junk ({e})'}"
        log.warning("dropped a connection to the gathering of the node list on port %s: %s", spec.port, why)
        dropped.append(why)
        _forget(peer, selector, peers, joined, listener)


def _forget(peer: _Peer, selector, peers, joined, listener: Listener) -> None:
    listener.settled(peer.sock)
    selector.unregister(peer.sock)
    peers.pop(peer.sock.fileno(), None)
    peer.sock.close()
    if peer.rank is not None and joined.get(peer.rank) is peer:
        joined.pop(peer.rank)


def answer_proof(token: str, message: dict, rank_nonce: str, rank: int) -> str:
    """Rank 0's proof of the token on a rank's nonce, over the whole of its answer."""
    return auth.proof(token, f"answer|{rank_nonce}|{json.dumps(message, sort_keys=True)}", PROOF_JOB, rank)


def _proven(message: dict, peer: _Peer, token) -> dict:
    """``message`` with rank 0's proof, where the peer is a rank that gave a nonce."""
    if token and peer.rank is not None:
        return {**message, "proof": answer_proof(token, message, peer.rank_nonce, peer.rank)}
    return message


def _join_message(peer: _Peer, message: dict, spec: Spec, token, joined) -> None:
    join = from_wire(message)
    if not isinstance(join, Join) or peer.rank is not None or join.rank is None or not join.address or join.size is None:
        raise _Stranger(f"sent a message that is not a rank's join ({one_line(str(message), 80)})")
    rank, size, address = join.rank, join.size, join.address
    who = f"MPI rank {rank} ({one_line(address, 80)}, from {peer.where})"
    if token and not (auth.proves(join.proof, auth.proof(token, peer.nonce, PROOF_JOB, rank))
                      and auth.fresh_nonce(join.nonce)):
        raise _Stranger(f"joined as MPI rank {rank} without proving it knows LAUNCHER_JOB_TOKEN")
    if size != spec.size:
        raise LaunchError(f"{who} says the job has {size} ranks, rank 0 says {spec.size}; start every rank with the same mpirun.")
    if not 1 <= rank < spec.size:
        raise LaunchError(f"{who} is not a rank from 1 to {spec.size - 1}; start every rank with the same mpirun.")
    if rank in joined:
        raise LaunchError(f"{who} joined twice: {joined[rank].address} (from {joined[rank].where}) is rank {rank} already; "
                          f"start one launcher per rank.")
    peer.rank, peer.address, peer.rank_nonce = rank, address, join.nonce
    joined[rank] = peer


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _send(sock: socket.socket, message: dict) -> None:
    """A short message on a fresh connection: the kernel's buffer takes it at once."""
    try:
        sock.settimeout(2.0)
        sock.sendall(wire.encode(message))
    except OSError:
        pass  # the peer is gone; its rank will say so, or time out
    finally:
        sock.setblocking(False)


# ---------------------------------------------------------------- every other rank


def _join(spec: Spec, address: str, deadline: float, timeout: float, token: Optional[str]) -> tuple:
    where = f"node 0 (MASTER_ADDR={spec.master}, port {spec.port}, {spec.given_as})"
    unproven = None  # what the last answer that did not prove the token said
    while True:
        try:
            with _connect(spec, address, deadline, timeout, where) as sock:
                answer, proven = _ask(sock, spec, address, deadline, timeout, where, token)
        except _NoAnswer as e:
            if not token:
                raise
            answer, proven = {"type": e.why}, False
        except GatherTimeout:
            if unproven is None:
                raise
            raise GatherTimeout(f"no answer to MPI rank {spec.rank} ({address}) from {where} proved {auth.TOKEN_VAR} within "
                                f"{timeout:g} s (--join_timeout; the last said: {unproven}); set the same token on every rank.") from None
        if proven:
            break
        # with a token, an answer that does not prove it may be a stranger's on the port: not obeyed
        if unproven is None:
            log.warning("whoever answers MPI rank %d on %s does not prove %s; not obeyed: trying again until the "
                        "join timeout", spec.rank, where, auth.TOKEN_VAR)
        unproven = one_line(str(answer.get("reason", answer.get("type"))), 300)
        time.sleep(RETRY_EVERY)
    if answer.get("type") == "refused":
        raise LaunchError(f"rank 0 stopped the gathering of the node list: {one_line(str(answer.get('reason', '')), 300)}")
    answered = from_wire(answer)
    nodes = answered.nodes if isinstance(answered, NodeList) else None
    if nodes is None or len(nodes) != spec.size or nodes[spec.rank] != address:
        raise LaunchError(f"{where} answered MPI rank {spec.rank} ({address}) with no node list of {spec.size} nodes naming it; "
                          f"check that MASTER_ADDR and the port belong to this job.")
    return tuple(nodes)


def _connect(spec: Spec, address: str, deadline: float, timeout: float, where: str) -> socket.socket:
    while True:
        try:
            return socket.create_connection((spec.master, spec.port), timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except OSError as e:
            last = e.strerror or str(e)
            if time.monotonic() + RETRY_EVERY >= deadline:
                raise GatherTimeout(f"MPI rank {spec.rank} ({address}) could not reach {where} to gather the node list within "
                                    f"{timeout:g} s (--join_timeout; last: {last}); check that rank 0 runs and MASTER_ADDR is its address.") from None
            time.sleep(RETRY_EVERY)


def _ask(sock, spec: Spec, address: str, deadline: float, timeout: float, where: str, token: Optional[str]) -> tuple:
    """Rank 0's answer to this rank's join, and whether it proves the token (where one is set)."""
    framer = (wire.Framer(wire.sized_for(spec.size)), [])  # the answer lists every rank's node
    challenge = _receive(sock, framer, deadline, spec, address, where, timeout)
    asked = from_wire(challenge)
    if not isinstance(asked, Challenge) or not auth.fresh_nonce(asked.nonce):
        if token:
            return challenge, False
        raise LaunchError(f"{where} answered MPI rank {spec.rank} ({address}) with something other than the gathering's challenge; "
                          f"check that MASTER_ADDR and the port belong to this job.")
    nonce = secrets.token_hex(16)
    given = auth.proof(token, asked.nonce, PROOF_JOB, spec.rank) if token else None
    sock.sendall(wire.encode(to_wire(Join(spec.rank, spec.size, address, nonce, given))))
    answer = _receive(sock, framer, deadline, spec, address, where, timeout)
    body = {k: v for k, v in answer.items() if k != "proof"}
    return answer, not token or auth.proves(answer.get("proof"), answer_proof(token, body, nonce, spec.rank))


def _receive(sock, framer, deadline, spec: Spec, address: str, where: str, timeout: float) -> dict:
    """The next message from node 0, waiting no later than ``deadline``."""
    framer, pending = framer  # the Framer, and messages that came with an earlier one
    while not pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GatherTimeout(f"{where} did not send MPI rank {spec.rank} ({address}) the node list within {timeout:g} s "
                                f"(--join_timeout); check that every rank of the mpirun runs.")
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError as e:
            data, why = b"", e.strerror
        else:
            why = "connection closed"
        if not data:
            raise _NoAnswer(f"{where} closed the gathering of the node list before MPI rank {spec.rank} ({address}) had it ({why}); "
                            f"see rank 0's messages.", f"closed the connection without an answer ({why})")
        try:
            pending += framer.feed(data)
        except wire.ProtocolError as e:
            raise _NoAnswer(f"{where} sent MPI rank {spec.rank} ({address}) junk ({e}); check that MASTER_ADDR and the port belong "
                            f"to this job.", f"sent junk ({e})") from None
    return pending.pop(0)
