"""Two-process CPU DDP (gloo) run with ComeraCallback; each rank saves its ranks and weights at the end of fit.

Modes: ``default`` (ddp), ``dead-bonds`` (ddp, training goes on after a bond reached rank 0),
``spawn`` (ddp_spawn, dead bonds too: the ranks are worker processes, so they save in ``on_fit_end``).
"""

import sys
from pathlib import Path

import lightning as L
import torch

from comera_lightning import BudgetConfig, ComeraCallback
from comera_lightning.rank import tt_layers
from tests.helpers.plain_modules import PlainClassifier, loaders


class SaveEachRank(L.Callback):
    def __init__(self, out: Path, comera: ComeraCallback):
        self.out, self.comera = out, comera

    def on_fit_end(self, trainer, pl_module):
        layers = tt_layers(pl_module)
        full = sum(sum(type(layer)(layer.in_features, layer.out_features, max_rank=8).physical_ranks) for _, layer in layers)
        record = {
            "ranks": {name: list(layer.physical_ranks) for name, layer in layers}, "full": full,
            "prunes": self.comera.prune_events, "l0": self.comera.loss_target_value,
            "state": {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()},
        }
        torch.save(record, self.out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    L.seed_everything(0)
    model = PlainClassifier()
    early_epochs, max_epochs = (2, 4) if mode == "default" else (1, 7)
    # The paper's late stage: it cuts bonds to rank 0 (the guarded one spares each bond's last rank), what this run checks.
    cb = ComeraCallback(max_rank=8, early_epochs=early_epochs, rank_weight=0.5, target_ratio=0.3, gate_lr=3e-2, late_objective="paper",
                        budget=BudgetConfig(allow_rank0=mode != "default"))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn" if mode == "spawn" else "ddp", max_epochs=max_epochs,
        callbacks=[cb, SaveEachRank(out, cb)], logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=out,
    )
    trainer.fit(model, *loaders())
