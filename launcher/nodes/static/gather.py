"""Gathering the node list of an MPI job (one launcher per node under mpirun) before planning.

MPI tells each launcher its rank and the number of ranks, never the other hosts. Rank 0 listens
on the gathering port (every address) and shakes hands with each connection (``handshake``): its
challenge, then the rank's hello, a ``join`` (``messages.Join``: its rank, the number of ranks, its
address, a nonce, with ``proof`` of LAUNCHER_JOB_TOKEN when it is set), then rank 0's welcome, which
proves the token too; a rank obeys no answer that does not (it may be a stranger's on the port: the
rank tries again until the join timeout). Once all N-1 have joined it closes the listener (so that
the control channel can bind the same port), sends each ``messages.NodeList`` (node rank = MPI rank),
sealed in their session with a token, and returns the list. The other ranks connect to MASTER_ADDR,
retrying every 0.2 s, and wait for that list.

Messages are framed as the control channel frames them (``wire.encode``/``wire.Framer``). Every wait
is bounded by the join timeout (``GatherTimeout``, exit code 1). What a stranger can send (junk, a
message that is no join, a join that does not prove the token) only loses that connection, with a
warning, and the gathering goes on: the timeout's message names the last such connection. A duplicate
rank or a size mismatch in a join (a proven one, with a token) is a mistake in how the job was
started: it stops the gathering on rank 0 (``LaunchError``, exit 2), which tells the ranks already
connected why (``refused``, in their session), so that they stop at once too.
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
import time
from typing import Optional

from launcher.nodes.transport import auth, connection, wire
from launcher.nodes.transport.connection import Connection
from launcher.nodes.transport.handshake import Client, Server
from launcher.nodes.transport.listener import Listener, bind, pending_cap
from launcher.nodes.transport.messages import Join, NodeList, Refusal, Welcome, from_wire, to_wire
from launcher.host import preflight
from launcher.errors import LaunchError
from launcher.output.messages import log
from launcher.plan.clusters.source import GatherSpec as Spec
from launcher.plan.policy import one_line

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


class _Peer(Connection):
    """A connection to rank 0; ``node``: the MPI rank it joined as, ``address`` its node's."""

    address: str = ""


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
                    _accept(listener, selector, peers, token)
                else:
                    _read(key.data, spec, selector, peers, joined, dropped, listener)
        listener.close()  # before the answers: the control channel may bind this port next
        nodes = (address, *(joined[r].address for r in range(1, spec.size)))
        for peer in joined.values():
            peer.send_within(NodeList(list(nodes)))
        return nodes
    except LaunchError as e:
        for peer in peers.values():  # a rank welcomed hears it in its session, any other proven on its nonce
            peer.send_within(Refusal(str(e)) if peer.node is not None else peer.handshake.refusal(str(e)))
        raise
    finally:
        for peer in peers.values():
            peer.sock.close()
        listener.close()
        selector.close()


def _accept(listener: Listener, selector, peers, token) -> None:
    """New connections, each sent its challenge; the oldest that never joined pushed out past the listener's cap (every
    rank may come at once), so that a flood of connections that never speak neither runs rank 0 out of descriptors
    nor keeps a rank out."""
    new, pushed_out = listener.accept(time.monotonic())
    for sock in pushed_out:
        if peers.pop(sock.fileno(), None) is not None:
            selector.unregister(sock)
            sock.close()
    for sock, where in new:
        peer = _Peer(sock, f"{where[0]}:{where[1]}", handshake=Server(token, PROOF_JOB))
        peers[sock.fileno()] = peer
        selector.register(sock, selectors.EVENT_READ, peer)
        peer.send_within(peer.handshake.challenge())


def _read(peer: _Peer, spec: Spec, selector, peers, joined, dropped, listener: Listener) -> None:
    if peers.get(peer.sock.fileno()) is not peer:  # pushed out in this turn
        return
    try:
        for body in peer.receive():
            _join_message(peer, peer.open(body), spec, joined)
            listener.settled(peer.sock)
    except ConnectionError:  # gone before or after joining: a rank that joined must stay until the answer
        _forget(peer, selector, peers, joined, listener)
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
    if peer.node is not None and joined.get(peer.node) is peer:
        joined.pop(peer.node)


def _join_message(peer: _Peer, message: dict, spec: Spec, joined) -> None:
    """A rank's hello: its proof checked (``handshake``), then its rank and size; welcomed, it waits for the list."""
    join = from_wire(message)
    if not isinstance(join, Join) or peer.node is not None or join.rank is None or not join.address or join.size is None:
        raise _Stranger(f"sent a message that is not a rank's join ({one_line(str(message), 80)})")
    rank, size, address = join.rank, join.size, join.address
    who = f"MPI rank {rank} ({one_line(address, 80)}, from {peer.where})"
    problem = peer.handshake.hello(rank, join.nonce, join.proof)
    if problem is not None:
        peer.send_within(peer.handshake.refusal(problem))
        raise _Stranger(f"joined as MPI rank {rank} without proving it knows LAUNCHER_JOB_TOKEN ({problem})")
    if size != spec.size:
        raise LaunchError(f"{who} says the job has {size} ranks, rank 0 says {spec.size}; start every rank with the same mpirun.")
    if not 1 <= rank < spec.size:
        raise LaunchError(f"{who} is not a rank from 1 to {spec.size - 1}; start every rank with the same mpirun.")
    if rank in joined:
        raise LaunchError(f"{who} joined twice: {joined[rank].address} (from {joined[rank].where}) is rank {rank} already; "
                          f"start one launcher per rank.")
    peer.send_within(peer.handshake.welcome())
    peer.node, peer.address, peer.session = rank, address, peer.handshake.session
    joined[rank] = peer


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


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
        time.sleep(connection.RETRY_EVERY)
    if answer.get("type") == "refused":
        raise LaunchError(f"rank 0 stopped the gathering of the node list: {one_line(str(answer.get('reason', '')), 300)}")
    answered = from_wire(answer)
    nodes = answered.nodes if isinstance(answered, NodeList) else None
    if nodes is None or len(nodes) != spec.size or nodes[spec.rank] != address:
        raise LaunchError(f"{where} answered MPI rank {spec.rank} ({address}) with no node list of {spec.size} nodes naming it; "
                          f"check that MASTER_ADDR and the port belong to this job.")
    return tuple(nodes)


def _connect(spec: Spec, address: str, deadline: float, timeout: float, where: str) -> socket.socket:
    try:
        return connection.dial(spec.master, spec.port, deadline)
    except OSError as e:
        raise GatherTimeout(f"MPI rank {spec.rank} ({address}) could not reach {where} to gather the node list within "
                            f"{timeout:g} s (--join_timeout; last: {e.strerror or e}); check that rank 0 runs and "
                            "MASTER_ADDR is its address.") from None


def _ask(sock, spec: Spec, address: str, deadline: float, timeout: float, where: str, token: Optional[str]) -> tuple:
    """Rank 0's answer to this rank's join (after its welcome, in their session), and whether it proves the token
    (where one is set)."""
    said = (Connection(sock, framer=wire.Framer(wire.sized_for(spec.size))), [])  # the answer lists every rank's node
    shake = Client(token, PROOF_JOB, spec.rank)
    challenge = _receive(said, deadline, spec, address, where, timeout)
    answer = shake.answer(from_wire(challenge))
    if answer is None:
        if token:
            return challenge, False
        raise LaunchError(f"{where} answered MPI rank {spec.rank} ({address}) with something other than the gathering's challenge; "
                          f"check that MASTER_ADDR and the port belong to this job.")
    sock.sendall(wire.encode(to_wire(Join(spec.rank, spec.size, address, *answer))))
    reply = _receive(said, deadline, spec, address, where, timeout)
    typed = from_wire(reply)
    if isinstance(typed, Refusal):
        return reply, shake.refused(typed)
    if not isinstance(typed, Welcome) or not shake.welcomed(typed):
        return reply, not token
    said[0].session = shake.session
    return _receive(said, deadline, spec, address, where, timeout), True


def _receive(said, deadline, spec: Spec, address: str, where: str, timeout: float) -> dict:
    """The next message from node 0 (opened in their session, once there is one), waiting no later than ``deadline``."""
    conn, pending = said  # the connection, and bodies that came with an earlier message
    while not pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GatherTimeout(f"{where} did not send MPI rank {spec.rank} ({address}) the node list within {timeout:g} s "
                                f"(--join_timeout); check that every rank of the mpirun runs.")
        conn.sock.settimeout(left)
        try:
            pending += conn.receive()
        except ConnectionError as e:
            raise _NoAnswer(f"{where} closed the gathering of the node list before MPI rank {spec.rank} ({address}) had it ({e}); "
                            f"see rank 0's messages.", f"closed the connection without an answer ({e})") from None
        except wire.ProtocolError as e:
            raise _NoAnswer(f"{where} sent MPI rank {spec.rank} ({address}) junk ({e}); check that MASTER_ADDR and the port belong "
                            f"to this job.", f"sent junk ({e})") from None
    try:
        return conn.open(pending.pop(0))
    except wire.ProtocolError as e:
        raise _NoAnswer(f"{where} sent MPI rank {spec.rank} ({address}) a message that failed the job token's authentication "
                        f"({e}).", f"sent junk ({e})") from None
