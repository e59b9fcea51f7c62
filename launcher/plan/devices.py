"""Which GPUs the workers of a node get: --selected_gpus, CUDA_VISIBLE_DEVICES and the GPUs found. Pure."""

from __future__ import annotations

from typing import Mapping, Optional

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan.model import LaunchOptions
from launcher.plan.parsing import DIGITS, first_duplicate


def select_gpus(opts: LaunchOptions, env: Mapping[str, str], gpu_count: Optional[int]):
    """The FLAGS_selected_gpus value of each local worker, or None for CPU workers."""
    visible = _visible_devices(env)
    if opts.selected_gpus is None:
        available = visible if visible is not None else [str(i) for i in range(gpu_count or 0)]
        if not available or (visible is not None and not gpu_count):
            return None, ()
        n = opts.nproc_per_node or len(available)
        if n > len(available):
            raise LaunchError(f"--nproc_per_node {n} asks for more GPUs than the {len(available)} available ({','.join(available)}); give at most {len(available)}.")
        return tuple(_gpu_flag(g, visible) for g in available[:n]), ()
    ids = _parse_gpu_ids(opts.selected_gpus, visible)
    if opts.nproc_per_node is not None and opts.nproc_per_node != len(ids):
        raise LaunchError(f"--nproc_per_node {opts.nproc_per_node} disagrees with --selected_gpus={opts.selected_gpus} ({len(ids)} GPUs); give one of them, or make them match.")
    if visible is not None:
        missing = [g for g in ids if _gpu_key(g) not in map(_gpu_key, visible)]
        if missing:
            raise LaunchError(f"GPU {missing[0]} of --selected_gpus={opts.selected_gpus} is not in CUDA_VISIBLE_DEVICES={','.join(visible)}; choose among those.")
    elif gpu_count is not None:
        missing = [g for g in ids if int(g) >= gpu_count]
        if missing:
            raise LaunchError(f"GPU {missing[0]} of --selected_gpus={opts.selected_gpus} does not exist: this machine has {gpu_count} GPU(s), ids 0 to {gpu_count - 1}.")
    notes = ()
    if not gpu_count:
        notes = (f"no GPU detected on this machine: passing --selected_gpus={opts.selected_gpus} on to the workers "
                 f"as given (FLAGS_selected_gpus); they run on a GPU only if CUDA finds one in the worker.",)
    return tuple(_gpu_flag(g, visible) for g in ids), notes


def device_of(gpu: str, env: Mapping[str, str]) -> str:
    """The device a worker's GPU (its FLAGS_selected_gpus in the launcher's view) is, as CUDA_VISIBLE_DEVICES names
    devices: its entry of the launcher's CUDA_VISIBLE_DEVICES when that is set (an index, or a name such as a UUID),
    else the id itself; what a worker that sees its GPU alone (torchrun's --virtual-local-rank) is given."""
    visible = _visible_devices(env)
    return visible[int(gpu)] if visible is not None else gpu


def _visible_devices(env: Mapping[str, str]):
    value = env.get(ev.CUDA_VISIBLE_DEVICES)
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_gpu_ids(text: str, visible) -> list:
    ids = [g.strip() for g in text.split(",")]
    named = {_gpu_key(v) for v in visible or ()}
    for g in ids:
        if not (DIGITS.fullmatch(g) or _gpu_key(g) in named):
            raise LaunchError(f"--selected_gpus={text} has a malformed GPU id {g!r}; give comma-separated ids such as 0,1,2,3.")
    keys = [_gpu_key(g) for g in ids]
    dup = first_duplicate(keys)
    if dup is not None:
        same = [g for g, k in zip(ids, keys) if k == dup]
        spelled = f" ({' and '.join(same)})" if len(set(same)) > 1 else ""
        raise LaunchError(f"--selected_gpus={text} names GPU {dup} twice{spelled}; give each GPU once.")
    return ids


def _gpu_key(gpu: str) -> str:
    """A GPU id as a device is known: a number without leading zeros (00 is GPU 0), or a name such as a UUID."""
    return str(int(gpu)) if DIGITS.fullmatch(gpu) else gpu


def _gpu_flag(gpu: str, visible) -> str:
    """A GPU id as the worker sees it: its index in CUDA_VISIBLE_DEVICES when that is set."""
    if visible is None:
        return _gpu_key(gpu)
    return str([_gpu_key(v) for v in visible].index(_gpu_key(gpu)))
