"""A Fleet job with AMP (float16 autocast) and a GradScaler on CUDA; --plain trains the same model on
the same batches in one process without Fleet. Writes the final parameters to --out. (Without CUDA it
runs the same on the CPU with bfloat16, so the script itself can be checked anywhere.)"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--plain", action="store_true")
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
kind = "cuda" if torch.cuda.is_available() else "cpu"
half = torch.float16 if kind == "cuda" else torch.bfloat16
if args.plain:
    device = torch.device(kind, 0) if kind == "cuda" else torch.device("cpu")
else:
    from launcher import fleet

    device = fleet.init(is_collective=True).device
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if not args.plain:
    optimizer = fleet.distributed_optimizer(optimizer)
    model = fleet.distributed_model(model)
scaler = torch.amp.GradScaler(kind)
data = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x = torch.randn(32, 64, generator=data).to(device)
    y = torch.randint(10, (32,), generator=data).to(device)
    with torch.autocast(kind, dtype=half):
        loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
state = {k: v.detach().float().cpu() for k, v in (model.module if hasattr(model, "module") else model).state_dict().items()}
torch.save({"state": state, "loss": loss.item(), "scale": scaler.get_scale()}, args.out)
print(f"AMP_DONE loss={loss.item():.6f} scale={scaler.get_scale()}", flush=True)
