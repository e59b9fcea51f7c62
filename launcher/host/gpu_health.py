"""The health checks of a node's GPUs and InfiniBand ports, run by ``launcher.host.health`` for GPU workers only.

- gpus: each GPU the workers take can be reached (through NVML, else as many as the driver lists in
  /proc/driver/nvidia/gpus), and none is held by a process outside the job (NVML's running processes, else the
  processes with the GPU's /dev/nvidiaN open; the driver's own daemons aside);
- nvml: through NVML (``nvidia-ml-py``, the optional extra ``gpu``, imported here only, on first use): no
  uncorrectable ECC error since the driver loaded, no retired page nor row remapping pending, no recovery action
  asked by the driver, every NVLink up. Without the library or a driver: SKIPPED, saying why;
- infiniband: each port of the devices NCCL would use (NCCL_IB_HCA) ACTIVE, from sysfs; one turned off on purpose
  (its physical state Disabled) is left out. No device: SKIPPED.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Callable, Optional

from launcher.host import preflight
from launcher.plan.health import FAILED, GPUS, INFINIBAND, NVML, OK, SKIPPED, Finding, Subject

# processes that keep every GPU's device file open and run nothing on it (/proc/PID/comm keeps 15 characters)
DAEMONS = ("nvidia-persiste", "nv-hostengine", "nvidia-smi", "dcgm", "nv-fabricmanage")
RECOVERY = "NVML_GPU_RECOVERY_ACTION_"  # pynvml's names of the recovery actions: NONE, GPU_RESET, NODE_REBOOT, ...


def probes(subject: Subject, own: Callable[[int], bool], places, stack: ExitStack) -> dict:
    """The GPU checks of ``subject`` by name, sharing one NVML session that ``stack`` closes. ``own``: whether a pid
    is the job's own; ``places``: where sysfs, procfs and the device files are (launcher.host.health.Places)."""
    nvml = Session()
    stack.callback(nvml.close)
    return {GPUS: lambda: check_gpus(subject.gpus, own, places, nvml),
            NVML: lambda: check_nvml(subject.gpus, nvml),
            INFINIBAND: lambda: check_infiniband(places.sys, subject.ib_hca)}


class Session:
    """NVML, started on first use and shut down with the checkup: (the pynvml module, None), or (None, why not)."""

    def __init__(self) -> None:
        self.found: Optional[tuple] = None

    def get(self) -> tuple:
        if self.found is None:
            self.found = _start()
        return self.found

    def close(self) -> None:
        if self.found is not None and self.found[0] is not None:
            try:
                self.found[0].nvmlShutdown()
            except Exception:  # nothing left to do about a library that will not shut down
                pass


def _start() -> tuple:
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'launcher[gpu]')"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError: no driver, no libnvidia-ml
        return None, f"NVML cannot start here ({e})"
    return pynvml, None


# ---------------------------------------------------------------- gpus


def check_gpus(gpus: tuple, own: Callable[[int], bool], places, nvml: Session) -> Finding:
    module, _ = nvml.get()
    if module is None:
        visible = preflight.count_gpus(places.proc, places.dev) or 0
        if visible < len(gpus):
            return Finding(GPUS, FAILED, f"its workers take {len(gpus)} GPU(s) but the driver shows "
                                         f"{visible or 'none'}")
        held = _held_by_files(gpus, own, places.proc)
    else:
        handles = {}
        for gpu in gpus:
            try:
                handles[gpu] = _handle(module, gpu)
            except module.NVMLError as e:
                return Finding(GPUS, FAILED, f"GPU {gpu} of its workers cannot be reached through NVML ({e})")
        held = _held_by_nvml(module, handles, own)
    if held:
        gpu, pid = held
        return Finding(GPUS, FAILED, f"GPU {gpu} is held by pid {pid} ({preflight.command_of(pid)}), a process "
                                     "outside this job")
    return Finding(GPUS, OK)


def _handle(nvml, gpu: str):
    """NVML's handle of a GPU by the machine's id: its index, or its UUID."""
    return nvml.nvmlDeviceGetHandleByIndex(int(gpu)) if gpu.isdigit() else nvml.nvmlDeviceGetHandleByUUID(gpu)


def _held_by_nvml(nvml, handles: dict, own: Callable[[int], bool]):
    """(GPU, pid) of the first process not the job's own that NVML sees computing on one of the GPUs, or None."""
    for gpu, handle in handles.items():
        for process in _ask(nvml, "nvmlDeviceGetComputeRunningProcesses", handle) or ():
            if not own(process.pid):
                return gpu, process.pid
    return None


def _held_by_files(gpus: tuple, own: Callable[[int], bool], proc: str):
    """(GPU, pid) of the first process not the job's own with one of the GPUs' device files open, or None; only
    processes whose /proc/PID/fd can be read (all, as root)."""
    wanted = {f"/dev/nvidia{int(g)}": g for g in gpus if g.isdigit()}
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        folder = os.path.join(proc, str(pid), "fd")
        try:
            targets = {os.readlink(os.path.join(folder, fd)) for fd in os.listdir(folder)}
        except OSError:
            continue
        taken = sorted(wanted[t] for t in targets & wanted.keys())
        if taken and not _daemon(proc, pid) and not own(pid):
            return taken[0], pid
    return None


def _daemon(proc: str, pid: int) -> bool:
    try:
        with open(os.path.join(proc, str(pid), "comm")) as f:
            return f.read().strip().startswith(DAEMONS)
    except OSError:
        return False


# ---------------------------------------------------------------- nvml


def check_nvml(gpus: tuple, nvml: Session) -> Finding:
    module, why = nvml.get()
    if module is None:
        return Finding(NVML, SKIPPED, why)
    troubles = []
    for gpu in gpus:
        try:
            handle = _handle(module, gpu)
        except module.NVMLError:
            continue  # the gpus check names it
        trouble = gpu_trouble(module, handle)
        if trouble:
            troubles.append(f"GPU {gpu} {trouble}")
    return Finding(NVML, FAILED, "; ".join(troubles)) if troubles else Finding(NVML, OK)


def gpu_trouble(nvml, handle) -> Optional[str]:
    """What NVML says is wrong with one GPU, or None; what the GPU or driver does not report is not judged."""
    ecc = _ask(nvml, "nvmlDeviceGetTotalEccErrors", handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
               nvml.NVML_VOLATILE_ECC)
    if ecc:
        return f"has {ecc} uncorrectable ECC error(s) since the driver loaded"
    if _ask(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle) == nvml.NVML_FEATURE_ENABLED:
        return "has retired pages pending (a GPU reset retires them)"
    rows = _ask(nvml, "nvmlDeviceGetRemappedRows", handle)
    if rows and rows[2]:
        return "has a row remapping pending (a GPU reset applies it)"
    action = recovery_action(nvml, handle)
    if action:
        return f"needs the recovery action {action} (NVML)"
    down = [str(link) for link in range(nvml.NVML_NVLINK_MAX_LINKS)
            if _ask(nvml, "nvmlDeviceGetNvLinkState", handle, link) == nvml.NVML_FEATURE_DISABLED]
    if down:
        return f"has NVLink {', '.join(down)} down"
    return None


def recovery_action(nvml, handle) -> Optional[str]:
    """The recovery action the driver asks for (GPU_RESET, NODE_REBOOT, ...) by pynvml's name; None for none, or
    where the driver or the library does not report it."""
    field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    values = _ask(nvml, "nvmlDeviceGetFieldValues", handle, [field]) if field is not None else None
    if not values or values[0].nvmlReturn != nvml.NVML_SUCCESS:
        return None
    action = values[0].value.uiVal
    names = {getattr(nvml, n): n[len(RECOVERY):] for n in dir(nvml) if n.startswith(RECOVERY)}
    return None if names.get(action) == "NONE" else names.get(action, f"number {action}")


def _ask(nvml, name: str, *args):
    """NVML's answer, or None where the function is not in this library or the GPU does not support it."""
    call: Optional[Callable] = getattr(nvml, name, None)
    if call is None:
        return None
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


# ---------------------------------------------------------------- infiniband


def check_infiniband(sys_root: str, hca: Optional[str]) -> Finding:
    """Every port of the InfiniBand devices NCCL would use ACTIVE, from /sys/class/infiniband/DEV/ports/N/state."""
    base = os.path.join(sys_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        devices = []
    used = hca_filter(hca)
    ports = [(d, p) for d in devices for p in _ports(os.path.join(base, d)) if used(d, p)]
    if not ports:
        where = f" among NCCL_IB_HCA={hca}" if devices else ""
        return Finding(INFINIBAND, SKIPPED, f"no InfiniBand port here{where} ({base})")
    down = []
    for device, port in ports:
        folder = os.path.join(base, device, "ports", port)
        state, physical = _read(folder, "state"), _read(folder, "phys_state")
        if not state.endswith("ACTIVE") and not physical.endswith("Disabled"):
            down.append(f"{device} port {port} is {state.partition(': ')[2] or state or 'unreadable'}"
                        + (f" ({physical.partition(': ')[2] or physical})" if physical else ""))
    return Finding(INFINIBAND, FAILED, "InfiniBand " + ", ".join(down)) if down else Finding(INFINIBAND, OK)


def _ports(device: str) -> list:
    try:
        return sorted(os.listdir(os.path.join(device, "ports")), key=lambda p: (len(p), p))
    except OSError:
        return []


def _read(folder: str, name: str) -> str:
    try:
        with open(os.path.join(folder, name)) as f:
            return f.read(256).strip()
    except (OSError, UnicodeDecodeError):
        return ""


def hca_filter(text: Optional[str]) -> Callable[[str, str], bool]:
    """Whether NCCL uses a (device, port), as it reads NCCL_IB_HCA: a comma list of DEVICE[:PORT], each a prefix of
    a device's name (``=`` first: exact names), the whole list those left out when it starts with ``^``."""
    text = (text or "").strip()
    if not text:
        return lambda device, port: True
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    entries = [e.strip().partition(":")[::2] for e in text.lstrip("=").split(",") if e.strip()]

    def listed(device: str, port: str) -> bool:
        return any((device == name if exact else device.startswith(name)) and p in ("", port) for name, p in entries)

    return lambda device, port: listed(device, port) != exclude
