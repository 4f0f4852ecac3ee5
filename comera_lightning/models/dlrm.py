"""DLRM click-through-rate model (TorchRec's ``DLRM``) as a LightningModule, with AUC/NE/accuracy metrics.

Module names inside :class:`DLRMClassifier` (what ``tensorize`` rules name):

* ``model.sparse_arch.embedding_bag_collection`` — the TorchRec ``EmbeddingBagCollection``
  (tables ``model.sparse_arch.embedding_bag_collection.embedding_bags.t_<feature>``);
* ``model.dense_arch.model._mlp.<i>._linear`` — the bottom (dense) MLP's ``nn.Linear`` layers;
* ``model.over_arch.model.0._mlp.<i>._linear`` — the top (over) MLP's hidden layers;
* ``model.over_arch.model.1`` — the final ``nn.Linear`` to one logit (the output head).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC

from comera_lightning._optional import require
from comera_lightning.data.click_logs import ClickBatch, embedding_bag_configs
from comera_lightning.models.optim_setup import (
    ParamGroupSettings,
    check_scheduler_interval,
    configure_comera_optimizers,
    paper_adamw,
)

_FEATURE = "comera_lightning.models.dlrm (DLRMClassifier)"
DLRM = require("torchrec.models.dlrm", _FEATURE).DLRM
EmbeddingBagCollection = require("torchrec.modules.embedding_modules", _FEATURE).EmbeddingBagCollection
KeyedJaggedTensor = require("torchrec.sparse.jagged_tensor", _FEATURE).KeyedJaggedTensor

__all__ = ["DLRMClassifier", "NormalizedEntropy", "binary_entropy"]

def binary_entropy(p: Tensor) -> Tensor:
    """Entropy ``-(p log p + (1-p) log(1-p))`` in nats of a Bernoulli(p), with ``0 log 0 = 0``."""
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))


class NormalizedEntropy(Metric):
    """Normalized entropy: mean binary cross-entropy divided by the entropy of the positive rate.

    ``NE = BCE / H(p)`` with ``p`` the fraction of positive labels seen (He et al., 2014).
    NE < 1 means the model beats always predicting the base rate. States are sums, so the
    value is exact under DDP. ``update`` takes logits by default (``from_logits=False``:
    probabilities, clamped away from 0 and 1). With only one class seen ``H(p) = 0`` and
    the result is ``inf`` (or ``nan``).
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, from_logits: bool = True, eps: float = 1e-7, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.from_logits = from_logits
        self.eps = eps
        self.add_state("bce_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("positives", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Accumulate the summed BCE, the positives and the count of one batch."""
        if preds.shape != target.shape:
            raise ValueError(
                f"preds and target must have the same shape, got {tuple(preds.shape)} and {tuple(target.shape)}."
            )
        preds = preds.detach().double()
        target = target.detach().double()
        if self.from_logits:
            bce = F.binary_cross_entropy_with_logits(preds, target, reduction="sum")
        else:
            bce = F.binary_cross_entropy(preds.clamp(self.eps, 1 - self.eps), target, reduction="sum")
        self.bce_sum += bce
        self.positives += target.sum()
        self.count += target.numel()

    def compute(self) -> Tensor:
        """``(bce_sum / count) / H(positives / count)``."""
        p = self.positives / self.count
        return (self.bce_sum / self.count) / binary_entropy(p)


def _stage_metrics(auroc_thresholds: int | None) -> nn.ModuleDict:
    """AUC, accuracy (at 0.5) and NE for one stage."""
    return nn.ModuleDict(
        {"auc": BinaryAUROC(thresholds=auroc_thresholds), "acc": BinaryAccuracy(), "ne": NormalizedEntropy()}
    )


def _check_layer_sizes(name: str, sizes: Sequence[int], min_len: int) -> list[int]:
    """Return ``sizes`` as ints; raise a ValueError unless it has ``min_len`` positive entries."""
    sizes = list(sizes)
    if len(sizes) < min_len or any(int(s) < 1 for s in sizes):
        raise ValueError(
            f"{name} must be a list of at least {min_len} positive layer sizes, got {sizes!r}."
        )
    return [int(s) for s in sizes]


def _check_arch(num_dense: int, embedding_dim: int, dense_sizes: list[int], over_sizes: list[int]) -> tuple[list[int], list[int]]:
    """Validated dense- and over-arch layer sizes (the dense vector joins the dot interaction; one logit out)."""
    if num_dense < 1:
        raise ValueError(f"num_dense must be at least 1, got {num_dense!r}.")
    if embedding_dim < 1:
        raise ValueError(f"embedding_dim must be positive, got {embedding_dim!r}.")
    dense_sizes = _check_layer_sizes("dense_arch_layer_sizes", dense_sizes, 1)
    if dense_sizes[-1] != embedding_dim:
        raise ValueError(
            f"the last dense_arch_layer_sizes entry must equal embedding_dim={embedding_dim} (the dense "
            f"vector takes part in the dot interaction), got dense_arch_layer_sizes={dense_sizes!r}."
        )
    over_sizes = _check_layer_sizes("over_arch_layer_sizes", over_sizes, 2)
    if over_sizes[-1] != 1:
        raise ValueError(f"the last over_arch_layer_sizes entry must be 1 (one click logit), got over_arch_layer_sizes={over_sizes!r}.")
    return dense_sizes, over_sizes


class DLRMClassifier(LightningModule):
    """DLRM (dense MLP, embedding bags, dot interaction, over MLP) trained with BCE on click logs.

    The batch is a :class:`~comera_lightning.data.click_logs.ClickBatch`; ``table_sizes``,
    ``feature_names`` and ``num_dense`` come from a ``ClickLogDataModule`` (LightningCLI:
    ``parser.link_arguments("data.table_sizes", "model.table_sizes", apply_on="instantiate")``
    and likewise for the other two). ``feature_names=None`` means ``cat_0 … cat_{T-1}``
    (the Criteo keys). ``optimizer`` is any callable taking parameter groups; it receives
    the cores/other groups of :func:`comera_param_groups` (built in ``configure_optimizers``, after
    ``tensorize``; the rank gates are ``ComeraCallback``'s), whose ``lr_cores``/``lr_other``/``weight_decay`` override
    the optimizer's own (``core_weight_decay``, default ``weight_decay``, for the TT cores).
    Logs ``{train,val,test}/{loss,auc,acc,ne}``. The AUC is exact (it keeps every prediction
    of the epoch) unless ``auroc_thresholds`` bins it (constant memory, for long epochs such as
    Criteo's).

    ``meta_embeddings=True`` declares the ``EmbeddingBagCollection`` on the ``meta`` device
    (no memory): ``ComeraCallback`` (or ``tensorize``) then creates the TT tables directly,
    so a Criteo-scale model never holds its dense tables. Training it without tensorizing the
    collection is refused in ``setup``.
    """

    def __init__(
        self,
        table_sizes: list[int],
        num_dense: int,
        feature_names: list[str] | None = None,
        embedding_dim: int = 16,
        dense_arch_layer_sizes: list[int] = [64, 16],  # noqa: B006 - LightningCLI needs the literal
        over_arch_layer_sizes: list[int] = [64, 32, 1],  # noqa: B006
        lr_cores: float = 1e-3,
        lr_other: float = 1e-3,
        weight_decay: float = 0.0,
        core_weight_decay: float | None = None,
        optimizer: OptimizerCallable = paper_adamw,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["step", "epoch"] = "step",
        auroc_thresholds: int | None = None,
        meta_embeddings: bool = False,
    ) -> None:
        super().__init__()
        table_sizes = _check_layer_sizes("table_sizes", table_sizes, 1)
        if feature_names is None:
            feature_names = [f"cat_{i}" for i in range(len(table_sizes))]
        feature_names = list(feature_names)
        if len(feature_names) != len(table_sizes):
            raise ValueError(
                f"got {len(feature_names)} feature_names {feature_names!r} but {len(table_sizes)} table_sizes; "
                "give one table size per sparse feature."
            )
        dense_sizes, over_sizes = _check_arch(num_dense, embedding_dim, dense_arch_layer_sizes, over_arch_layer_sizes)
        check_scheduler_interval(scheduler_interval)
        if auroc_thresholds is not None and auroc_thresholds < 2:
            raise ValueError(f"auroc_thresholds must be None (exact AUC) or at least 2, got {auroc_thresholds!r}.")
        # Callables stay out of the checkpoint: torch.load(weights_only=True) refuses pickled functions.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        ebc = EmbeddingBagCollection(
            tables=embedding_bag_configs(feature_names, table_sizes, embedding_dim),
            device=torch.device("meta") if meta_embeddings else None,
        )
        self.model = DLRM(
            embedding_bag_collection=ebc, dense_in_features=num_dense,
            dense_arch_layer_sizes=dense_sizes, over_arch_layer_sizes=over_sizes,
        )
        self.optimizer = optimizer
        self.param_group_settings = ParamGroupSettings(lr_cores, lr_other, weight_decay, core_weight_decay)
        self.scheduler = scheduler
        self.train_metrics = _stage_metrics(auroc_thresholds)
        self.val_metrics = _stage_metrics(auroc_thresholds)
        self.test_metrics = _stage_metrics(auroc_thresholds)

    def setup(self, stage: str) -> None:
        """Refuse to run with tables still on the meta device (``meta_embeddings`` without tensorizing)."""
        on_meta = [name for name, p in self.named_parameters() if p.device.type == "meta"]
        if on_meta:
            raise ValueError(
                f"DLRMClassifier was built with meta_embeddings=True but {len(on_meta)} parameters are still on the "
                f"meta device ({on_meta[0]}, ...): add ComeraCallback targeting "
                "'model.sparse_arch.embedding_bag_collection' (or call comera_lightning.tensorize on the module) "
                "so the tables are created in tensor-train form, or set meta_embeddings=False for dense tables."
            )

    def _apply(self, fn, recurse: bool = True):
        """Move/cast the module; a collection still declared on the meta device stays there (no data to move).

        Lightning moves the module to the CPU when a run ends, also after the error in ``setup``.
        """
        sparse_arch = self.model.sparse_arch
        collection = sparse_arch.embedding_bag_collection
        if not any(p.is_meta for p in collection.parameters()):
            return super()._apply(fn, recurse)
        sparse_arch.embedding_bag_collection = None
        try:
            return super()._apply(fn, recurse)
        finally:
            sparse_arch.embedding_bag_collection = collection

    def forward(self, dense: Tensor, sparse: KeyedJaggedTensor) -> Tensor:
        """Click logits ``(batch,)`` from dense features ``(batch, num_dense)`` and a KJT of ids."""
        return self.model(dense_features=dense, sparse_features=sparse).squeeze(-1)

    def _shared_step(self, batch: ClickBatch, stage: str) -> Tensor:
        logits = self(batch.dense, batch.sparse)
        labels = batch.labels
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        metrics = getattr(self, f"{stage}_metrics")
        probs = logits.detach().sigmoid()
        metrics["auc"].update(probs, labels.long())
        metrics["acc"].update(probs, labels.long())
        metrics["ne"].update(logits.detach(), labels)
        training = stage == "train"
        size = batch.batch_size
        self.log(f"{stage}/loss", loss, on_step=training, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=not training)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, prog_bar=name == "auc", batch_size=size)
        return loss

    def training_step(self, batch: ClickBatch, batch_idx: int) -> Tensor:
        """BCE-with-logits on one batch; logs ``train/loss`` (step and epoch) and epoch AUC/acc/NE."""
        return self._shared_step(batch, "train")

    def validation_step(self, batch: ClickBatch, batch_idx: int) -> Tensor:
        """Logs ``val/loss``, ``val/auc``, ``val/acc`` and ``val/ne`` (epoch values)."""
        return self._shared_step(batch, "val")

    def test_step(self, batch: ClickBatch, batch_idx: int) -> Tensor:
        """Logs ``test/loss``, ``test/auc``, ``test/acc`` and ``test/ne`` (epoch values)."""
        return self._shared_step(batch, "test")

    def predict_step(self, batch: ClickBatch, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Click probabilities ``(batch,)``; the labels are not used."""
        return self(batch.dense, batch.sparse).sigmoid()

    def configure_optimizers(self) -> Any:
        """The optimizer on the cores/gates/other groups (built now, after any tensorize) and the optional scheduler."""
        return configure_comera_optimizers(
            self, self.optimizer, self.scheduler, self.param_group_settings, self.hparams.scheduler_interval
        )
