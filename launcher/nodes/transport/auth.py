"""Authentication with the job token: proofs over nonces (HMAC-SHA256) and the sealed session
that numbers every message after the handshake.

With a job token (``LAUNCHER_JOB_TOKEN``) authentication is mutual: a joining node proves the
token on node 0's nonce, node 0's welcome (or refusal) proves it on the node's nonce, and every
message after the welcome is sealed in a ``Session`` bound to both nonces. An elastic job's (c10d) channel
is sealed the same way from node 0's admission on (``Session.elastic``): the joining launcher's nonce of
its hello, node 0's of the admission.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Optional

from launcher.nodes.transport.wire import ProtocolError

TOKEN_VAR = "LAUNCHER_JOB_TOKEN"
TAG = 32  # bytes of HMAC-SHA256 ahead of every message body of a session


def proof(token: str, nonce: str, job_id: str, node: int) -> str:
    return hmac.new(token.encode(), f"{nonce}|{job_id}|{node}".encode(), hashlib.sha256).hexdigest()


def admission_proof(token: str, nonce: str, job_id: str, node_id: str, keeper_nonce: str) -> str:
    """An elastic job's node 0 proving the job token to a joining launcher, on that launcher's own nonce (not
    the proof of its hello) and node 0's nonce for their session (``Session.elastic``)."""
    return proof(token, f"{nonce}|{keeper_nonce}", job_id, f"admitted {node_id}")


def proves(given, expected: str) -> bool:
    """Whether ``given`` (from the wire: any type) is the ``expected`` proof."""
    return isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def fresh_nonce(value) -> bool:
    """A nonce as ``secrets.token_hex(16)`` makes it: what a challenge and a hello carry."""
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def hub_proof(token: str, node_nonce: str, hub_nonce: str, job_id: str, node: int) -> str:
    """Node 0's answer to a joining node's nonce: its welcome proves that it knows the token too."""
    return proof(token, f"node 0|{node_nonce}|{hub_nonce}", job_id, node)


def refusal_proof(token: str, node_nonce: str, reason: str, job_id: str, node: int) -> str:
    return proof(token, f"refused|{node_nonce}|{reason}", job_id, node)


@dataclass
class Session:
    """After a handshake with a job token, each side seals every message it sends with
    HMAC-SHA256(key, direction|number|body), the key derived from the token and both nonces, and
    opens only the next number from the other side: a forged, replayed, reordered or reflected
    message is a ProtocolError (the connection is lost), never obeyed."""

    key: bytes
    outgoing: str
    incoming: str
    sent: int = 0
    received: int = 0
    digested: bool = False  # the tag covers the body's SHA-256: one body sealed for many members is hashed once

    @classmethod
    def between(cls, token: str, hub_nonce: str, node_nonce: str, job_id: str, node: int, at_hub: bool) -> "Session":
        key = hmac.new(token.encode(), f"session|{hub_nonce}|{node_nonce}|{job_id}|{node}".encode(), hashlib.sha256).digest()
        down, up = f"0>{node}", f"{node}>0"
        return cls(key, down, up) if at_hub else cls(key, up, down)

    @classmethod
    def elastic(cls, token: str, keeper_nonce: str, member_nonce: str, job_id: str, node_id: str,
                at_keeper: bool) -> "Session":
        """An elastic job's node 0 and one member, from the admission on: a key of their own (both nonces, the
        member's id), so that what is sealed for one member opens on no other connection."""
        key = hmac.new(token.encode(), f"elastic session|{keeper_nonce}|{member_nonce}|{job_id}|{node_id}".encode(),
                       hashlib.sha256).digest()
        down, up = "node 0>member", "member>node 0"
        return cls(key, down, up, digested=True) if at_keeper else cls(key, up, down, digested=True)

    def _tag(self, direction: str, number: int, body, digest: Optional[bytes] = None) -> bytes:
        if self.digested:
            body = digest or hashlib.sha256(body).digest()
        return hmac.digest(self.key, f"{direction}|{number}|".encode() + bytes(body), "sha256")

    def tag(self, body, digest: Optional[bytes] = None) -> bytes:
        """The next outgoing tag for ``body`` (``digest``: its SHA-256, computed once for many sessions)."""
        tag = self._tag(self.outgoing, self.sent, body, digest)
        self.sent += 1
        return tag

    def seal(self, body: bytes) -> bytes:
        return self.tag(body) + body

    def open(self, body: bytes) -> bytes:
        tag, rest = body[:TAG], body[TAG:]
        if len(body) < TAG or not hmac.compare_digest(tag, self._tag(self.incoming, self.received, rest)):
            raise ProtocolError(f"message {self.received} of its session with a wrong authentication "
                                f"(forged, replayed or out of order)")
        self.received += 1
        return rest
