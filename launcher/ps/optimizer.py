"""The trainer's optimizer in parameter-server mode: step() is the mode's exchange with the servers."""

from __future__ import annotations

import torch

from launcher.fleet.optimizer import WrappedOptimizer, closure_loss


class PsOptimizer(WrappedOptimizer):
    """Wraps the user's optimizer on a trainer (or, unused, on a server).

    ``zero_grad`` / ``backward`` / ``step`` and ``minimize(loss)`` work as usual; ``step`` sends the
    gradients to the servers and takes back the parameters (sync, async, half-async), or steps
    locally and exchanges parameter changes every update_frequency steps (geo).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, session):
        self.optimizer = optimizer
        self._session = session

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        loss = closure_loss(closure)
        self._session.worker_or_fail("optimizer.step").step()
        return loss
