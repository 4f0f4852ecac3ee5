"""Two-process CPU run (gloo) of DLRM under TorchRecDMPStrategy with ComeraCallback; each rank saves what it saw.

Usage: ``dmp_script.py OUT MODE`` with MODE ``fit`` (train with prunes, checkpoint every step, test)
or ``resume`` (continue OUT's ``last.ckpt`` for more steps). Tables: three of >= 1,000 rows (TT,
replicated) and one of 64 rows (dense, sharded table-wise by TorchRec's planner).
"""

import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comera_lightning import ComeraCallback
from comera_lightning.data.criteo import SyntheticCriteoDataModule
from comera_lightning.distributed import TorchRecDMPStrategy
from comera_lightning.distributed.sharded_state import is_sharded
from comera_lightning.models.dlrm import DLRMClassifier
from comera_lightning.rank import tt_layers

TABLES = [4096, 2048, 1500, 64]


class SaveEachRank(L.Callback):
    """Each rank's TT ranks, prune count, replicated state and its shard of the dense table, after fit and test."""

    def __init__(self, out: Path, comera: ComeraCallback):
        self.out, self.comera, self.record = out, comera, {}

    def on_fit_end(self, trainer, pl_module):
        collection = pl_module.model.sparse_arch.embedding_bag_collection
        self.record.update(
            step=trainer.global_step, prunes=self.comera.prune_events, ranks={n: list(m.physical_ranks) for n, m in tt_layers(pl_module)},
            collection=type(collection).__name__, sharded=type(collection.sharded_tables).__name__,
            plan=str(trainer.strategy.plan), replicated={k: v.detach().clone() for k, v in pl_module.state_dict().items() if not is_sharded(v)},
            dense_table=[p.detach().clone() for n, p in collection.sharded_tables.named_parameters()],
            full_state={k: v.clone() for k, v in trainer.strategy.lightning_module_state_dict().items() if k.endswith("t_cat_3.weight")},
        )

    def on_test_end(self, trainer, pl_module):
        self.record["test"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
        torch.save(self.record, self.out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    L.seed_everything(0)
    data = SyntheticCriteoDataModule(batch_size=64, num_batches=8, val_batches=2, test_batches=2, table_sizes=TABLES, num_dense=4)
    model = DLRMClassifier(table_sizes=TABLES, num_dense=4, embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    comera = ComeraCallback(
        tensorize={"target_modules": ["model.sparse_arch.embedding_bag_collection"], "embedding_max_rank": 8, "embedding_num_cores": 3},
        early_steps=2, prune_every_n_steps=1, early_epochs=None, late_epochs=None, prune_every_n_epochs=None, gate_lr=0.05,
    )
    strategy = TorchRecDMPStrategy(sharding_types=["table_wise"], sparse_lr=0.05, timeout=timedelta(seconds=90))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_steps=6 if mode == "fit" else 10, max_epochs=3,
        callbacks=[comera, ModelCheckpoint(dirpath=out / "ckpt", save_last=True, every_n_train_steps=1), SaveEachRank(out, comera)],
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=out, limit_val_batches=1,
    )
    trainer.fit(model, datamodule=data, ckpt_path=str(out / "ckpt" / "last.ckpt") if mode == "resume" else None)
    trainer.test(model, datamodule=data)
