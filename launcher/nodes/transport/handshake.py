"""One handshake for every link between launchers (hub and spoke, the MPI gathering, an elastic job's node 0
and member), without sockets: each side takes the other's messages and gives its own.

The server sends a ``Challenge`` (a fresh nonce); the client answers with its hello (the link's message: what
the link needs, its own fresh nonce and, with a job token, its proof of the token on the server's nonce, over
the job id and who it claims to be); the server answers a ``Welcome`` proving the token on the client's nonce,
or a ``Refusal`` with its reason (proven on the client's nonce where it gave one). Then both hold a
``Session``: every message sealed and numbered, so that nothing of another connection replays on this one.
Without a job token there is no proof and no session. With one, a peer that does not prove it hears only
``REFUSED_UNPROVEN``; without one, the refusal names the problem. The link decides on the rest of its hello.
"""

from __future__ import annotations

import secrets
from typing import Optional

from launcher.nodes.transport.auth import TOKEN_VAR, Session, fresh_nonce, proves, step_proof
from launcher.nodes.transport.messages import Challenge, Refusal, Welcome

REFUSED_UNPROVEN = "wrong job or job token"  # all a peer that does not prove the job token is told
MAX_REASON = 1000


class Server:
    """The server's side of one connection: its challenge, the check of the client's hello, its answer."""

    def __init__(self, token: Optional[str], job_id: str) -> None:
        self.token, self.job_id = token or None, job_id
        self.nonce = secrets.token_hex(16)
        self.client_nonce = ""
        self.who = None
        self.proven = False  # the client proved the job token
        self.session: Optional[Session] = None  # with a job token, from the welcome on

    def challenge(self) -> Challenge:
        return Challenge(self.nonce)

    def hello(self, who, nonce, given) -> Optional[str]:
        """What is wrong with the proof of a hello from ``who`` (its ``nonce``, its proof ``given``, as sent);
        None when it proves the job token, or proves none and the job has none."""
        self.who, self.client_nonce = who, nonce if fresh_nonce(nonce) else ""
        if self.token is None:
            return None if given is None else "it proves a job token, and this job has none"
        if not isinstance(given, str):
            return f"it gives no proof of the job token ({TOKEN_VAR})"
        if not self.client_nonce:
            return "it gives no nonce to prove the job token on"
        if not proves(given, step_proof(self.token, "hello", self.job_id, who, self.nonce, self.client_nonce)):
            return f"its proof of the job token ({TOKEN_VAR}) is wrong"
        self.proven = True
        return None

    def welcome(self) -> Welcome:
        """The welcome of the client ``hello`` took; with a job token, ``session`` seals from now on."""
        if self.token is None:
            return Welcome()
        self.session = Session.of(self.token, self.nonce, self.client_nonce, self.job_id, self.who, at_server=True)
        return Welcome(step_proof(self.token, "welcome", self.job_id, self.who, self.client_nonce, self.nonce))

    def refusal(self, problem: str) -> Refusal:
        """Why the client is not taken: ``problem`` where no token guards the job or the client proved it."""
        said = (problem if self.token is None or self.proven else REFUSED_UNPROVEN)[:MAX_REASON]
        if self.token is None or not self.client_nonce:
            return Refusal(said)
        return Refusal(said, step_proof(self.token, "refused", self.job_id, self.who, self.client_nonce, said))


class Client:
    """The client's side: its hello's nonce and proof for the server's challenge, the check of the answer."""

    def __init__(self, token: Optional[str], job_id: str, who) -> None:
        self.token, self.job_id, self.who = token or None, job_id, who
        self.nonce = secrets.token_hex(16)
        self.server_nonce = ""
        self.session: Optional[Session] = None  # with a job token, from a proven welcome on

    def answer(self, challenge) -> Optional[tuple]:
        """(nonce, proof) for the link's hello (proof None without a token); None for what is not a first
        challenge with a fresh nonce."""
        if not isinstance(challenge, Challenge) or not fresh_nonce(challenge.nonce) or self.server_nonce:
            return None
        self.server_nonce = challenge.nonce
        if self.token is None:
            return self.nonce, None
        return self.nonce, step_proof(self.token, "hello", self.job_id, self.who, self.server_nonce, self.nonce)

    def welcomed(self, welcome: Welcome) -> bool:
        """Whether the welcome proves the job token (any does without one); then ``session`` seals."""
        if self.token is None:
            return bool(self.server_nonce)
        expected = step_proof(self.token, "welcome", self.job_id, self.who, self.nonce, self.server_nonce)
        if not self.server_nonce or not proves(welcome.proof, expected):
            return False
        self.session = Session.of(self.token, self.server_nonce, self.nonce, self.job_id, self.who, at_server=False)
        return True

    def refused(self, refusal: Refusal) -> bool:
        """Whether the refusal is the server's: it proves the token on this client's nonce (any is without one)."""
        if self.token is None:
            return True
        said = (refusal.reason or "")[:MAX_REASON]
        return proves(refusal.proof, step_proof(self.token, "refused", self.job_id, self.who, self.nonce, said))
