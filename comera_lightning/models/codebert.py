"""A CodeBERT-like (RoBERTa-style) masked language model for code pre-training (docs/METHOD.md §3).

The backbone is the shared post-LN encoder of :mod:`comera_lightning.models.encoder` (learned
positions, a single token type); the LM head is ``dense → GELU → LayerNorm → decoder`` with the
decoder weight tied to the word embedding while that embedding is a dense ``nn.Embedding``.

Tying and tensorizing. The tie is one shared ``nn.Parameter`` (``lm_head.decoder.weight is
backbone.embeddings.word_embeddings.weight``), so ``tensorize`` sees it and skips both modules.
To train the word embedding in tensor-train form, either build the model with
``tie_word_embeddings=False`` (the usual choice in the YAML configs) or call
:meth:`MaskedLanguageModel.untie_word_embeddings` before ``tensorize``; the decoder then keeps
its own dense weight. The decoder bias is always its own parameter.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from comera_lightning.models.encoder import EncoderConfig, TransformerEncoderModel, init_bert_weights
from comera_lightning.models.optim_setup import (
    ParamGroupSettings,
    check_scheduler_interval,
    configure_comera_optimizers,
    paper_adamw,
)

__all__ = [
    "MaskedLanguageModel",
    "MaskedLMHead",
    "MaskedTokenLoss",
    "MaskedTokenPerplexity",
    "warmup_schedule_factor",
]

IGNORE_INDEX = -100
STAGES = ("train", "val", "test")


class MaskedTokenLoss(Metric):
    """Mean loss per predicted token over every batch seen: ``sum of token losses / number of tokens``."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # float64 sums keep the epoch mean exact to well below logging precision.
        self.add_state("loss_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, loss_sum: Tensor, num_tokens: Tensor | int) -> None:
        """Add a batch: the sum of its token losses and how many tokens it predicted."""
        self.loss_sum += loss_sum.detach().sum().to(self.loss_sum.dtype)
        self.num_tokens += torch.as_tensor(num_tokens, device=self.num_tokens.device).sum().long()

    def compute(self) -> Tensor:
        """The mean token loss (NaN before any token was seen)."""
        return (self.loss_sum / self.num_tokens).float()


class MaskedTokenPerplexity(MaskedTokenLoss):
    """Perplexity ``exp(mean token loss)`` over every token seen (not a mean of batch perplexities)."""

    def compute(self) -> Tensor:
        """``exp`` of the mean token loss."""
        return torch.exp(self.loss_sum / self.num_tokens).float()


class MaskedLMHead(nn.Module):
    """RoBERTa LM head: ``dense (d→d) → GELU → LayerNorm → decoder (d→vocab, own bias)``."""

    def __init__(self, d_model: int, vocab_size: int, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.decoder = nn.Linear(d_model, vocab_size)

    def forward(self, hidden: Tensor) -> Tensor:
        """Vocabulary logits ``(..., vocab)`` from hidden states ``(..., d_model)``."""
        return self.decoder(self.norm(F.gelu(self.dense(hidden))))


def warmup_schedule_factor(step: int, warmup_steps: int, total_steps: int | None) -> float:
    """LR multiplier: linear warm-up over ``warmup_steps``, then constant (``total_steps=None``) or linear decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps is None:
        return 1.0
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def _check_schedule(scheduler: Any, interval: str, warmup_steps: int, lr_decay: str, total_steps: int | None) -> None:
    """Reject a learning-rate schedule set up two ways or with values out of range."""
    check_scheduler_interval(interval)
    if lr_decay not in ("constant", "linear"):
        raise ValueError(f"lr_decay must be 'constant' or 'linear', got {lr_decay!r}.")
    if not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}.")
    if total_steps is not None and (not isinstance(total_steps, int) or total_steps <= warmup_steps):
        raise ValueError(f"total_steps must be None or an int > warmup_steps={warmup_steps}, got {total_steps!r}.")
    if scheduler is not None and (warmup_steps > 0 or lr_decay != "constant"):
        raise ValueError(
            "pass either scheduler= or the built-in schedule (warmup_steps / lr_decay), not both; "
            f"got scheduler={scheduler!r}, warmup_steps={warmup_steps}, lr_decay={lr_decay!r}."
        )


class MaskedLanguageModel(LightningModule):
    """CodeBERT-like masked-LM pre-training: post-LN encoder, RoBERTa LM head with tied word embeddings.

    The batch is a dict with ``input_ids`` and ``attention_mask`` (``(batch, seq)``) and ``labels``
    (the original token at positions to predict, ``-100`` elsewhere), as made by
    :class:`~comera_lightning.data.code.datamodule.CodeCorpusDataModule`. The loss is the cross-entropy
    averaged over the predicted tokens. Logged: ``{train,val,test}/loss``, ``/acc`` (masked-token
    accuracy) and ``/ppl`` (``exp`` of the mean token loss); training values per step, validation
    and test values exact over the epoch.

    ``optimizer`` takes the cores/other groups of :func:`comera_param_groups` (``lr_cores``, ``lr_other``,
    ``weight_decay``), built in ``configure_optimizers``, i.e. after ``tensorize``; the rank gates are
    ``ComeraCallback``'s (its ``gate_lr``).
    Learning-rate schedule: pass any ``scheduler`` callable, or use the built-in one with
    ``warmup_steps`` and ``lr_decay="linear"`` (decay to 0 at ``total_steps``, by default the
    trainer's estimated number of steps); the defaults use a constant rate.

    ``head_on_masked_only`` runs the LM head on the predicted positions only (about 15% of the
    tokens, so much less work for a large vocabulary); set it to ``False`` for static shapes
    (CUDA-graph capture), which gives the same loss.
    """

    def __init__(
        self,
        vocab_size: int = 8192,
        d_model: int = 256,
        num_layers: int = 4,
        num_heads: int = 4,
        d_ff: int = 1024,
        dropout: float = 0.1,
        max_positions: int = 512,
        type_vocab_size: int = 1,
        pad_token_id: int = 1,
        tie_word_embeddings: bool = True,
        head_on_masked_only: bool = True,
        lr_cores: float = 1e-4,
        lr_other: float = 5e-4,
        weight_decay: float = 0.0,
        optimizer: OptimizerCallable = paper_adamw,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["step", "epoch"] = "step",
        warmup_steps: int = 0,
        lr_decay: Literal["constant", "linear"] = "constant",
        total_steps: int | None = None,
    ) -> None:
        super().__init__()
        _check_schedule(scheduler, scheduler_interval, warmup_steps, lr_decay, total_steps)
        # Callables stay out of the checkpoint: torch.load(weights_only=True) refuses pickled functions.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        config = EncoderConfig(
            vocab_size=vocab_size, d_model=d_model, num_layers=num_layers, num_heads=num_heads, d_ff=d_ff, dropout=dropout,
            max_positions=max_positions, type_vocab_size=type_vocab_size, pad_token_id=pad_token_id,
        )
        self.backbone = TransformerEncoderModel(config)
        self.lm_head = MaskedLMHead(d_model, vocab_size, config.layer_norm_eps)
        self.lm_head.apply(init_bert_weights)
        if tie_word_embeddings:
            # After the head's init, so the shared weight keeps the embedding's values (zero pad row).
            self.lm_head.decoder.weight = self.backbone.embeddings.word_embeddings.weight

        self.optimizer = optimizer
        self.param_group_settings = ParamGroupSettings(lr_cores, lr_other, weight_decay)
        self.scheduler = scheduler
        for stage in STAGES:
            # validate_args=False: the argument checks cost a device sync per step.
            acc = MulticlassAccuracy(vocab_size, average="micro", ignore_index=IGNORE_INDEX, validate_args=False)
            setattr(self, f"{stage}_acc", acc)
            setattr(self, f"{stage}_token_loss", MaskedTokenLoss())
            setattr(self, f"{stage}_ppl", MaskedTokenPerplexity())

    # ------------------------------------------------------------------ tying
    @property
    def word_embeddings_tied(self) -> bool:
        """Whether the decoder weight is (the same Parameter as) the word-embedding weight now."""
        weight = getattr(self.backbone.embeddings.word_embeddings, "weight", None)
        return weight is not None and self.lm_head.decoder.weight is weight

    def untie_word_embeddings(self) -> None:
        """Give the decoder its own copy of the word-embedding weight (call before ``tensorize`` and the optimizer)."""
        if self.word_embeddings_tied:
            weight = self.lm_head.decoder.weight
            self.lm_head.decoder.weight = nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)
        self.hparams.tie_word_embeddings = False

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the tie as it is now, so an untied or tensorized model reloads untied."""
        hparams = checkpoint.get("hyper_parameters")
        if hparams is not None and "tie_word_embeddings" in hparams:
            hparams["tie_word_embeddings"] = self.word_embeddings_tied

    # ------------------------------------------------------------------ forward and loss
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Vocabulary logits ``(batch, seq, vocab)`` at every position."""
        return self.lm_head(self.backbone(input_ids, attention_mask, token_type_ids))

    def masked_lm_loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Return ``(sum of token losses, number of predicted tokens, logits, labels)`` of a batch.

        ``logits``/``labels`` are those of the predicted positions only when ``head_on_masked_only``,
        else of every position (labels ``-100`` where nothing is predicted).
        """
        hidden = self.backbone(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
        labels = batch["labels"]
        if self.hparams.head_on_masked_only:
            selected = labels != IGNORE_INDEX
            hidden, labels = hidden[selected], labels[selected]
        else:
            hidden, labels = hidden.flatten(0, -2), labels.flatten()
        logits = self.lm_head(hidden)
        loss_sum = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
        num_tokens = (labels != IGNORE_INDEX).sum()
        return loss_sum, num_tokens, logits, labels

    def _shared_step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        loss_sum, num_tokens, logits, labels = self.masked_lm_loss(batch)
        loss = loss_sum / num_tokens.clamp_min(1)
        token_loss: MaskedTokenLoss = getattr(self, f"{stage}_token_loss")
        ppl: MaskedTokenPerplexity = getattr(self, f"{stage}_ppl")
        acc: MulticlassAccuracy = getattr(self, f"{stage}_acc")
        token_loss(loss_sum, num_tokens)
        ppl(loss_sum, num_tokens)
        acc(logits.detach().argmax(dim=-1), labels)
        on_step = stage == "train"
        kwargs = {"on_step": on_step, "on_epoch": not on_step, "batch_size": batch["input_ids"].shape[0]}
        self.log(f"{stage}/loss", token_loss, prog_bar=True, **kwargs)
        self.log(f"{stage}/acc", acc, prog_bar=True, **kwargs)
        self.log(f"{stage}/ppl", ppl, **kwargs)
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Mean masked-token cross-entropy of one batch; logs ``train/loss``, ``train/acc``, ``train/ppl``."""
        return self._shared_step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Logs ``val/loss``, ``val/acc``, ``val/ppl`` (exact per token over the epoch)."""
        return self._shared_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """Logs ``test/loss``, ``test/acc``, ``test/ppl`` (exact per token over the epoch)."""
        return self._shared_step(batch, "test")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Most likely token id at every position ``(batch, seq)``."""
        return self(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids")).argmax(dim=-1)

    # ------------------------------------------------------------------ set-up and optimizer
    def setup(self, stage: str) -> None:
        """Check that the data module's vocabulary fits the model's embedding table."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        data_vocab = getattr(datamodule, "vocab_size", None)
        if isinstance(data_vocab, int) and data_vocab > self.hparams.vocab_size:
            raise ValueError(
                f"the data's tokenizer has {data_vocab} tokens but the model's vocab_size is "
                f"{self.hparams.vocab_size}; set model vocab_size >= {data_vocab}."
            )

    def configure_optimizers(self) -> Any:
        """The optimizer on the cores/gates/other groups (built now, after any tensorize) and the optional schedule."""
        hp = self.hparams
        if self.scheduler is not None or (hp.warmup_steps == 0 and hp.lr_decay == "constant"):
            return configure_comera_optimizers(
                self, self.optimizer, self.scheduler, self.param_group_settings, self.hparams.scheduler_interval
            )
        total = None
        if hp.lr_decay == "linear":
            total = hp.total_steps if hp.total_steps is not None else self._estimated_total_steps()
        factor = functools.partial(warmup_schedule_factor, warmup_steps=hp.warmup_steps, total_steps=total)
        warmup = functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=factor)
        return configure_comera_optimizers(self, self.optimizer, warmup, self.param_group_settings, "step")

    def _estimated_total_steps(self) -> int:
        steps = self.trainer.estimated_stepping_batches
        if not (isinstance(steps, (int, float)) and 0 < steps < float("inf")):
            raise ValueError(
                f"lr_decay='linear' needs a finite number of steps, but the trainer estimates {steps!r}; "
                "set trainer max_steps or max_epochs, or the model's total_steps."
            )
        total = int(steps)
        if total <= self.hparams.warmup_steps:
            rank_zero_warn(f"warmup_steps={self.hparams.warmup_steps} >= the {total} training steps; the decay never starts.")
        return total
