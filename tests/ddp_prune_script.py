"""Two-process CPU DDP (gloo) run with ComeraCallback; each rank saves its ranks and weights."""

import sys
from pathlib import Path

import lightning as L
import torch
from plain_modules import PlainClassifier, loaders

from comera_lightning import ComeraCallback
from comera_lightning.rank import tt_layers

if __name__ == "__main__":
    out = Path(sys.argv[1])
    L.seed_everything(0)
    model = PlainClassifier()
    early_epochs, max_epochs = (1, 7) if sys.argv[2:] == ["dead-bonds"] else (2, 4)  # dead-bonds: training goes on after rank 0
    cb = ComeraCallback(max_rank=8, early_epochs=early_epochs, rank_weight=0.5, target_ratio=0.3, gate_lr=3e-2)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs, callbacks=[cb], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=out,
    )
    trainer.fit(model, *loaders())
    ranks = {name: list(layer.physical_ranks) for name, layer in tt_layers(model)}
    full = sum(sum(type(layer)(layer.in_features, layer.out_features, max_rank=8).physical_ranks) for _, layer in tt_layers(model))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    record = {"ranks": ranks, "full": full, "prunes": cb.prune_events, "state": state, "l0": cb.loss_target_value}
    torch.save(record, out / f"rank{trainer.global_rank}.pt")
