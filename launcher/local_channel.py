"""The local channel between a launcher and its own workers, shared by both programs as ``envvars`` is: where it
is, how its messages are framed, and how each side proves the key.

The launcher listens on an abstract Unix socket (``envvars.CONTROL_SOCKET``, "@name": no file, no port) and
gives each worker its address and a key of this launch's own (``envvars.CONTROL_KEY``), in the environment
only. A worker that connects is checked twice: the kernel names its process (SO_PEERCRED: one of this
launcher's workers), and it proves the key on the launcher's nonce; the launcher proves it back on the worker's
nonce before the worker takes any word from it. Messages are JSON objects, one a line, each bounded
(``MAX_LINE``); ``decode`` returns None for anything else and never raises.

    launcher -> worker: challenge {nonce}; welcome {proof, round, reform_wait}; stop {round, reason};
                        round {env, fds, progress} with its descriptors (``send_with_fds``)
    worker -> launcher: hello {nonce, proof, pid, keep}; parked {round}
    a warm worker, on the socket pair it was started with: READY; then it is given its first round
"""

from __future__ import annotations

import array
import hashlib
import hmac
import json
import secrets
import socket
from typing import Optional, Tuple

from launcher.untrusted import json_object

MAX_LINE = 1 << 20  # bytes of one message before the key is proven, or from a worker (a round's env may be longer)
CHALLENGE, HELLO, WELCOME, STOP, ROUND, PARKED = "challenge", "hello", "welcome", "stop", "round", "parked"
READY = b"ready\n"  # a warm worker's word on its socket pair once it waits for its first round


def new_secret() -> str:
    """A launch's key, or a nonce: 128 random bits, in hex."""
    return secrets.token_hex(16)


def proof(key: str, side: str, own_nonce: str, their_nonce: str) -> str:
    """``side`` ("worker" or "launcher") proves ``key`` on both nonces: no proof is valid for the other side. Never
    raises, whatever the nonces hold (a peer's nonce may be any string JSON can carry)."""
    message = f"{side}\0{their_nonce}\0{own_nonce}".encode("utf-8", "surrogatepass")
    return hmac.new(key.encode("utf-8", "surrogatepass"), message, hashlib.sha256).hexdigest()


def proven(key: str, side: str, given: object, own_nonce: str, their_nonce: str) -> bool:
    """Whether ``given`` is ``side``'s proof of ``key``, where ``their_nonce`` was the prover's and ``own_nonce`` ours."""
    return (isinstance(given, str) and given.isascii()
            and hmac.compare_digest(given, proof(key, side, their_nonce, own_nonce)))


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, limit: Optional[int] = MAX_LINE) -> Optional[dict]:
    """One line off the channel as a message with a string type ``t``; None for anything else (never raises).
    ``limit``: the longest line taken (None: any, for the launcher's word once it proved the key)."""
    if limit is not None and len(line) > limit:
        return None
    message = json_object(line)
    return message if message is not None and isinstance(message.get("t"), str) else None


def round_message(env: dict, fds: int, progress: bool = False) -> dict:
    """A round for a worker kept from the round before, or woken warm: its whole environment, and how many descriptors
    come with the message (its standard output and error, then its progress page's when ``progress``)."""
    return {"t": ROUND, "env": env, "fds": fds, "progress": progress}


def round_of(message: dict) -> Optional[Tuple[dict, int]]:
    """A round's message as (its variables, how many descriptors came with it); None for any other message."""
    if message.get("t") != ROUND or not isinstance(message.get("env"), dict):
        return None
    count = message.get("fds") if type(message.get("fds")) is int else 0
    return {str(k): str(v) for k, v in message["env"].items()}, count


def send_with_fds(sock: socket.socket, data: bytes, fds) -> int:
    """Send ``data`` with the descriptors ``fds`` on its first byte (SCM_RIGHTS): the bytes sent, or OSError."""
    return sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def receive_with_fds(sock: socket.socket, size: int) -> Tuple[bytes, list]:
    """Up to ``size`` bytes and the descriptors that came with them (close-on-exec), or OSError."""
    data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(16 * 4), socket.MSG_CMSG_CLOEXEC)  # 16 at most
    fds: list = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", payload[:len(payload) - len(payload) % 4]).tolist()
    return data, fds


def address(name: str) -> str:
    """The socket address of a channel's name as the environment gives it ("@x": the abstract name x)."""
    return "\0" + name[1:] if name.startswith("@") else name
