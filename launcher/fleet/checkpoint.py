"""fleet.save_persistables / load_persistables: the first worker writes, atomically; every rank can load."""

from __future__ import annotations

import os
from typing import Optional

import torch

from launcher.fleet import state as st

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"


def save_persistables(dirname: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Write ``dirname/model.pt`` (and ``optimizer.pt``) on the first worker; all ranks return once it is there."""
    if st.current().penv.rank == 0:
        os.makedirs(dirname, exist_ok=True)
        if optimizer is not None:
            _save_atomically(optimizer.state_dict(), os.path.join(dirname, OPTIMIZER_FILE))
        _save_atomically(_unwrap(model).state_dict(), os.path.join(dirname, MODEL_FILE))
    st.barrier()


def load_persistables(dirname: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Load what save_persistables wrote into ``model`` (and ``optimizer``), on any rank."""
    device = st.current().penv.device
    state = torch.load(os.path.join(dirname, MODEL_FILE), map_location=device, weights_only=True)
    _unwrap(model).load_state_dict(state)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(os.path.join(dirname, OPTIMIZER_FILE), map_location=device, weights_only=True))


def _save_atomically(obj, path: str) -> None:
    """Readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
