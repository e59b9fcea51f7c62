"""Prints, as JSON on one line, what this worker's CUDA sees and what the launcher told it:
FLAGS_selected_gpus, CUDA_VISIBLE_DEVICES, the device count and the UUID of the selected device.
The Paddle way: the script itself puts its work on GPU FLAGS_selected_gpus."""

import json
import os

import torch

gpu = os.environ.get("FLAGS_selected_gpus")
record = {"rank": int(os.environ["RANK"]), "flags": gpu, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "count": torch.cuda.device_count(), "uuid": None, "device": None}
if gpu is not None:
    torch.cuda.set_device(int(gpu))
    x = torch.ones(4, device="cuda") * 2
    record["device"] = str(x.device)
    record["sum"] = float(x.sum())
    record["uuid"] = f"GPU-{torch.cuda.get_device_properties(int(gpu)).uuid}"
print("CUDA_PROBE " + json.dumps(record), flush=True)
