"""Run by tests/unit/lightning/test_distributed.py in a subprocess: one Lightning fit on two gloo ranks under
AmpkitPrecision, Lightning's own launcher starting the ranks. Each rank writes what it ended with to OUT/rankN.json.

    python ranks_script.py POLICY STRATEGY OUT      # STRATEGY: ddp_spawn, or fsdp2 (ModelParallelStrategy + fully_shard)

Each rank starts from weights of its own (seeded by its rank, as a script that forgot to seed alike would), and rank 1
alone puts an inf into one gradient at optimizer step 2, after DDP's all-reduce (or into its own FSDP shard).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torch import nn

from ampkit.lightning import AmpkitPrecision


class Ranked(L.LightningModule):
    def __init__(self, out: str, shard: bool) -> None:
        super().__init__()
        self.out, self.shard = out, shard
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
        self.losses: list[float] = []

    def setup(self, stage: str) -> None:
        torch.manual_seed(self.global_rank)  # each rank its own start: the plugin must make them agree
        for m in self.net:
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def configure_model(self) -> None:
        if self.shard:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x).float(), y)
        self.losses.append(loss.item())
        return loss

    def on_after_backward(self) -> None:
        if self.global_step == 2 and self.global_rank == 1:
            grad = self.net[0].weight.grad
            (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")

    def on_train_end(self) -> None:
        engine = self.trainer.precision_plugin.engine
        weights = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in self.net.parameters()]
        Path(self.out, f"rank{self.global_rank}.json").write_text(json.dumps({
            "skipped": engine.skipped_steps, "scale": engine.scale, "steps": engine.steps, "losses": self.losses,
            "weights": [w.detach().float().flatten().tolist() for w in weights], "dtype": str(weights[0].dtype),
        }))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g))
        return torch.utils.data.DataLoader(data, batch_size=8)


if __name__ == "__main__":
    policy, strategy, out = sys.argv[1:4]
    warnings.filterwarnings("ignore")  # Lightning's advice on CPU runs; the test reads the files, not the console
    torch.set_num_threads(1)
    if strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy=strategy, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, plugins=[AmpkitPrecision(policy)])
    trainer.fit(Ranked(out, shard=not isinstance(strategy, str)))
