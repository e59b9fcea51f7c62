"""Paddle 1.8's environment flags for distributed training, and what each one does on PyTorch.

``read_flags`` is pure; ``apply_flags`` acts on the process once the device is known.
Every flag either takes effect or is warned about once with the reason.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Mapping, Optional

SYNC_NCCL_ALLREDUCE = "FLAGS_sync_nccl_allreduce"
FRACTION_OF_GPU_MEMORY = "FLAGS_fraction_of_gpu_memory_to_use"
NCCL_IB_DISABLE = "NCCL_IB_DISABLE"
FUSE_PARAMETER_MEMORY_SIZE = "FLAGS_fuse_parameter_memory_size"
FUSE_PARAMETER_GROUPS_SIZE = "FLAGS_fuse_parameter_groups_size"
# parameter-server mode's RPC settings (launcher.ps); a collective worker only warns about them
RPC_SEND_THREAD_NUM = "FLAGS_rpc_send_thread_num"
RPC_GET_THREAD_NUM = "FLAGS_rpc_get_thread_num"
RPC_PREFETCH_THREAD_NUM = "FLAGS_rpc_prefetch_thread_num"
RPC_DEADLINE = "FLAGS_rpc_deadline"
RPC_FLAGS = (RPC_SEND_THREAD_NUM, RPC_GET_THREAD_NUM, RPC_PREFETCH_THREAD_NUM, RPC_DEADLINE)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class FleetWarning(UserWarning):
    """A Paddle option or flag that does not apply to PyTorch as set."""


_warned: set = set()


def reset_warnings() -> None:
    """Forget which warnings were given (part of launcher.fleet.state.reset)."""
    _warned.clear()


def warn_once(key: str, message: str) -> None:
    """Warn with ``message`` the first time ``key`` comes up in this process."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, FleetWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside this package, so the warning points at user code."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


@dataclass(frozen=True)
class Flags:
    sync_allreduce: bool = False  # FLAGS_sync_nccl_allreduce: wait for each all-reduce on the spot
    gpu_memory_fraction: Optional[float] = None  # FLAGS_fraction_of_gpu_memory_to_use
    ib_disable: Optional[bool] = None  # NCCL_IB_DISABLE (NCCL reads it itself)
    fuse_memory_mb: Optional[float] = None  # FLAGS_fuse_parameter_memory_size, MB per bucket
    fuse_groups_size: Optional[int] = None  # FLAGS_fuse_parameter_groups_size, tensors per bucket
    rpc_flags: tuple = ()  # the RPC_FLAGS that are set (no effect on a collective worker)


@dataclass(frozen=True)
class RpcFlags:
    """Parameter-server mode's RPC settings, with Paddle 1.8's defaults."""

    deadline_ms: int = 180000  # FLAGS_rpc_deadline: the RPC timeout, and the bound of every wait
    send_threads: int = 12  # FLAGS_rpc_send_thread_num: a trainer's pushes in flight at once
    get_threads: int = 12  # FLAGS_rpc_get_thread_num: threads serving incoming requests (TensorPipe's workers)
    prefetch_threads: int = 12  # FLAGS_rpc_prefetch_thread_num: sparse-row prefetches in flight at once

    @property
    def deadline_s(self) -> float:
        return self.deadline_ms / 1000.0


def read_rpc_flags(environ: Mapping[str, str]) -> RpcFlags:
    """The RPC flags set in ``environ`` (Paddle's defaults for the others); a malformed one is a ValueError naming it."""
    default = RpcFlags()

    def get(name, fallback):
        value = _number(environ, name, int, 1, None)
        return fallback if value is None else value

    return RpcFlags(get(RPC_DEADLINE, default.deadline_ms), get(RPC_SEND_THREAD_NUM, default.send_threads),
                    get(RPC_GET_THREAD_NUM, default.get_threads), get(RPC_PREFETCH_THREAD_NUM, default.prefetch_threads))


def read_flags(environ: Mapping[str, str]) -> Flags:
    """The flags set in ``environ``; a malformed value is a ValueError naming the flag."""
    return Flags(
        sync_allreduce=bool(_bool(environ, SYNC_NCCL_ALLREDUCE)),
        gpu_memory_fraction=_number(environ, FRACTION_OF_GPU_MEMORY, float, 0.0, 1.0),
        ib_disable=_bool(environ, NCCL_IB_DISABLE),
        fuse_memory_mb=_number(environ, FUSE_PARAMETER_MEMORY_SIZE, float, 0.0, None, allow_negative_default=True),
        fuse_groups_size=_number(environ, FUSE_PARAMETER_GROUPS_SIZE, int, 1, None, allow_negative_default=True),
        rpc_flags=tuple(name for name in RPC_FLAGS if environ.get(name, "").strip()),
    )


def apply_flags(flags: Flags, backend: str, device) -> None:
    """Give the process-wide flags their effect for a worker on ``device`` using ``backend``."""
    import torch

    for name in flags.rpc_flags:
        warn_once(name, f"{name} sets up parameter-server mode's RPC; this worker trains collectively "
                  "(all-reduce, no servers), so the flag has no effect here.")
    if flags.ib_disable is not None and backend != "nccl":
        warn_once(NCCL_IB_DISABLE, f"{NCCL_IB_DISABLE} is read by NCCL only; this worker uses {backend}, which always talks TCP.")
    fraction = flags.gpu_memory_fraction
    if fraction is None:
        return
    if device.type != "cuda":
        warn_once(FRACTION_OF_GPU_MEMORY, f"{FRACTION_OF_GPU_MEMORY} limits GPU memory; this worker runs on the CPU, so it has no effect.")
    elif fraction == 0.0:
        warn_once(FRACTION_OF_GPU_MEMORY, f"{FRACTION_OF_GPU_MEMORY}=0 asks for no pre-allocation; PyTorch's caching allocator "
                  "cannot be switched off once CUDA is up, set PYTORCH_NO_CUDA_MEMORY_CACHING=1 before starting instead.")
    else:
        torch.cuda.set_per_process_memory_fraction(fraction, device)


def _bool(environ: Mapping[str, str], name: str) -> Optional[bool]:
    text = environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name}={environ[name]!r} is not 0 or 1.")


def _number(environ, name, kind, low, high, allow_negative_default=False):
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a {'whole ' if kind is int else ''}number.") from None
    if allow_negative_default and value < 0:
        return None  # Paddle's "-1: not set"
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name}={text} must be {bounds}.")
    return value
