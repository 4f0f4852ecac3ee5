"""A plain LightningModule that knows nothing of comera_lightning (used by the callback tests)."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from comera_lightning.data import EpochShuffleSampler, ResumableDataLoader


class PlainClassifier(L.LightningModule):
    """Two hidden layers and a small head; logs train_loss and val/loss like any user module."""

    def __init__(self, width: int = 128, lr: float = 3e-3, optimizer: str = "adamw", nan_at_step: int = -1, cosine: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 64), nn.ReLU(), nn.Dropout(dropout))
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
        # One plain optimizer over self.parameters(), as any user writes it: the gates are the callback's.
        name, lr = self.hparams.optimizer, self.hparams.lr
        if name == "sgd":
            optimizer = torch.optim.SGD(self.parameters(), lr=lr * 10, momentum=0.9)
        elif name == "came":
            from comera_lightning.optim import CAME

            optimizer = CAME(self.parameters(), lr=lr)
        elif name == "adagrad":
            optimizer = torch.optim.Adagrad(self.parameters(), lr=lr)
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=lr)
        if not self.hparams.cosine:
            return optimizer
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class LateBuiltClassifier(PlainClassifier):
    """The same model, its layers created in ``configure_model`` (as Lightning recommends for large models)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder = self.head = None

    def configure_model(self):
        if self.encoder is None:
            width = self.hparams.width
            self.encoder = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 64), nn.ReLU(), nn.Dropout(self.hparams.dropout))
            self.head = nn.Linear(64, 4)


def loaders(n: int = 512, batch_size: int = 32, seed: int = 0, shuffle: bool = False):
    """A fixed, learnable 4-class problem (train and validation loaders; ``shuffle``: resumable, seeded by epoch)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    y = (x[:, :4] + 0.1 * torch.randn(n, 4, generator=g)).argmax(1)
    data = TensorDataset(x, y)
    if shuffle:
        train = ResumableDataLoader(data, batch_size=batch_size, sampler=EpochShuffleSampler(data, seed=seed))
    else:
        train = DataLoader(data, batch_size=batch_size)
    val = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=64)
    return train, val
