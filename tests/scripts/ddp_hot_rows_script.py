"""Two-process CPU DDP (gloo): a TTEmbedding trained on different ids per rank, then served from its hot rows.

Each rank saves what it serves for the same ids in eval mode (hot rows) and what it computes from
the cores (autograd on: nothing cached), and the ids it would serve from its cache. (Plain DDP
broadcasts the count buffers from rank 0; ``ComeraCallback`` keeps them local to each rank.)
"""

import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning import TTEmbedding
from tests.layers.test_hot_rows import zipf_ids

ROWS = 20_000


class TableModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.table = TTEmbedding(ROWS, 8, max_rank=4, num_cores=3, cache_rows=400, deduplicate=True)
        self.head = nn.Linear(8, 1)

    def forward(self, ids):
        return self.head(self.table(ids).sum(1)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        ids, target = batch
        return F.mse_loss(self(ids), target)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class SaveServed(L.Callback):
    def __init__(self, out: Path):
        self.out = out

    def on_fit_end(self, trainer, pl_module):
        table = pl_module.table.eval()
        ids = zipf_ids(2_000, ROWS, seed=99)
        with torch.no_grad():
            served = table(ids)
        with torch.enable_grad():
            contracted = table(ids).detach()
        record = {"served": served, "contracted": contracted, "hot": table.hot_ids(), "cores": [c.detach().clone() for c in table.cores]}
        torch.save(record, self.out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    L.seed_everything(0)
    ids = zipf_ids(64 * 40 * 4, ROWS, seed=1).view(-1, 4)
    data = torch.utils.data.TensorDataset(ids, torch.randn(ids.shape[0]))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, callbacks=[SaveServed(out)], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=out,
    )
    trainer.fit(TableModel(), torch.utils.data.DataLoader(data, batch_size=64, shuffle=True))
