"""A small Lightning 2.x DDP run on CPU, as a Lightning user writes it for torchrun: Trainer(devices=2, strategy="ddp").

Writes DIR/result.RANK.json: the cluster environment Lightning chose, the world it saw, and the final weights' sum.
"""

import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out_dir):
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")), strategy="ddp",
                        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data)
    result = {"environment": type(trainer.strategy.cluster_environment).__name__, "world_size": trainer.world_size,
              "global_rank": trainer.global_rank, "weights": float(sum(p.sum() for p in model.parameters()))}
    with open(os.path.join(out_dir, f"result.{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
