"""One training run for the fault-injection tests: resumes from <dir>/ckpt/last.ckpt when it exists.

Usage: python fault_run_script.py <dir>. Writes <dir>/final.pt (the weights and the callback's
schedule) when training ends. Slowed a little per step so that a kill can land anywhere.
"""

import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comera_lightning import ComeraCallback
from tests.helpers.plain_modules import PlainClassifier, loaders


class Slow(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(0.01)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    last = out / "ckpt" / "last.ckpt"
    L.seed_everything(0)
    model = PlainClassifier(dropout=0.2)
    callback = ComeraCallback(max_rank=8, early_epochs=2, late_epochs=2, rank_weight=0.5, target_ratio=0.3, gate_lr=3e-2)
    saver = ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=3, save_last=True)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=6, callbacks=[callback, saver, Slow()], logger=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True, default_root_dir=out,
    )
    trainer.fit(model, *loaders(shuffle=True), ckpt_path=last if last.exists() else None)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"state": state, "schedule": callback.schedule.state_dict()}, out / "final.pt")
    print("finished", flush=True)
