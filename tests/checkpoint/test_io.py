"""AtomicCheckpointIO: a checkpoint file is whole or absent; no partial files outlive their process."""

import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comera_lightning import ComeraCallback
from comera_lightning.checkpoint.io import AtomicCheckpointIO, partial_files
from tests.helpers.plain_modules import PlainClassifier, loaders


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_save_keeps_the_previous_file_and_leaves_nothing(tmp_path):
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        io.save_checkpoint({"step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path)["step"] == 1
    assert partial_files(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_partial_files_of_dead_processes_are_removed_at_the_next_save(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".last.ckpt.partial-{int(dead.stdout)}"
    stale.write_bytes(b"half a checkpoint")
    assert partial_files(tmp_path, dead_only=True) == [stale]
    AtomicCheckpointIO().save_checkpoint({"step": 3}, tmp_path / "epoch=0.ckpt")
    assert not stale.exists() and torch.load(tmp_path / "epoch=0.ckpt")["step"] == 3


def test_the_callback_installs_it_and_keeps_a_custom_checkpoint_io(tmp_path):
    def fit(**kwargs):
        trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                            callbacks=[ComeraCallback(max_rank=4, early_epochs=1), ModelCheckpoint(tmp_path / "c", save_last=True)],
                            **kwargs)
        trainer.fit(PlainClassifier(), *loaders())
        return trainer.strategy.checkpoint_io

    assert type(fit()) is AtomicCheckpointIO and (tmp_path / "c" / "last.ckpt").exists()

    class Mine(L.pytorch.plugins.io.TorchCheckpointIO):
        pass

    assert type(fit(plugins=[Mine()])) is Mine
