"""The paper's MNLI model: a 6-layer post-LN encoder with a BERT pooler and a 3-way classifier (docs/METHOD.md §2)."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from comera_lightning.models.dropout import Dropout
from comera_lightning.models.encoder import EncoderConfig, TransformerEncoderModel, init_bert_weights
from comera_lightning.models.optim_setup import (
    ParamGroupSettings,
    check_scheduler_interval,
    configure_comera_optimizers,
    paper_adamw,
)

__all__ = ["SentencePairClassifier", "paper_adamw"]

IGNORE_INDEX = -100


class SentencePairClassifier(LightningModule):
    """Sentence-pair classifier trained from scratch: embeddings, post-LN encoder, CLS pooler, linear head.

    The batch is a dict with ``input_ids``, ``token_type_ids``, ``attention_mask`` (all
    ``(batch, seq)``) and ``labels`` (``(batch,)``; ``-100`` is ignored). ``optimizer`` is any
    callable taking parameter groups (LightningCLI: ``--model.optimizer=torch.optim.SGD``); it
    always receives the cores/other groups of :func:`comera_param_groups`, whose ``lr_cores``,
    ``lr_other`` and ``weight_decay`` override the optimizer's own ``lr`` and ``weight_decay``. The
    groups are built in ``configure_optimizers``, i.e. after ``tensorize`` has swapped in the TT
    layers; the rank gates are ``ComeraCallback``'s (its ``gate_lr``).
    """

    def __init__(
        self,
        vocab_size: int = 30522,
        d_model: int = 768,
        num_layers: int = 6,
        num_heads: int = 12,
        d_ff: int = 3072,
        dropout: float = 0.1,
        max_positions: int = 512,
        type_vocab_size: int = 2,
        pad_token_id: int = 0,
        num_classes: int = 3,
        lr_cores: float = 1e-4,
        lr_other: float = 5e-5,
        weight_decay: float = 0.0,
        optimizer: OptimizerCallable = paper_adamw,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["step", "epoch"] = "step",
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes!r}.")
        check_scheduler_interval(scheduler_interval)
        # Callables stay out of the checkpoint: torch.load(weights_only=True) refuses pickled functions.
        # Pass optimizer=/scheduler= to load_from_checkpoint to resume with a non-default one.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        config = EncoderConfig(
            vocab_size=vocab_size,
            d_model=d_model,
            num_layers=num_layers,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            max_positions=max_positions,
            type_vocab_size=type_vocab_size,
            pad_token_id=pad_token_id,
        )
        self.backbone = TransformerEncoderModel(config)
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_classes)
        init_bert_weights(self.pooler)
        init_bert_weights(self.classifier)

        self.optimizer = optimizer
        self.param_group_settings = ParamGroupSettings(lr_cores, lr_other, weight_decay)
        self.scheduler = scheduler
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE_INDEX)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE_INDEX)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE_INDEX)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Class logits ``(batch, num_classes)`` from the first ([CLS]) token's hidden state."""
        hidden = self.backbone(input_ids, attention_mask, token_type_ids)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))
        return self.classifier(self.dropout(pooled))

    def _logits(self, batch: dict[str, Tensor]) -> Tensor:
        return self(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))

    def _shared_step(self, batch: dict[str, Tensor], stage: str, metric: MulticlassAccuracy) -> Tensor:
        logits = self._logits(batch)
        labels = batch["labels"]
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
        metric(logits.argmax(dim=-1), labels)
        on_epoch = stage != "train"
        batch_size = labels.shape[0]
        # sync_dist: under DDP every process reports the mean over all of them (each saw its own shard)
        self.log(f"{stage}/loss", loss, on_step=not on_epoch, on_epoch=on_epoch, prog_bar=True, batch_size=batch_size, sync_dist=on_epoch)
        self.log(f"{stage}/acc", metric, on_step=not on_epoch, on_epoch=on_epoch, prog_bar=True, batch_size=batch_size)
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy on one batch; logs ``train/loss`` and ``train/acc``."""
        return self._shared_step(batch, "train", self.train_acc)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Logs ``val/loss`` and ``val/acc`` (epoch averages)."""
        return self._shared_step(batch, "val", self.val_acc)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Logs ``test/loss`` and ``test/acc`` (epoch averages)."""
        return self._shared_step(batch, "test", self.test_acc)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Predicted class ids ``(batch,)``; ``labels`` is not needed."""
        return self._logits(batch).argmax(dim=-1)

    def configure_optimizers(self) -> Any:
        """The optimizer on the cores/gates/other groups (built now, after any tensorize) and the optional scheduler."""
        return configure_comera_optimizers(
            self, self.optimizer, self.scheduler, self.param_group_settings, self.hparams.scheduler_interval
        )
