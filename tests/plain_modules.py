"""A plain LightningModule that knows nothing of comera_lightning (used by the callback tests)."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class PlainClassifier(L.LightningModule):
    """Two hidden layers and a small head; logs train_loss and val/loss like any user module."""

    def __init__(self, width: int = 128, lr: float = 3e-3, optimizer: str = "adamw", nan_at_step: int = -1):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.encoder(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        if self.global_step == self.hparams.nan_at_step:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        # Gates need a larger learning rate than the rest to move within a short test run.
        gates = [p for n, p in self.named_parameters() if ".gates." in n]
        rest = [p for n, p in self.named_parameters() if ".gates." not in n]
        groups = [{"params": rest}, {"params": gates, "lr": 3e-2, "weight_decay": 0.0}]
        if self.hparams.optimizer == "sgd":  # plain SGD moves a gate by lr·γ/N: it needs a far larger gate lr
            groups[1]["lr"] = 5.0
            return torch.optim.SGD(groups, lr=self.hparams.lr * 10, momentum=0.9)
        if self.hparams.optimizer == "came":
            from comera_lightning.optim import CAME

            return CAME(groups, lr=self.hparams.lr)
        return torch.optim.AdamW(groups, lr=self.hparams.lr)


def loaders(n: int = 512, batch_size: int = 32, seed: int = 0):
    """A fixed, learnable 4-class problem (train and validation loaders, no shuffling)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    y = (x[:, :4] + 0.1 * torch.randn(n, 4, generator=g)).argmax(1)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    val = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=64)
    return train, val
