"""What tests/gpu needs: how many CUDA GPUs this machine's torch sees, and the skip marks."""

import pytest


def cuda_gpus():
    """(number of CUDA devices torch sees, why none when 0)."""
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if not torch.cuda.is_available():
        return 0, f"no CUDA GPU here (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})"
    return torch.cuda.device_count(), ""


COUNT, WHY = cuda_gpus()
needs_gpu = pytest.mark.skipif(COUNT < 1, reason=f"needs a CUDA GPU: {WHY}")
needs_two_gpus = pytest.mark.skipif(COUNT < 2, reason=f"needs two CUDA GPUs (found {COUNT}): unverified until run on such a machine")


def uuid_of(index: int) -> str:
    """The CUDA UUID of GPU ``index``, as CUDA_VISIBLE_DEVICES accepts it (GPU-...)."""
    import torch

    return f"GPU-{torch.cuda.get_device_properties(index).uuid}"
