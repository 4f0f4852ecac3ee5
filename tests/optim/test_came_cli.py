"""CAME is chosen like any torch optimizer in LightningCLI (`--optimizer comera_lightning.optim.CAME`)."""

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn

from comera_lightning.optim import CAME


class Regressor(L.LightningModule):
    """A module without configure_optimizers: LightningCLI builds the optimizer from --optimizer."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def training_step(self, batch, batch_idx):
        return self.layer(torch.randn(16, 8)).square().mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(4), batch_size=1)


def test_lightning_cli_builds_came_from_the_command_line(tmp_path):
    cli = LightningCLI(
        Regressor,
        run=False,
        args=["--optimizer", "comera_lightning.optim.CAME", "--optimizer.lr", "0.001", "--optimizer.weight_decay", "0.01",
              "--trainer.max_steps", "2", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
              "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"],
    )
    cli.trainer.fit(cli.model)
    optimizer = cli.trainer.optimizers[0]
    assert isinstance(optimizer, CAME)
    assert optimizer.param_groups[0]["lr"] == 0.001 and optimizer.param_groups[0]["weight_decay"] == 0.01
    assert cli.trainer.global_step == 2
