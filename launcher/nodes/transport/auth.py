"""Authentication with the job token: proofs over nonces (HMAC-SHA256) and the sealed session
that numbers every message after the handshake.

With a job token (``LAUNCHER_JOB_TOKEN``) authentication is mutual (``handshake``): the client
proves the token on the server's nonce, the server's welcome (or refusal) proves it on the client's,
and every message after the welcome is sealed in a ``Session`` bound to both nonces, the job and who
the client is.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Optional

from launcher.nodes.transport.wire import ProtocolError

TOKEN_VAR = "LAUNCHER_JOB_TOKEN"
TAG = 32  # bytes of HMAC-SHA256 ahead of every message body of a session


def proof(token: str, nonce: str, job_id: str, node) -> str:
    return hmac.new(token.encode(), f"{nonce}|{job_id}|{node}".encode(), hashlib.sha256).hexdigest()


def step_proof(token: str, step: str, job_id: str, who, *said: str) -> str:
    """The handshake's proof of one ``step`` (hello, welcome, refused) over the job id, who the client
    claims to be and what the step says: the nonce it answers first (then its own, or its reason)."""
    return proof(token, "|".join((step, *said)), job_id, who)


def proves(given, expected: str) -> bool:
    """Whether ``given`` (from the wire: any type) is the ``expected`` proof."""
    return isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def fresh_nonce(value) -> bool:
    """A nonce as ``secrets.token_hex(16)`` makes it: what a challenge and a hello carry."""
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


@dataclass
class Session:
    """After a handshake with a job token, each side seals every message it sends with
    HMAC-SHA256(key, direction|number|SHA-256 of the body), the key derived from the token, both
    nonces, the job and who the client is, and opens only the next number from the other side: a
    forged, replayed, reordered or reflected message (or one sealed for another connection) is a
    ProtocolError (the connection is lost), never obeyed. The tag covers the body's digest, so that
    one body sent to many (``connection.Shared``) is hashed once."""

    key: bytes
    outgoing: str
    incoming: str
    sent: int = 0
    received: int = 0

    @classmethod
    def of(cls, token: str, server_nonce: str, client_nonce: str, job_id: str, who, at_server: bool) -> "Session":
        key = hmac.new(token.encode(), f"session|{server_nonce}|{client_nonce}|{job_id}|{who}".encode(),
                       hashlib.sha256).digest()
        down, up = f"server>{who}", f"{who}>server"
        return cls(key, down, up) if at_server else cls(key, up, down)

    def _tag(self, direction: str, number: int, body, digest: Optional[bytes] = None) -> bytes:
        return hmac.digest(self.key, f"{direction}|{number}|".encode() + (digest or hashlib.sha256(body).digest()),
                           "sha256")

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
