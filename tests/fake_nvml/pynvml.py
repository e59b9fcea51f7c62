"""A stand-in for nvidia-ml-py's ``pynvml`` where there is no GPU: the names launcher.host.gpu_health calls, with
the real module's constants and error class, answering from the machine described in the variable FAKE_NVML (JSON,
read at each nvmlInit):

    {"driver": true,                       # false: nvmlInit fails as without a driver
     "gpus": [{"ecc": 0,                   # volatile uncorrected ECC errors (null: not supported)
               "retired_pending": false, "remap_pending": false,
               "recovery": 0,              # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value (null: not reported)
               "links": [1, 1, 0],         # NvLinkState of links 0.. (the others: not supported)
               "processes": [1234],        # pids computing on it
               "lost": false}]}            # its handle fails as a GPU that fell off the bus

Put its folder first on PYTHONPATH (or sys.path) to load it in place of the real library. ``calls`` counts
nvmlInit and nvmlShutdown, for the tests that look at them in process.
"""

import json
import os
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4

WORDS = {NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument", NVML_ERROR_NOT_SUPPORTED: "Not Supported",
         NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_GPU_IS_LOST: "GPU is lost"}
calls = {"init": 0, "shutdown": 0}
_machine = {}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return WORDS.get(self.value, "Unknown Error")


def nvmlInit():
    global _machine
    _machine = json.loads(os.environ.get("FAKE_NVML", "{}"))
    if not _machine.get("driver", True):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    calls["init"] += 1


def nvmlShutdown():
    calls["shutdown"] += 1


def _gpu(handle):
    if handle.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return handle


def nvmlDeviceGetHandleByIndex(index):
    gpus = _machine.get("gpus", [])
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _gpu(gpus[index])


def nvmlDeviceGetHandleByUUID(uuid):
    for gpu in _machine.get("gpus", []):
        if gpu.get("uuid") == uuid:
            return _gpu(gpu)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def _supported(value):
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    assert (error_type, counter_type) == (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
    return _supported(handle.get("ecc", 0))


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    return NVML_FEATURE_ENABLED if handle.get("retired_pending") else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(handle):
    return (0, 0, int(bool(handle.get("remap_pending"))), 0)


def nvmlDeviceGetFieldValues(handle, field_ids):
    assert field_ids == [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
    action = handle.get("recovery", 0)
    status = NVML_ERROR_NOT_SUPPORTED if action is None else NVML_SUCCESS
    return [SimpleNamespace(fieldId=field_ids[0], nvmlReturn=status, value=SimpleNamespace(uiVal=action or 0))]


def nvmlDeviceGetNvLinkState(handle, link):
    links = handle.get("links", [])
    return _supported(links[link] if link < len(links) else None)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in handle.get("processes", [])]
