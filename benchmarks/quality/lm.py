"""The race's LightningModule (what a user writes for causal-LM pre-training) and its measuring callback.

Peak memory is the **tensor peak of one training step** (CPU tensors, ``benchmarks.tensor_memory``):
the bytes of parameters, gradients, optimizer state and batch alive when the step starts, plus the
highest running sum of what the step (forward, loss, backward, optimizer step) allocates, read with
``torch.profiler``; on a GPU, the CUDA allocator's peak during the step (``cuda_peak``). It is taken on
the second step (``measure_step``), the first with the optimizer's state in place; CoMERA's later steps,
after pruning, only get smaller. Process RSS is not used: the systems of a race share one process, so the
interpreter, libraries and the allocator's cache would blur the differences.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import lightning as L
import torch

from benchmarks.quality.models import ModelSpec, block_linears, build_lm, low_rank_, parameters, svd_factors_
from benchmarks.tensor_memory import cuda_peak, optimizer_state_tensors, tensor_peak

#: GaLore's defaults here (``update_proj_gap``: about once per epoch unless set); rank: width / 4.
GALORE_DEFAULTS = {"scale": 0.25, "projection_type": "std"}


def warmup_cosine(optimizer: torch.optim.Optimizer, total: int, warmup: float, min_lr: float) -> dict[str, Any]:
    """``optimizer`` with a per-step schedule: linear warm-up over ``warmup`` of ``total`` steps, then cosine to ``min_lr`` × the peak."""
    ramp = max(1, int(warmup * total))

    def factor(step: int) -> float:
        if step < ramp:
            return (step + 1) / ramp
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - ramp) / max(1, total - ramp))))
        return min_lr + (1 - min_lr) * cosine

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class CausalLM(L.LightningModule):
    """Build the model in ``configure_model``, one AdamW (or GaLore), linear warm-up then cosine to ``min_lr`` × the peak.

    ``low_rank``: ``(layer names, parameter budget)`` to replace those layers by a plain ``U·V``
    (the rank is chosen to fit the budget); ``start_from``: the model's trained weights; ``svd_ranks``: layers
    replaced by their truncated SVD as plain factors of these ranks; ``transform``: a function applied to the model then; ``galore``: GaLore options (``rank``, ``update_proj_gap``, ...)
    for the 2-D weights of the blocks' linear maps.
    """

    def __init__(self, spec: ModelSpec, vocab_size: int, block_size: int, lr: float = 1e-3, weight_decay: float = 0.0,
                 warmup: float = 0.05, min_lr: float = 0.0, low_rank: tuple[list[str], int] | None = None,
                 galore: dict[str, Any] | None = None, measure_step: int = 1, start_from: dict[str, Any] | None = None,
                 svd_ranks: dict[str, int] | None = None, transform: Any = None) -> None:
        super().__init__()
        self.spec, self.vocab_size, self.block_size = spec, vocab_size, block_size
        self.lr, self.weight_decay, self.warmup, self.min_lr = lr, weight_decay, warmup, min_lr
        self.low_rank_layers, self.galore = low_rank, galore
        self.start_from, self.svd_ranks, self.transform = start_from, svd_ranks, transform
        self.measure_step = measure_step
        self.model: torch.nn.Module | None = None
        self.rank: int | None = None  # the low-rank baseline's rank
        self.memory: dict[str, int] = {}
        self._batch: Any = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = build_lm(self.spec, self.vocab_size, self.block_size)
        if self.start_from is not None:  # a trained model to compress (benchmarks/quality/compress.py)
            self.model.load_state_dict(self.start_from)
        if self.svd_ranks is not None:
            svd_factors_(self.model, self.svd_ranks)
        if self.transform is not None:  # a baseline's own compression of the trained model (benchmarks/quality/baselines.py)
            self.transform(self.model)
        if self.low_rank_layers is not None:
            names, budget = self.low_rank_layers
            self.rank = low_rank_(self.model, names, budget)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.model(**batch).loss, batch_size=batch["input_ids"].shape[0])

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._batch = batch if self.trainer.global_step == self.measure_step else None

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """The usual step; on ``measure_step`` under the memory profiler (``self.memory``; on CUDA the allocator's peak)."""
        step = functools.partial(optimizer.step, closure=optimizer_closure)
        if self._batch is None:
            step()
            return
        if self.device.type == "cuda":
            self.memory = cuda_peak(step, self.device)
        else:
            params = list(self.parameters())
            live = [*params, *(p.grad for p in params if p.grad is not None),
                    *optimizer_state_tensors(getattr(optimizer, "optimizer", optimizer)), *self._batch.values()]
            self.memory = tensor_peak(step, live)
        self._batch = None

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self._galore() if self.galore is not None else torch.optim.AdamW(
            self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        return warmup_cosine(optimizer, self.trainer.estimated_stepping_batches, self.warmup, self.min_lr)

    def _galore(self) -> torch.optim.Optimizer:
        """GaLore on the blocks' 2-D linear weights; every other parameter plain AdamW in the same optimizer."""
        from pytorch_optimizer import GaLore

        names = set(block_linears(self.model))
        projected = [p for n, p in self.model.named_parameters() if p.dim() == 2 and n.rsplit(".", 1)[0] in names]
        ids = {id(p) for p in projected}
        rest = [p for p in self.parameters() if id(p) not in ids]
        options = {**GALORE_DEFAULTS, "rank": max(8, self.spec.width // 4),
                   "update_proj_gap": max(10, self.trainer.estimated_stepping_batches // 8), **self.galore}
        return GaLore([{"params": rest}, {"params": projected, **options}], lr=self.lr, weight_decay=self.weight_decay)


class Curve(L.Callback):
    """Validation loss after every validation, with the training seconds so far.

    Training seconds: wall-clock from the start of training, validation excluded; everything else
    counts (data loading, every callback's hooks, CoMERA's pruning). The step measured under the
    profiler (``CausalLM.measure_step``) is counted as long as the step after it. On a GPU the queued steps are
    waited for before each validation and at the end, so they count as training.
    """

    def __init__(self, measured_step: int = 1) -> None:
        self.points: list[dict[str, float]] = []
        self.measured_step = measured_step
        self._begun = self._step_began = self._validation_began = 0.0
        self._excluded = 0.0  # validation, and the profiler's extra time
        self._measured = 0.0
        self._step = -1  # the optimizer step whose batches are running
        self.total_seconds = 0.0  # training seconds of the whole fit, set when training ends

    @property
    def train_seconds(self) -> float:
        return time.perf_counter() - self._begun - self._excluded

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._begun, self._excluded = time.perf_counter(), 0.0

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _finish_queued(pl_module)
        self.total_seconds = self.train_seconds

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self._step:  # the first of a step's batches (several when gradients accumulate)
            self._step, self._step_began = trainer.global_step, time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self._step:  # still accumulating
            return
        seconds = time.perf_counter() - self._step_began
        if trainer.global_step - 1 == self.measured_step:
            self._measured = seconds
        elif trainer.global_step - 2 == self.measured_step:
            self._excluded += max(0.0, self._measured - seconds)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _finish_queued(pl_module)  # the training steps still queued on a GPU count as training
        self._validation_began = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._excluded += time.perf_counter() - self._validation_began
        if not trainer.sanity_checking:
            self.points.append({"step": trainer.global_step, "seconds": round(self.train_seconds, 2),
                                "val_loss": round(float(trainer.callback_metrics["val/loss"]), 4),
                                "parameters": parameters(pl_module)})


def _finish_queued(module: L.LightningModule) -> None:
    """Wait for the work queued on the module's GPU (nothing to wait for on a CPU)."""
    if module.device.type == "cuda":
        torch.cuda.synchronize(module.device)
